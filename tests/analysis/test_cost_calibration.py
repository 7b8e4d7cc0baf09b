"""The cost model's calibration path (host terms, predicted vs measured iterations) and the hardware model."""

import dataclasses
import json
import os

import pytest

import loopspec_jax as lj
from loopspec_jax.analysis import calibrate
from loopspec_jax.analysis import cost
from loopspec_jax.analysis import hardware
from loopspec_configs import accelerators
from loopspec_configs.cost import calibrate as calibrate_config
from loopspec_experiments import cost_calibration

FIELDS = ("model", "method", "sampling", "context", "predicted_ms", "measured_ms", "predicted_ratio", "measured_ratio")


@pytest.mark.slow  # 38 s in the default suite (CI 2026-12-06); the default suite's budget is about 10 minutes
def test_calibration_writes_consistent_rows(tmp_path):
  c = calibrate_config.get_config("tiny")
  c.out_dir = str(tmp_path)
  payload = cost_calibration.run_calibration(c)
  rows = json.load(open(tmp_path / "calibration.json"))["rows"]
  assert rows == json.loads(json.dumps(payload["rows"]))
  assert [r["spec"] for r in rows] == list(c.model_settings.tiny_raven.methods)
  for r in rows:
    for f in FIELDS:
      assert f in r, f
    assert r["predicted_ms"] > 0 and r["measured_ms"] > 0 and r["tokens_per_iteration"] > 0
    assert r["ratio_error"] == pytest.approx(r["predicted_ratio"] / r["measured_ratio"] - 1)
    assert r["iteration_error"] == pytest.approx(r["predicted_ms"] / r["measured_ms"] - 1)
    terms = r["terms_ms"]
    parts = ("memory_ms", "compute_ms", "vector_ms", "overhead_ms")
    assert terms["total_ms"] == pytest.approx(sum(terms[k] for k in parts))
    assert r["transcendentals"] >= 0
    assert "wrong_term" in r and len(r["measured_ms_all"]) == c.repeats
    if r["ladder"]:  # a LoopSpec tick's width switch, counted at its measured mix
      assert r["ladder"][0] <= r["mean_width"] <= r["ladder"][-1]
      assert r["branch_weights"] == pytest.approx(list(calibrate.branch_mix(tuple(r["ladder"]), r["mean_width"])))
    else:
      assert r["branch_weights"] == "max"
  ar = rows[0]
  assert ar["predicted_ratio"] == pytest.approx(1.0) and ar["measured_ratio"] == pytest.approx(1.0)
  assert ar["iteration_error"] >= -1e-6 or c.overhead_from != "ar"  # per-op fitted on AR: never below it
  assert ar["bandwidth_bound_ms"] > 0 and ar["ideal_bytes"] > 0
  readme = open(tmp_path / "README.md").read()
  for part in ("host:", "date:", "command:", "median |ratio error|", "Rooflines", "product shapes timed"):
    assert part in readme
  assert os.path.exists(tmp_path / "calibration.md")
  both = cost_calibration.combine([str(tmp_path), str(tmp_path)], str(tmp_path / "all"))
  assert both["rows"] == rows + rows and both["summary"]["rows"] == 2 * len(rows)
  assert "median |ratio error|" in open(tmp_path / "all" / "calibration.md").read()


def _cost(flops_rows, nbytes, ops):
  c = cost.StepCost(ops=ops)
  for i, (rows, f) in enumerate(flops_rows):
    c.flop_items[(f"k{i}", rows)] = f
    c.flops += f
  c.charge("weights", nbytes, "k0")
  return c


def test_hardware_sums_per_kernel_rooflines_and_overhead():
  hw = hardware.Hardware("x", bandwidth=1e9, peak_flops=1e12, op_overhead_s=1e-6, flops_at_rows=((1, 1e9), (16, 16e9)))
  assert hw.throughput(4) == pytest.approx(1e9 + 15e9 * 0.5)  # halfway in log(M) between 1 and 16
  c = _cost([(1, 2e9), (16, 16e9)], 1e9, 10)  # k0: 1 s memory vs 2 s compute; k1: 1 s compute
  t = hw.terms(c)
  assert t["compute_s"] == pytest.approx(3.0) and t["memory_s"] == 0
  assert hw.step_seconds(c) == pytest.approx(3.0 + 1e-5)
  assert hw.step_seconds(c, mode="roofline") == pytest.approx(max(18e9 / 1e12, 1e9 / 1e9) + 1e-5)
  assert hardware.Hardware.from_dict(json.loads(json.dumps(hw.as_dict()))) == hw


def test_every_accelerator_has_an_overhead_with_its_source():
  for name, a in accelerators.ACCELERATORS.items():
    hw = hardware.from_accelerator(name, a)
    assert 0 < hw.op_overhead_s <= 5e-6 and hw.source, name
    assert hw.with_overhead(0).step_seconds(_cost([(1, 1e9)], 1e9, 100)) < hw.step_seconds(_cost([(1, 1e9)], 1e9, 100))


