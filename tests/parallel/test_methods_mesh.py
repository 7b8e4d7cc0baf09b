"""Every registered method on a (2, 4) mesh of 8 simulated CPU devices: its greedy tokens equal its one-device
tokens (and AR's), one test per method of the registry and per decoder variant with entry points of its own
(draft and lookup trees, chain with a branch); its sampled tokens (T = 1, top-k 20) equal its one-device tokens
of the same seed.

Each decoder declares how its entry points run sharded where it defines them (`@entry.declare(...)`,
`parallel/entry.py`); the default suite checks, on abstract states (no devices, seconds), that every case's
initial state and decode loop declare one and that every leaf of its state has declared logical axes (a
drafter's or head's own state per request). The 8 devices need XLA_FLAGS before jax starts, so the decodes run
in subprocesses, a pair at once (one device and the (2, 4) mesh, the same compiler flags;
`helpers.mesh_reports`), each decoding every case; a case that fails in a worker fails its own test. They run
with `-m slow` (each pair: 75-125 s of CPU per worker on the 2-core host, the compiles of 15 decoders). The
mesh worker also records the shardings of each decode loop's result (requests over 'data', KV heads over
'model') and the traces and compiles of every sharded program (one each per configuration). The target is
huginn:tiny (4 heads, R = 8) with random weights; the drafter of 'draft' the target's own weights at R = 1; the
heads of medusa / eagle / mtp / dflash random (tests/head_helpers.py). tests/parallel/test_baselines_mesh.py adds the
(1, 8) mesh, a drafter whose heads divide no mesh axis, and gamma="auto"; tests/parallel/test_sharding.py the four meshes,
both families, the parameter layouts and the memory plan for AR, chain and LoopSpec.
"""

import dataclasses
import time
import traceback

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import pytest

import head_helpers as H
import helpers  # tests/ is also the worker script's directory
from loopspec_jax import api
from loopspec_jax import methods
from loopspec_jax import planner
from loopspec_jax.analysis import accelerators
from loopspec_jax.analysis import hardware
from loopspec_configs.models import model_config
from loopspec_jax.decoding import common
from loopspec_jax.models import looped
from loopspec_jax.parallel import entry
from loopspec_jax.parallel import rules
from loopspec_jax.parallel import sharding

XLA_FLAGS = (
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true"
)
WORKER_TIMEOUT_S = 900
N_NEW = 6
# worker name -> its mesh shape (None: one device); the greedy pair and the sampled pair each run at once
GREEDY, SAMPLED = {"one": None, "a": (2, 4)}, {"one_sampled": None, "a_sampled": (2, 4)}
SAMPLING = {"temperature": 1.0, "top_k": 20, "seed": 3}
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43, 44]]  # 3 requests: padded to 4 on 'data'
CONTRACTION = 0.05
# case -> (registered method, its generate arguments: a small envelope); "draft_model" and "heads" are filled in
# by `_arguments`. One case per registered name, and the variants whose decoders have entry points of their own.
CASES = {
    "ar": ("ar", {}),
    "chain": ("chain", dict(d1=1, gamma=2)),
    "loopspec": ("loopspec", dict(d1=1, d2=3)),  # auto's pick (`_fixed_device`): its programs are reused
    "draft": ("draft", dict(gamma=2)),
    "lookup": ("lookup", dict(ngram=2, gamma=2)),
    "tree": ("tree", dict(d1=1, gamma=3, branch=2, tree_nodes=6)),
    "lookahead": ("lookahead", dict(window=3, ngram=3, guesses=3)),
    **{kind: (kind, dict(H.ENVELOPES[kind])) for kind in ("medusa", "eagle", "mtp", "dflash")},
    "auto": ("auto", dict(probe_tokens=0, measure=0, replan=0)),  # the planner's pick, by prediction alone
    "chain_tree": ("chain", dict(d1=1, gamma=3, branch=2, tree_nodes=6)),  # tree self-speculation
    "draft_tree": ("draft", dict(gamma=2, branch=2, tree_nodes=4)),
    "lookup_tree": ("lookup", dict(ngram=2, gamma=2, candidates=2)),
}


def _target():
  cfg = model_config("huginn:tiny")
  return api.LoopedModel(cfg, helpers.numpy_params(cfg, CONTRACTION, seed=0))


def _arguments(case: str, target) -> dict:
  """generate's method arguments of `case` (a drafter or heads where the method needs them)."""
  name, kw = CASES[case]
  if name == "draft":
    kw = dict(kw, draft_model=dataclasses.replace(target, config=target.config.replace(recurrence=1), source="r1"))
  if name in H.ENVELOPES:
    kw = dict(kw, heads=H.random_heads(name, target))
  return dict(kw, method=name)


def test_cases_cover_the_registry():
  assert {name for name, _ in CASES.values()} == set(methods.NAMES)


