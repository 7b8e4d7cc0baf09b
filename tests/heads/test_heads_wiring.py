"""The head methods (medusa, eagle, mtp) everywhere the other methods are: a missing head, a head of another
kind or one trained for another target is refused by `generate` (and the serving engine) before anything
compiles; specs name the head (a bundled one by its name) and parse back; loopspec-bench's table and the sweep's
rows take them by spec (with tau, tokens per verify pass). No decoding here: the slow tests of their output
are in tests/serving/test_heads_serving.py and tests/parallel/test_methods_mesh.py.
"""

import dataclasses

import pytest

import head_helpers as H
import helpers
import loopspec_jax as lj
from loopspec_jax import methods
from loopspec_configs.sweeps import bundled as sweep_configs
from loopspec_jax.decoding.stats import DecodeStats
from loopspec_jax.decoding.tree import head_method
from loopspec_experiments import bench
from loopspec_jax.experiment import sweep_grid
from loopspec_jax.experiment import sweep_report
from loopspec_jax.experiment import sweep_stats
from loopspec_jax.heads import artefact
from loopspec_jax.serving import engine as E

FIXTURE = ("huginn:tiny", 0.05)
OTHER_KIND = {"medusa": "eagle", "eagle": "mtp", "mtp": "medusa"}


def _args(kind, **kw):
  return dict(prompts=[[1, 2, 3]], max_new_tokens=4, method=kind, **kw)


@pytest.mark.parametrize("kind", H.KINDS)
def test_missing_or_foreign_heads_are_refused_before_compiling(kind):
  """No head, a head of another kind, a head for another family, hidden size or tokenizer: a ValueError naming
  the mismatch, and no program is reached."""
  model = helpers.tiny_model(*FIXTURE)
  never = H.never_called(kind)
  env = H.ENVELOPES[kind]
  helpers.assert_rejected_before_compiling(model, _args(kind, **env), "needs heads=", never)
  other = H.random_heads(OTHER_KIND[kind], model)
  helpers.assert_rejected_before_compiling(model, _args(kind, heads=other, **env), f"needs an '{kind}' head", never)
  heads = H.random_heads(kind, model)
  family = helpers.tiny_model("raven_llama:tiny", 0.05)
  helpers.assert_rejected_before_compiling(family, _args(kind, heads=heads, **env), r"another target \(family", never)
  wider = helpers.tiny_model("huginn:tiny", 0.05, hidden_size=64)
  helpers.assert_rejected_before_compiling(wider, _args(kind, heads=heads, **env), "hidden_size", never)
  other_tok = dataclasses.replace(heads, target=dict(heads.target, tokenizer_sha256="ab12"))
  match = r"another target \(tokenizer_sha256: head 'ab12', model None"
  helpers.assert_rejected_before_compiling(model, _args(kind, heads=other_tok, **env), match, never)
  with pytest.raises(FileNotFoundError, match="no head directory or bundled head named 'no-such-head'"):
    lj.generate(model, **_args(kind, heads="no-such-head"))


@pytest.mark.parametrize("kind", H.KINDS)
def test_engine_refuses_foreign_heads_before_compiling(kind):
  family = helpers.tiny_model("raven_llama:tiny", 0.05)
  heads = H.random_heads(kind, helpers.tiny_model(*FIXTURE))
  with pytest.raises(ValueError, match=r"another target \(family"):
    E.Engine(family, E.EngineConfig(method=methods.build(kind, heads=heads, **H.ENVELOPES[kind])))
  with pytest.raises(ValueError, match="needs heads="):
    E.Engine(family, E.EngineConfig(method=kind))


@pytest.mark.parametrize("kind", H.KINDS)
def test_spec_names_the_head_and_parses_back(tmp_path, kind):
  """A head saved to a directory: the spec names the directory and parses back to the same method (the head
  loaded from it); the label leaves the head out."""
  model = helpers.tiny_model(*FIXTURE)
  path = str(tmp_path / "h")
  artefact.save(path, H.random_heads(kind, model))
  m = methods.build(kind, heads=path, **H.ENVELOPES[kind])
  assert m.spec == f"{kind}:heads={path}," + ",".join(f"{k}={v}" for k, v in m.envelope.items())
  back = methods.parse(m.spec)
  assert back == m and back.heads is m.heads  # loaded once per process
  assert m.label == kind + "(" + ",".join(f"{k}={v}" for k, v in H.ENVELOPES[kind].items()) + ")"
  assert head_method.heads_name(m.heads) == path


@pytest.mark.parametrize("name", artefact.bundled_heads())
def test_bundled_heads_are_named_by_name(name):
  heads = lj.load_heads(name)
  m = methods.build(heads.kind, heads=name)
  assert m.spec == f"{heads.kind}:heads={name}" and methods.parse(m.spec).heads is m.heads


# ---------------------------------------------------------------------------------------------------
# loopspec-bench rows, the sweep's rows (no decoding: their methods and tables)
# ---------------------------------------------------------------------------------------------------
def _head_stats(name="medusa", tokens=24, rounds=8, accepted=16, nodes=128) -> DecodeStats:
  settings = dict(recurrence=32, tree_nodes=16, branch=4, draft_layer_calls=1.5, verify_layer_calls=600)
  per_request = {"tokens": [tokens], "rounds": [rounds], "accepted": [accepted], "nodes": [nodes]}
  per_request.update(first=[accepted], restart=[tokens - accepted])
  return DecodeStats(name, settings, per_request, {"iterations": rounds, "decode_seconds": 0.5})


