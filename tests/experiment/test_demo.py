"""loopspec_jax/experiment/demo.py (loopspec-demo's runs) without decoding: the depth pair, the runs of each
sampling setting and the planner's settings. (tests/experiments/test_bench.py runs the lines and compiles.)"""

import ml_collections

import loopspec_jax
from loopspec_jax.experiment import demo


def test_runs_per_setting_and_depths():
  cfg = ml_collections.ConfigDict(dict(d1=2, d2=8, gate_mass=0.1, auto=False))
  assert demo.chosen_depths(None, cfg) == (2, 8)
  greedy, sampled = (dict(demo.demo_runs(cfg, 2, 8, s)) for _, s in demo.SETTINGS)
  assert list(greedy) == ["autoregressive", "loopspec", "loopspec single proposal"]
  assert "gate_mass" not in greedy["loopspec"] and sampled["loopspec"]["gate_mass"] == 0.1
  assert list(dict(demo.demo_runs(cfg, 2, None, {}))) == ["autoregressive", "loopspec"]
  cfg.auto, cfg.auto_measure = True, 8
  auto = dict(demo.demo_runs(cfg, 2, 8, {}))["auto"]["method"]
  assert isinstance(auto, loopspec_jax.Auto) and auto.measure == 8


def test_auto_line_names_the_picks():
  ar = {"decode_seconds": 2.0}
  auto = {"decode_seconds": 1.0, "tokens_per_second": 50.0, "plans": [{"choice": "ar"}, {"choice": "loopspec"}]}
  line = demo.auto_line(ar, [], auto)
  assert "2.00x AR" in line and "planner picked ar, loopspec" in line
  assert "picked ?" in demo.auto_line(ar, [], {"decode_seconds": 1.0, "tokens_per_second": 1.0})