@pytest.mark.parametrize("case", [c for c in CASES if c != "auto"])
def test_entry_points_are_declared_and_their_states_covered(case):
  """The case's initial state and decode loop declare their entry points (a drafter's or a head's parameters
  as their last array argument); every leaf of the initial state has declared logical axes, all of them names
  of the rules (abstract values: nothing compiles)."""
  target = _target()
  cfg = target.config
  kw = _arguments(case, target)
  dec = methods.build_checked(kw.pop("method"), target, **kw).make_decoder(cfg, greedy=False, random_init=False)
  assert sharding.entry_point(dec.init).kinds[: len(entry.INIT.kinds)] == entry.INIT.kinds
  loop = sharding.entry_point(dec.loop)
  assert loop.kinds[: len(entry.LOOP.kinds)] == entry.LOOP.kinds
  extra = {"draft": ("draft_params",), "medusa": ("replicated",), "eagle": ("replicated",)}
  extra.update(mtp=("replicated",), dflash=("replicated",))
  assert loop.kinds[len(entry.LOOP.kinds) :] == extra.get(CASES[case][0], ())
  sp = jax.eval_shape(lambda: common.make_sampling_params(4, 1, 1.0, 0, 1.0, 0, None))
  prompt, lengths = jax.ShapeDtypeStruct((4, 8), jnp.int32), jax.ShapeDtypeStruct((4,), jnp.int32)
  prefill = lambda *a: common.prefill_state(
      *a,
      cfg=cfg,
      readout_depths=dec.readout_depths,
      total_len=32 + dec.extra_positions,
      random_init=False,
      cache_group=dec.cache_group,
  )
  cache, tokens = jax.eval_shape(prefill, looped.abstract_params(cfg), prompt, lengths, sp)
  st = jax.eval_shape(lambda *a: dec.init(*a, **dec.init_kw), cache, tokens, lengths, sp)
  axes = jax.tree_util.tree_leaves(rules.tree_axes((st, sp), "state"), is_leaf=lambda x: isinstance(x, P))
  assert len(axes) == len(jax.tree_util.tree_leaves((st, sp)))
  assert {n for a in axes for n in a if n is not None} <= {name for name, _ in rules.RULES}
  extra = rules.tree_axes(st, "state").extra if hasattr(st, "extra") else None
  extra = jax.tree_util.tree_leaves(extra, is_leaf=lambda x: isinstance(x, P))
  assert all("batch" in tuple(a) for a in extra), extra  # a drafter's or head's own state: per request


def test_an_undeclared_function_is_refused():
  with pytest.raises(KeyError, match="not a sharded decode entry point.*entry.declare"):
    sharding.entry(jax.jit(lambda x: x), sharding.make_mesh((1, 1), jax.devices()[:1]))


@pytest.mark.slow  # 76 s wall (25 s CPU) at load 13 on the 2-core host: five decoder compiles
def test_head_methods_on_a_target_with_padded_heads_equal_ar():
  """A target laid out for a model axis its heads do not divide (3 heads padded to 4, as on a (2, 4) mesh, here
  on one device): the heads keep the trained layout (their parameters are replicated, never padded), so EAGLE's
  head block and cache and MTP's block trace with the unpadded config and decode AR's tokens. They used to
  fail at compile (EAGLE: a reshape of 3 heads into 4; MTP: refused, its block shapes against the padded
  ones); checked on the (2, 4) mesh of 8 simulated devices by hand (`sharding.shard_params` placement)."""
  cfg = model_config("huginn:tiny", num_heads=3, num_kv_heads=3)
  model = api.LoopedModel(cfg, helpers.numpy_params(cfg, CONTRACTION, seed=0))
  to = sharding.padded_config(cfg, {"data": 2, "model": 4})
  assert to.num_heads == 4 and to.head_padding == 1
  padded = api.LoopedModel(to, sharding.pad_params(model.params, cfg, to))
  want = api.generate(model, PROMPTS[:2], max_new_tokens=4, method="ar").tokens
  for kind in ("eagle", "mtp"):
    got = api.generate(padded, PROMPTS[:2], max_new_tokens=4, **H.spec_kwargs(kind, model))
    assert got.tokens == want, kind


# ---------------------------------------------------------------------------------------------------
# Workers (subprocesses with 8 CPU devices): every case, greedy or sampled, on one device or the mesh
# ---------------------------------------------------------------------------------------------------
def _specs(tree) -> list:
  return [helpers.sharding_spec(s) for s in jax.tree_util.tree_leaves(tree)]


