"""experiments/bench_trees.py: per-row model overrides ('spec@model'), the heads table's rows and lines.

The default suite checks the entry parser, the job plan (each model's AR reference), the target lines and the
presets without compiling anything. The runs are slow tests (compiling costs 40 s of CPU and more here): the
heads table's machinery (plan_jobs, run_group, report) on the fixture family huginn:tiny with randomly
initialised heads (MTP on a second target model; then every kind: Medusa, EAGLE final and fused), one prompt
and a few tokens, every row there and every greedy row equal to its own model's AR; and the real
`:heads_quick` preset on the bundled tiny-raven and its heads.
"""

from __future__ import annotations

import json

import jax
import ml_collections
import pytest

import helpers
from loopspec_configs.bench import trees as trees_config
from loopspec_experiments import bench_trees as bt
from loopspec_jax.heads import artefact
from loopspec_jax.heads import eagle as E
from loopspec_jax.heads import medusa as hm
from loopspec_jax.heads import mtp as hmtp

FIXTURE = ("huginn:tiny", 0.05)


def _cfg(methods, **kw):
  c = ml_collections.ConfigDict(
      dict(
          model="fix",
          max_new_tokens=6,
          repeats=1,
          seed=0,
          methods=methods,
          target={"gamma": 2, "share": 0.4},
          heads_target={"eagle_tau": 3.0},
      )
  )
  c.update(kw)
  return c


def _save_heads(tmp_path, model, other):
  """Random heads of each kind saved as artefacts (spec strings name them by directory)."""
  dirs = {}
  eagle = lambda f: artefact.Heads(
      E.KIND,
      E.init_params(E.head_config(model.config, f), jax.random.PRNGKey(1)),
      E.head_config(model.config, f),
      artefact.target_signature(model),
  )
  made = {
      "medusa": hm.make_heads(model, 2, jax.random.PRNGKey(1), scale=1.0),
      "final": eagle("final"),
      "fused": eagle("fused"),
      "mtp": hmtp.make_heads(other, hmtp.init_params(other.config, jax.random.PRNGKey(2)), 0.3),
  }
  for name, heads in made.items():
    dirs[name] = str(tmp_path / name)
    artefact.save(dirs[name], heads)
  return dirs


def test_split_entry():
  assert bt.split_entry("ar") == ("ar", None)
  assert bt.split_entry("mtp:heads=x,gamma=1 @ tiny-raven-mtp") == ("mtp:heads=x,gamma=1", "tiny-raven-mtp")
  with pytest.raises(ValueError, match="spec@model"):
    bt.split_entry("mtp@")


def test_plan_needs_an_ar_row_per_model():
  models = {"fix": object(), "other": object()}
  prompts = {"fix": [[1]], "other": [[1]]}
  with pytest.raises(ValueError, match="no 'ar@other' row"):
    bt.plan_jobs(["ar", "chain:d1=1,gamma=2@other"], models, prompts, "fix")
  with pytest.raises(ValueError, match="first method must be 'ar'"):
    bt.plan_jobs(["chain:d1=1,gamma=2", "ar"], models, prompts, "fix")
  jobs = bt.plan_jobs(["ar", "ar@other", "chain:d1=1,gamma=2@other"], models, prompts, "fix")
  assert [j["ref"] for j in jobs] == [0, 1, 1] and jobs[2]["model"] is models["other"]


