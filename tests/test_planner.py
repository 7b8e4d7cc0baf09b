"""method="auto": the planner picks a registered exact method, says why, and decodes exactly."""

import pytest

import helpers
import loopspec_jax as lj
from loopspec_jax import methods
from loopspec_jax import planner
from loopspec_jax.analysis import hardware


def test_auto_is_registered_and_parses():
  assert methods.parse("auto") == planner.Auto()
  assert methods.parse("auto:probe_tokens=0,shortlist=0") == planner.Auto(probe_tokens=0, shortlist=0)
  with pytest.raises(ValueError, match="resolved per call"):
    planner.Auto().make_decoder(helpers.tiny_config("huginn:tiny"), greedy=True, random_init=False)


def test_candidates_are_valid_and_ranked():
  cfg = helpers.tiny_config("huginn:tiny")
  hw = hardware.Hardware("x", bandwidth=1e10, peak_flops=1e11, op_overhead_s=1e-8)
  ranked = planner.rank(cfg, hw, 1, 64, planner.ENVELOPE)
  assert {type(c.method).__name__ for c in ranked} == {"AR", "Chain", "LoopSpec"}
  rates = [c.tokens_per_s for c in ranked]
  assert rates == sorted(rates, reverse=True)
  ar = next(c for c in ranked if c.method == lj.AR())
  assert ar.tokens_per_iteration == 1.0


@pytest.mark.parametrize("auto", [planner.Auto(probe_tokens=8, shortlist=0), "auto:probe_tokens=0,shortlist=0"])
def test_auto_greedy_equals_ar_and_reports_its_choice(auto):
  model = helpers.tiny_model("huginn:tiny")
  out = lj.generate(model, helpers.PROMPTS, max_new_tokens=helpers.MAX_NEW, method=auto)
  assert out.tokens == helpers.ar_tokens(model, helpers.PROMPTS, helpers.MAX_NEW)
  plan = out.stats["plan"]
  assert methods.parse(plan["choice"]).name in ("ar", "chain", "loopspec")
  assert out.stats["method"] == methods.parse(plan["choice"]).name
  for c in plan["top"]:
    assert c["tokens_per_iteration"] > 0 and c["iteration_ms"] > 0 and c["tokens_per_s"] > 0
  assert plan["top"][0]["method"] == plan["choice"] and "x AR predicted" in plan["reason"]
  assert plan["depth_curve"]["source"] in ("probe", "envelope", "envelope (probe did not fit)")


@pytest.mark.slow
def test_shortlist_is_retimed_from_the_compiled_loops():
  cfg = helpers.tiny_config("huginn:tiny")
  hw = hardware.Hardware("x", bandwidth=1e10, peak_flops=1e11, op_overhead_s=1e-6)
  analytic = {c.method: c for c in planner.rank(cfg, hw, 1, 64, planner.ENVELOPE)}
  timed = planner.rank(cfg, hw, 1, 64, planner.ENVELOPE, shortlist=2)
  assert len(timed) == 3 and lj.AR() in [c.method for c in timed]
  for c in timed:  # the HLO's kernels x 1 us alone differ from the analytic guess
    assert c.iteration_s != analytic[c.method].iteration_s
    assert c.tokens_per_iteration == analytic[c.method].tokens_per_iteration