def test_timed_product_shapes_and_per_category_bandwidth():
  sig = "f32[1,128]xf32[128,384];lc=1;rc=0;lb=;rb="
  assert calibrate.parse_signature(sig) == (("f32", (1, 128)), ("f32", (128, 384)), (((1,), (0,)), ((), ())))
  c = _cost([(1, 2e9)], 1e9, 0)
  c.dot_items[("k0", sig)] = 2.0
  c.dot_shapes[sig] = (1e9, 1)
  hw = hardware.Hardware(
      "x", bandwidth=1e9, peak_flops=1e12, flops_at_rows=((1, 1e9),), bandwidth_at_bytes=((1e6, 4e9), (1e9, 1e9))
  )
  assert hw.terms(c)["compute_s"] == pytest.approx(2.0)  # untimed: flops / P(1)
  timed = dataclasses.replace(hw, dot_seconds=((sig, 0.25),))
  assert timed.terms(c)["memory_s"] == pytest.approx(1.0)  # two timed products (0.5 s) < 1 GB at 1 GB/s
  assert timed.terms(c, {"weights": 1e6})["compute_s"] == pytest.approx(0.5)  # weights cache-resident: 0.25 s
  assert hardware.Hardware.from_dict(json.loads(json.dumps(timed.as_dict()))) == timed


def test_dot_signature_of_compiled_products():
  import jax
  import jax.numpy as jnp

  f = jax.jit(lambda x, w: jax.lax.fori_loop(0, 3, lambda _, x: jnp.tanh(x @ w), x))
  x, w = jnp.ones((2, 16)), jnp.ones((16, 16))
  step = cost.analyze_hlo(f.lower(x, w).compile().as_text())
  (sig,) = step.dot_shapes
  lhs, rhs, dn = calibrate.parse_signature(sig)
  assert lhs[0] == rhs[0] == "f32" and sorted([lhs[1], rhs[1]]) == [(2, 16), (16, 16)]
  assert step.dot_shapes[sig] == (2.0 * 2 * 16 * 16, 2)


def test_transcendentals_counted_per_kernel_and_bound_by_their_rate():
  import jax
  import jax.numpy as jnp

  f = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda _, x: jnp.tanh(x) * jnp.exp(x), x))
  step = cost.analyze_hlo(f.lower(jnp.ones((4, 32))).compile().as_text())
  assert step.transcendentals == 2 * 4 * 32  # tanh and exp over [4, 32] in one fused kernel
  hw = hardware.Hardware("x", bandwidth=1e12, peak_flops=1e12, transcendental_rate=256.0)
  assert hw.terms(step)["vector_s"] == pytest.approx(1.0)  # 256 elements at 256 per second
  assert hardware.Hardware("x", bandwidth=1e12, peak_flops=1e12).terms(step)["vector_s"] == 0.0
  fn, elements = calibrate._transcendental_loop(2, 8, iters=3)
  assert elements > 0 and float(fn().sum()) == float(fn().sum())


def test_products_timed_over_their_footprint():
  sig = "f32[1,16]xf32[16,32];lc=1;rc=0;lb=;rb="
  assert calibrate.dot_footprint(sig, {"weights": 1e6, "kv": 9e6}) == 1e6
  assert calibrate.dot_footprint("f32[2,1,8]xf32[2,8,4];lc=2;rc=1;lb=0;rb=0", {"weights": 1e6, "kv": 9e6}) == 9e6
  fn, n = calibrate._dot_fn(sig, footprint=8 * 16 * 32 * 4)  # eight distinct copies of the weight
  assert n % 8 == 0 and float(fn()) == float(fn())


def test_branch_mix_interpolates_between_the_rungs_around_the_mean_width():
  assert calibrate.branch_mix((1, 2), 1.25) == pytest.approx((0.75, 0.25))
  assert calibrate.branch_mix((1, 2, 4, 8), 3.0) == pytest.approx((0.0, 0.5, 0.5, 0.0))
  assert calibrate.branch_mix((1, 2, 4), 4.0) == pytest.approx((0.0, 0.0, 1.0))
  assert calibrate.branch_mix((2, 4), 1.0) == pytest.approx((1.0, 0.0))  # clamped to the ladder
  assert calibrate.branch_mix((1, 2), None) == calibrate.branch_mix((4,), 4.0) == "max"


@pytest.mark.slow
def test_loopspec_loop_reports_its_ladder_and_mean_width():
  lr = calibrate.time_decode_loop(lj.load("tiny-raven"), "loopspec:d1=2,d2=8", context=48, new_tokens=8, greedy=True)
  assert len(lr.widths) > 1 and list(lr.widths) == sorted(lr.widths)
  _, iters, toks, width = lr.run()
  assert iters > 0 and toks == 8 and lr.widths[0] <= width <= lr.widths[-1]