def test_bench_table_has_head_rows_with_tau():
  agg = _head_stats().summary()
  assert agg["tau"] == agg["tokens_per_pass"] == 3.0 and 0 < agg["draft_cost_share"] < 0.01, agg
  row = dict(agg, model="tiny", task="gsm8k", sampling="greedy", method="medusa(tree_nodes=16,branch=4)")
  row.update(decode_seconds_median=0.5, tokens_per_second_median=48.0, wall_clock_ratio_median=1.2)
  row.update(prompt_ratio_median=1.2, prompt_ratio_min=1.1, identical_to_ar=True)
  assert "| medusa(tree_nodes=16,branch=4) | 3.00 | 0.12 |" in bench.baselines_table([row])


def test_bench_rows_of_one_label_go_by_their_specs(tmp_path):
  """Two EAGLE heads with one envelope share a label: their rows are keyed by their specs instead."""
  model = helpers.tiny_model(*FIXTURE)
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  for path, seed in ((a, 1), (b, 2)):
    artefact.save(path, H.random_heads("eagle", model, seed))
  specs = ["ar", f"eagle:heads={a},gamma=3", f"eagle:heads={b},gamma=3"]
  assert bench.row_labels(methods.parse_list(specs)) == ["ar", specs[1], specs[2]]
  assert bench.row_labels(methods.parse_list(specs[:2])) == ["ar", "eagle(gamma=3)"]


def test_sweep_takes_head_rows_by_spec():
  cfg = sweep_configs.get_config("tiny_raven_baselines")
  specs = sweep_grid.method_specs(cfg, 32)
  heads = [m for m in specs if isinstance(m, head_method.HeadMethod)]
  assert [m.name for m in heads] == ["medusa", "eagle"], specs
  assert sweep_grid.row_label(heads[0]) == "medusa(heads=tiny-raven-medusa,tree_nodes=16,branch=4)"
  assert sweep_grid.row_label(heads[1]) == "eagle(heads=tiny-raven-eagle,gamma=6,branch=4,tree_nodes=32)"
  ar_stats = DecodeStats("ar", {"recurrence": 32}, {"tokens": [24], "restart": [24]}, {"iterations": 24})
  base = dict(model="tiny-raven", task="gsm8k", sampling="greedy")
  ar = sweep_stats.make_row(base, methods.AR(), "ar", ar_stats.summary(), [1.0], 32, None, [[1, 2]], True)
  m = heads[0]
  label = sweep_grid.row_label(m)
  row = sweep_stats.make_row(base, m, label, _head_stats().summary(), [0.5], 32, ar, [[1, 2]], True)
  assert row["tau"] == row["tokens_per_round"] == 3.0 and row["nodes_per_pass"] == 16.0, row
  lines = sweep_report.baselines_markdown([ar, row])
  assert any(l.startswith(f"| {label} | 3.00 |") for l in lines), lines


def test_head_methods_are_frozen_values():
  model = helpers.tiny_model(*FIXTURE)
  for kind in H.KINDS:
    m = methods.build(kind, heads=H.random_heads(kind, model), **H.ENVELOPES[kind])
    with pytest.raises(dataclasses.FrozenInstanceError):
      m.heads = None


# ---------------------------------------------------------------------------------------------------
# The cost report's draft rows (loopspec-cost-report --config=cost/default.py:heads)
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow  # ~13 s: cost-report tooling
def test_cost_report_heads_preset_and_draft_rows():
  """The `:heads` preset runs the draft programs alone; at a tiny size every row has flops and bytes, a d1=2
  readout reads more than d1=1's, EAGLE's level reads its own KV cache, Medusa's and MTP's none."""
  from loopspec_configs.cost import default as cost_configs
  from loopspec_configs.models import model_config
  from loopspec_experiments import cost_heads

  c = cost_configs.get_config("heads")
  assert c.draft_costs and c.models == "huginn_0125_heads" and tuple(c.contexts) == (2048,)
  cfg = model_config("huginn:tiny").replace(dtype="bfloat16", max_len=128)
  rows = {r["label"]: r for r in cost_heads.draft_rows(cfg, (1, 2), 3, 1, 128)}
  assert list(rows) == [
      "readout d1=1",
      "readout d1=2",
      "medusa (3 heads, one round)",
      "eagle (one level, one row)",
      "mtp (one level, one row)",
  ]
  assert all(r["flops"] > 0 and r["total_bytes"] > 0 for r in rows.values())
  assert rows["readout d1=2"]["bytes"]["kv"] > rows["readout d1=1"]["bytes"]["kv"] > 0
  assert rows["eagle (one level, one row)"]["bytes"]["kv"] > 0 == rows["mtp (one level, one row)"]["bytes"]["kv"]
  assert "| x readout d1=1 bytes |" in cost_heads.format_rows(list(rows.values()), "tiny", 128).splitlines()[0]
