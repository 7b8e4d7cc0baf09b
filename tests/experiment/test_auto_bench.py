"""loopspec_jax/experiment/auto_bench.py (bench_auto's run) with a fake `generate`: one block's rows, auto's
summary against the fastest fixed method, its pick cells and the tables. No model, no compile."""

import types

import pytest

import loopspec_jax
from loopspec_jax.experiment import auto_bench

PLAN = {
    "choice": "loopspec(d1=2,d2=8)",
    "basis": "measured probes",
    "top": [{"method": "loopspec:d1=2,d2=8", "predicted_iteration_ms": 2.0, "iteration_ms": 2.5, "x_ar": 1.5}],
}


def test_run_row_and_table(monkeypatch):
  calls = []

  def fake_generate(model, prompts, *, max_new_tokens, method, seed, request_ids, **sampling):
    calls.append((method.name, request_ids[0]))
    stats = {"decode_seconds": 0.01, "ticks": 4, "tokens": 8, "plan": PLAN if method.name == "auto" else None}
    return types.SimpleNamespace(stats=stats, tokens=[[1, 2]])

  monkeypatch.setattr(loopspec_jax, "generate", fake_generate)
  rows = auto_bench.run_row(None, [[0], [1]], ["ar", "loopspec:2,8", "auto"], {}, 8, repeats=2, seed=0)
  assert len(calls) == 3 * 2 * 3 and calls[6:8] == [("ar", 0), ("ar", 1)] and calls[12][0] == "loopspec"
  auto = rows["auto"]
  assert auto["fastest_fixed"] in ("ar", "loopspec:2,8") and auto["plan"] == PLAN and len(auto["load"]) == 2
  assert rows["ar"]["ratio_vs_ar_median"] == 1.0 and rows["ar"]["identical_to_ar"] and rows["ar"]["tokens"] == 16
  assert rows["ar"]["ms_per_iteration_median"] == pytest.approx(2.5)  # 2 x 10 ms over 2 x 4 iterations
  text = auto_bench.table([{"model": "m", "sampling": "greedy", "rows": rows}])
  assert "| m | greedy | loopspec:2,8 |" in text and "| auto / fastest fixed |" in text
  assert "| loopspec(d1=2,d2=8) | 2 / 2.5 / 2.5 |" in text


def test_picks_with_replanning():
  assert auto_bench.picks(PLAN) == "loopspec(d1=2,d2=8)"
  second = {"choice": "ar", "after_tokens": 16, "top": [{"x_ar": 1.0}]}
  assert auto_bench.picks(dict(PLAN, replan=second)) == "loopspec(d1=2,d2=8), then after 16: ar (1.00x AR)"