def _fixed_device(cfg, working_set):
  """The planner's device for 'auto' in the workers: v5e's public figures. On a CPU the planner times the host
  (`planner.hardware_for`), and two processes under load can pick different methods (their sampled tokens
  then differ); with one device model the pick is the same prediction in both."""
  del cfg, working_set
  return hardware.from_accelerator("tpu_v5e", accelerators.ACCELERATORS["tpu_v5e"])


def _worker(name: str, out_path: str):
  assert jax.device_count() == 8, jax.devices()
  planner.hardware_for = _fixed_device
  rec = helpers.record_sharded_calls()
  shape = {**GREEDY, **SAMPLED}[name]
  sampling = SAMPLING if name in SAMPLED else {}
  c0 = time.process_time()
  target = _target()
  mesh = None if shape is None else sharding.plan(sharding.make_mesh(shape))
  report = {"tokens": {}, "stats": {}, "timings": {}, "errors": {}, "states": {}}
  for case in CASES:
    t0, n_calls = time.perf_counter(), len(rec["calls"])
    try:
      args = dict(_arguments(case, target), **sampling)
      res = api.generate(target, PROMPTS, max_new_tokens=N_NEW, mesh=mesh, **args)
    except Exception:  # reported by the case's own test
      report["errors"][case] = traceback.format_exc(limit=-8)
      continue
    report["timings"][case] = round(time.perf_counter() - t0, 2)
    report["tokens"][case] = res.tokens
    report["stats"][case] = {k: res.stats.get(k) for k in ("method", "batch", "tokens_generated")}
    report["stats"][case]["picks"] = res.stats.get("plan", {}).get("picks")  # auto's
    loops = [c for c in rec["calls"][n_calls:] if c["name"].endswith(".decode_loop")]
    if loops:  # the decode loop's result: tokens [B, T], the target's KV cache [G, B, KV, T, D], a drafter's state
      out = loops[-1]["out"]
      extra = getattr(out, "extra", None)
      report["states"][case] = dict(
          tokens=helpers.sharding_spec(out.tokens),
          cache=helpers.sharding_spec(out.cache.core[0][0]),
          extra=_specs(extra),
      )
  helpers.write_worker_report(report, rec, c0, out_path, programs=shape is not None)


@pytest.fixture(scope="module")
def reports():
  """{mesh shape or None: the greedy worker's report}."""
  return helpers.mesh_reports(__file__, GREEDY, XLA_FLAGS, WORKER_TIMEOUT_S)


@pytest.fixture(scope="module")
def sampled_reports():
  """{mesh shape or None: the sampled worker's report} (`SAMPLING`, the same seed on both)."""
  return helpers.mesh_reports(__file__, SAMPLED, XLA_FLAGS, WORKER_TIMEOUT_S)


def _check_mesh_run(one: dict, got: dict, case: str) -> None:
  """No error on either; the mesh run's tokens equal one device's, every request got N_NEW tokens, and the
  decode loop's state lies as declared: requests over 'data' (tokens, cache, each leaf of a drafter's or
  head's `extra`), KV heads over 'model'."""
  for rep in (one, got):
    assert case not in rep["errors"], rep["errors"][case]
  assert got["stats"][case]["picks"] == one["stats"][case]["picks"]  # auto: the same method on both
  assert got["tokens"][case] == one["tokens"][case]
  assert got["stats"][case]["batch"] == len(PROMPTS)
  assert got["stats"][case]["tokens_generated"] == N_NEW * len(PROMPTS)
  st = got["states"][case]
  assert st["tokens"] == ["data", None] and st["cache"][1:3] == ["data", "model"], st
  assert all("data" in spec for spec in st["extra"]), st


@pytest.mark.slow  # two 8-device workers at once: 75 s / 90 s CPU (336 s wall at load 11, 2-core host)
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_on_a_2x4_mesh_equals_one_device(reports, case):
  _check_mesh_run(reports[None], reports[(2, 4)], case)
  assert reports[None]["tokens"][case] == reports[None]["tokens"]["ar"]  # and lossless


@pytest.mark.slow  # two more 8-device workers: 99 s / 124 s CPU (453 s wall at load 11)
@pytest.mark.parametrize("case", list(CASES))
def test_sampled_on_a_2x4_mesh_equals_one_device(sampled_reports, case):
  _check_mesh_run(sampled_reports[None], sampled_reports[(2, 4)], case)


@pytest.mark.slow
def test_the_batch_differs_and_each_configuration_compiles_once(reports, sampled_reports):
  one = reports[None]["tokens"]["ar"]
  assert len({tuple(t) for t in one}) > 1 and all(len(t) == N_NEW for t in one)
  assert sampled_reports[None]["tokens"]["ar"] != one  # really sampled
  for rep in (reports[(2, 4)], sampled_reports[(2, 4)]):
    traces, compiles, configs = rep["programs"]
    assert traces == compiles == configs, rep["programs"]


if __name__ == "__main__":
  helpers.worker_main(_worker)
