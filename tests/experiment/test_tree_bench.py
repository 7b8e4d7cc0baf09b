"""loopspec_jax/experiment/tree_bench.py (bench_trees' machinery) without compiling: a run's figures, the
interleaved group with a fake `generate`, and the report (table, notes, target lines, per-level acceptance).
(tests/experiments/test_bench_trees.py plans jobs and runs the real thing on fixtures.)"""

import types

import ml_collections
import pytest

import loopspec_jax
from loopspec_jax.experiment import tree_bench


def test_row_figures_of_tree_and_loopspec_stats():
  tree = {"tokens_per_pass": 3.0, "tokens_generated": 12, "per_request": {"rounds": [2, 2], "accepted": [4, 4]}}
  f = tree_bench.row_figures(dict(tree, draft_cost_share=0.25, nodes_per_pass=8.0))
  assert f == dict(
      tau=3.0, tau_release_scale=False, accepted_per_pass=2.0, nodes_per_pass=8.0, draft_cost_share=0.25, tokens=12
  )
  f = tree_bench.row_figures({"tokens_generated": 5, "mean_accepted_length": 1.5, "per_request": {"drafted": [9]}})
  assert f["tau"] == 1.5 and f["tau_release_scale"] and f["accepted_per_pass"] is None and f["nodes_per_pass"] == 9


def test_run_group_interleaves_and_compares_with_ar(monkeypatch):
  calls = []

  def fake_generate(model, prompts, *, max_new_tokens, method, seed, **sampling):
    calls.append(method.name)
    secs = {"ar": 2.0, "chain": 1.0}[method.name]
    stats = {"decode_seconds": secs, "tokens_per_pass": 1.0 if method.name == "ar" else 2.0, "tokens_generated": 6}
    return types.SimpleNamespace(stats=stats, tokens=[[1, 2, 3]])

  monkeypatch.setattr(loopspec_jax, "generate", fake_generate)
  jobs = tree_bench.plan_jobs(["ar", "chain:2,4"], {"m": None}, {"m": [[0]]}, "m")
  cfg = types.SimpleNamespace(repeats=2, max_new_tokens=6, seed=0)
  logged = []
  rows = tree_bench.run_group(jobs, {}, cfg, logged.append)
  assert calls == ["ar", "chain", "chain", "ar", "ar", "chain"] and len(logged) == 6  # rotated each repeat
  assert [r["speed_vs_ar_median"] for r in rows] == [1.0, 2.0] and all(r["identical_to_ar"] for r in rows)
  assert rows[1]["decode_seconds"] == [1.0, 1.0] and rows[1]["tau"] == 2.0 and rows[1]["label"] == "chain(d1=2,gamma=4)"


def _row(method, tau, share=None, **kw):
  row = dict(task="t", sampling="greedy", method=method, tau=tau, tau_release_scale=False, accepted_per_pass=None)
  row.update(nodes_per_pass=None, draft_cost_share=share, decode_seconds_median=1.0, speed_vs_ar_median=1.0)
  row.update(identical_to_ar=True, model="m")
  row.update(kw)
  return row


def test_report_tables_and_target_lines():
  rows = [
      _row("ar", 1.0),
      _row("chain:2,6", 3.0, 0.5),
      _row("tree:d1=2,gamma=6", 4.6, 0.4),
      _row("eagle:heads=x", 3.5, 0.25, level_acceptance=[0.9, 0.5]),
      _row("medusa:heads=y", 3.0, 0.5, model="other"),
  ]
  cfg = ml_collections.ConfigDict(dict(model="m", target={"gamma": 6, "share": 0.4}, heads_target={"eagle_tau": 3.0}))
  text = tree_bench.report(rows, cfg)
  assert "| t | greedy | tree:d1=2,gamma=6 | 4.60 | - | - | 0.400 | 1.00 | 1.00x | yes |" in text
  assert "tau 4.60 vs chain 3.00; target 4.60: met" in text  # 3 + 0.4 (7 - 3)
  assert "| t | greedy | eagle:heads=x | 0.900 | 0.500 |" in text and "`spec@model`" in text
  assert "eagle:heads=x: tau 3.50; target >= 3.0 and > Medusa's 3.00: met" in text
  assert "eagle:heads=x: (tau - 1) / draft share = 10.0; beats chain:2,6 (4.0)" in text
  assert tree_bench.efficiency(rows[0]) is None and tree_bench.level_table(rows[:2]) == ""
  with pytest.raises(ValueError, match="first method must be 'ar'"):
    tree_bench.plan_jobs(["chain:2,4"], {"m": None}, {"m": []}, "m")