def _fixture_rows(tmp_path, kinds):
  """The heads table's rows on the fixture: AR, chain, the head methods in `kinds` and MTP on a second model."""
  model, other = helpers.tiny_model(*FIXTURE), helpers.tiny_model(*FIXTURE, seed=1)
  d = _save_heads(tmp_path, model, other)
  specs = {
      "chain": "chain:d1=1,gamma=2",
      "medusa": f"medusa:heads={d['medusa']},tree_nodes=4,branch=2",
      "final": f"eagle:heads={d['final']},gamma=2,branch=2,tree_nodes=4",
      "fused": f"eagle:heads={d['fused']},gamma=2,branch=2,tree_nodes=4",
  }
  methods = ["ar"] + [specs[k] for k in kinds] + ["ar@other", f"mtp:heads={d['mtp']}@other"]
  cfg = _cfg(methods)
  prompts = {"fix": [list(helpers.PROMPTS[1])], "other": [list(helpers.PROMPTS[1])]}
  jobs = bt.plan_jobs(methods, {"fix": model, "other": other}, prompts, "fix")
  rows = [dict(task="t", sampling="greedy", **r) for r in bt.run_group(jobs, {}, cfg, lambda _: None)]
  assert [r["method"] for r in rows] == methods
  assert all(r["identical_to_ar"] for r in rows), [(r["method"], r["identical_to_ar"]) for r in rows]
  assert [r["model"] for r in rows] == ["fix"] * (1 + len(kinds)) + ["other"] * 2
  assert all(r["draft_cost_share"] > 0 for r in rows[1:-2] + rows[-1:])
  return rows, bt.report(rows, cfg)


@pytest.mark.slow  # 38 s of CPU (three programs compile) on the loaded 2-core host: over the default suite's 20 s
def test_heads_rows_on_the_fixture_equal_ar(tmp_path):
  """MTP on its own model (the 'spec@model' rows, with that model's AR), greedy = AR (each head kind's own
  = AR tests are in tests/test_<kind>.py)."""
  rows, text = _fixture_rows(tmp_path, [])
  assert rows[-1]["tau"] >= 1.0 and rows[-1]["speed_vs_ar_median"] > 0
  assert text.count("(tau - 1) / draft share") == 1 and "ar@model" in text


@pytest.mark.slow  # compiles seven programs: minutes on the loaded 2-core host
def test_every_head_row_on_the_fixture_equals_ar(tmp_path):
  rows, text = _fixture_rows(tmp_path, ["chain", "medusa", "final", "fused"])
  assert len(rows[3]["level_acceptance"]) == 2 and "k=2" in text
  assert text.count("target >= 3.0 and > Medusa's") == 2
  assert text.count("(tau - 1) / draft share") == 4


def test_heads_lines_efficiency_against_chain():
  row = lambda m, tau, share: dict(
      task="t", sampling="greedy", method=m, tau=tau, draft_cost_share=share, tau_release_scale=False
  )
  rows = [
      row("ar", 1.0, 0.0),
      row("chain:d1=2,gamma=6", 6.0, 0.5),
      row("medusa:heads=x", 2.0, 0.02),
      row("eagle:heads=y", 3.5, 0.01),
      row("mtp:heads=z@m", 1.1, 0.05),
  ]
  text = bt.heads_lines(rows, 3.0)
  assert "eagle:heads=y: tau 3.50; target >= 3.0 and > Medusa's 2.00: met" in text
  assert "medusa:heads=x: (tau - 1) / draft share = 50.0; beats chain:d1=2,gamma=6 (10.0)" in text
  assert "mtp:heads=z@m: (tau - 1) / draft share = 2.0; below chain" in text


def test_presets_parse():
  heads = trees_config.get_config("heads")
  assert heads.samplings == ["greedy"] and heads.heads_target.eagle_tau == 3.0
  names = {bt.split_entry(e)[0].partition(":")[0] for e in heads.methods}
  assert {"medusa", "eagle", "mtp", "chain", "tree", "loopspec", "draft", "lookup", "lookahead"} <= names
  assert trees_config.get_config("heads_quick").num_prompts == 1
  assert "drafts=distinct" in ";".join(trees_config.get_config("sampled").methods)
  with pytest.raises(ValueError, match="unknown preset"):
    trees_config.get_config("nope")


@pytest.mark.slow  # about 2.5 minutes on the loaded 2-core host (compiles every head method on tiny-raven)
def test_heads_quick_preset_on_tiny_raven(tmp_path):
  cfg = trees_config.get_config("heads_quick")
  cfg.out_dir = str(tmp_path)
  bt.run_bench(cfg)
  with open(tmp_path / "bench_trees.json") as f:
    rows = json.load(f)["rows"]
  assert [r["method"] for r in rows] == list(cfg.methods)
  assert all(r["identical_to_ar"] for r in rows)
  assert (tmp_path / "table.md").read_text().count("target >= 3.0") == 2
