"""loopspec_jax/experiment/row_cost.py (loopspec-row-cost) without compiling: the bound, the pipeline's tokens
per tick, the per-position slope, the cache-length check, the summary and its tables from made-up timings.
(tests/experiments/test_bench.py measures them on the tiny model.)"""

import types

import numpy as np
import pytest

from loopspec_jax.experiment import row_cost


def test_bound_and_pipeline_fill():
  assert row_cost.ratio_bound(4e-3, 1e-3, 2) == 2.0 and row_cost.ratio_bound(4e-3, 1e-3, 2, 0.5) == 1.0
  assert row_cost.pipeline_tokens_per_tick(8, 1) == 1.0 and row_cost.pipeline_tokens_per_tick(8, 4) == 8 / 11
  costs = {10: {"ar": 1.0, "loopspec": 2.0}, 20: {"ar": 2.0, "loopspec": 2.5}}
  assert row_cost.slope_per_position(costs, "ar") == pytest.approx(0.1)
  assert row_cost.slope_per_position(costs, "loopspec") == pytest.approx(0.05)
  assert np.isnan(row_cost.slope_per_position({10: costs[10]}, "ar"))


def test_cache_length_is_checked():
  cfg = types.SimpleNamespace(max_len=64)
  row_cost.check_cache_length(cfg, 64, 8)
  for context in (8, 65):
    with pytest.raises(ValueError, match="cache length"):
      row_cost.check_cache_length(cfg, context, 8)


def test_summary_and_tables():
  model = types.SimpleNamespace(config=types.SimpleNamespace(recurrence=8))
  res = {"step_seconds": {1: 1e-3, 4: 2e-3}, "ar_token_seconds": 10e-3}
  costs = {16: {"ar": 10e-3, "loopspec": 5e-3}, 32: {"ar": 12e-3, "loopspec": 6e-3}}
  s = row_cost.summarize("tiny", model, res, 2, new_tokens=8, costs=costs)
  assert s["groups"] == 4 and s["ar_core_ms"] == pytest.approx(8.0) and s["tick_core_floor_ms"] == pytest.approx(4.0)
  assert s["row_step_cost_vs_one_row"] == pytest.approx(0.5) and s["bound_at_one_token_per_tick"] == pytest.approx(2.5)
  assert s["bound_no_rejection"] == pytest.approx(2.5 * 8 / 11)
  assert s["ar_slope_s_per_position"] == pytest.approx(2e-3 / 16)
  text = row_cost.tables([("tiny", res, s)], 8)
  assert "| tiny | 4 | 2.000 | 0.5000 | 0.50 |" in text and "| 2.50x | 1.82x (0.727 tokens/tick) |" in text
  assert "| tiny | 16 | 10.00 | 5.00 | 0.50 | 1.45x |" in text and "| tiny | per 100 positions |" in text
  assert "decode_costs" not in row_cost.summarize("tiny", model, res, 2, new_tokens=8)
