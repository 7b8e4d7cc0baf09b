"""Tests of the HLO cost model (loopspec_jax.analysis.cost): copy detection, exact counts, the AR roofline."""

import re

import jax
import jax.numpy as jnp
import pytest

from loopspec_jax.analysis import cost
from loopspec_jax.analysis import hlo
from loopspec_configs import accelerators
from loopspec_configs.models import model_config


def _hlo(f, *args) -> str:
  return jax.jit(f).lower(*args).compile().as_text()


# ---------------------------------------------------------------------------------------------------
# Small hand-written loops
# ---------------------------------------------------------------------------------------------------
BUF = jnp.zeros((8, 64, 32), jnp.float32)  # 8 "slots" of [64, 32]
ROW = jnp.ones((64, 32), jnp.float32)
SLOT_BYTES = 64 * 32 * 4


def _copying_loop(buf, v):
  """The carry holds the buffer before AND after an in-place update: XLA must copy it every iteration."""

  def body(c):
    i, new, old = c
    return i + 1, new.at[i].set(v), new

  return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, buf, buf))


def _clean_loop(buf, v):
  def body(c):
    i, b = c
    return i + 1, b.at[i].set(v)

  return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, buf))


def test_loop_carried_copy_is_flagged():
  c = cost.analyze_hlo(_hlo(_copying_loop, BUF, ROW), kv_dims=[BUF.shape], slot_bytes=SLOT_BYTES)
  assert c.loop_carried_copies >= 1
  assert any(r.loop_carried and r.nbytes >= BUF.size * 4 for r in c.large_copies)
  assert c.bytes["copies"] >= 2 * BUF.size * 4  # read + write of the whole buffer


def test_in_place_loop_has_no_copy_and_counts_only_the_update():
  c = cost.analyze_hlo(_hlo(_clean_loop, BUF, ROW), kv_dims=[BUF.shape], slot_bytes=SLOT_BYTES)
  assert c.loop_carried_copies == 0 and c.cache_sized_copies == 0
  assert c.bytes["kv"] == ROW.size * 4  # the update, not the whole buffer
  assert c.bytes["copies"] < SLOT_BYTES


def _matmul_loop(x, w):
  def body(c):
    i, x = c
    return i + 1, x @ w

  return jax.lax.while_loop(lambda c: c[0] < 5, body, (0, x))


def _body_ops_by_regex(text: str) -> int:
  """Independent op count: instruction lines of the outer loop's body that are not free."""
  body = re.search(r"body=%?([\w.\-]+)", text[text.index("ENTRY") :]).group(1)
  block = re.search(rf"\n%?{re.escape(body)} .*?\{{\n(.*?)\n\}}", text, re.S).group(1)
  ops = [re.search(r"=\s+(?:\([^=]*\)|\S+)\s+([\w\-]+)\(", line).group(1) for line in block.splitlines()]
  return sum(op not in cost.FREE_OPS for op in ops)


def test_single_matmul_body_counts_are_exact():
  x, w = jnp.zeros((4, 8), jnp.float32), jnp.zeros((8, 8), jnp.float32)
  text = _hlo(_matmul_loop, x, w)
  c = cost.analyze_hlo(text)
  assert c.flops == 2 * 4 * 8 * 8
  assert c.ops == _body_ops_by_regex(text)
  assert c.bytes["weights"] == w.size * 4  # the loop-invariant dot operand, read once
  assert c.unknown_trip_counts == 0


def test_inner_loop_is_multiplied_by_its_trip_count():
  def f(x, w):
    def body(c):
      i, x = c
      return i + 1, jax.lax.fori_loop(0, 3, lambda _, y: y @ w, x)

    return jax.lax.while_loop(lambda c: c[0] < 5, body, (0, x))

  x, w = jnp.zeros((4, 8), jnp.float32), jnp.zeros((8, 8), jnp.float32)
  c = cost.analyze_hlo(_hlo(f, x, w))
  assert c.flops == 3 * 2 * 4 * 8 * 8
  assert c.unknown_trip_counts == 0


def test_conditional_counts_the_largest_branch_or_the_mean():
  def f(x, w):
    def body(c):
      i, x = c
      y = jax.lax.cond(i % 2 == 0, lambda x: (x @ w) @ w, lambda x: x + 1.0, x)
      return i + 1, y

    return jax.lax.while_loop(lambda c: c[0] < 5, body, (0, x))

  x, w = jnp.zeros((4, 8), jnp.float32), jnp.zeros((8, 8), jnp.float32)
  text = _hlo(f, x, w)
  hi = cost.analyze_hlo(text, branch="max")
  mean = cost.analyze_hlo(text, branch="mean")
  only = [cost.analyze_hlo(text, branch=w).flops for w in ((1.0, 0.0), (0.0, 1.0))]
  mix = cost.analyze_hlo(text, branch=(0.25, 0.75))
  if hi.conditionals:  # XLA may turn a small cond into a select; then both branches run
    assert hi.flops == 2 * 2 * 4 * 8 * 8
    assert mean.flops == hi.flops / 2
    assert sorted(only) == [0.0, hi.flops]  # a measured branch mix weights each branch (in HLO order)
    assert mix.flops == pytest.approx(0.25 * only[0] + 0.75 * only[1])
  else:
    assert hi.flops == mean.flops == mix.flops == 2 * 2 * 4 * 8 * 8
  for bad in ((0.5, 0.6), (-0.5, 1.5), (), "min"):
    with pytest.raises(ValueError, match="branch"):
      cost.analyze_hlo(text, branch=bad)


def test_contiguous_slices():
  assert hlo.contiguous((18, 1, 4, 64, 8), (1, 1, 4, 64, 8))
  assert hlo.contiguous((4, 64, 8), (4, 64, 8))
  assert hlo.contiguous((8, 64), (3, 64))
  assert not hlo.contiguous((4, 64, 8), (4, 1, 8))
  assert not hlo.contiguous((8, 64), (8, 3))


def test_parse_tuple_shapes_and_operands():
  ins, root = cost.parse_instr("  ROOT %t.1 = (s32[], bf16[2,3]{1,0}, /*index=2*/pred[]) tuple(%a, %b.2, %c)")
  assert root and ins.opcode == "tuple" and ins.operands == ["a", "b.2", "c"]
  assert ins.shapes == [("s32", ()), ("bf16", (2, 3)), ("pred", ())]
  assert ins.nbytes() == 4 + 12 + 1


# ---------------------------------------------------------------------------------------------------
# A tiny model's AR loop: categories against sizes computed from the config, and the roofline
# ---------------------------------------------------------------------------------------------------
def _tiny_ar(dtype: str):
  cfg = model_config(
      "huginn:tiny", hidden_size=256, head_dim=64, intermediate_size=512, max_len=256, embed_scale=16.0
  ).replace(dtype=dtype)
  compiled = cost.compile_decode_loop(cfg, "ar")
  return cfg, compiled, cost.loop_cost(compiled)


@pytest.fixture(scope="module")
def tiny_ar():
  return _tiny_ar("bfloat16")


def test_ar_weights_and_kv_match_the_config(tiny_ar):
  cfg, compiled, c = tiny_ar
  ideal = cost.ar_token_bytes(cfg, compiled.total_len)
  assert c.bytes["weights"] == pytest.approx(ideal["weights"], rel=0.02)
  assert c.bytes["kv"] == pytest.approx(ideal["kv"], rel=0.1)
  assert c.flops >= 2 * ideal["weights"] / 2  # every weight in a dot at least once (bf16: 2 bytes/param)
  assert c.unknown_trip_counts == 0


def test_ar_projection_is_weights_plus_kv_over_bandwidth():
  """float32: on the CPU backend a bf16 cache is converted to f32 for its dots (no bf16 dot here), and that
  conversion makes XLA CPU copy the prelude buffers at the loop boundary; a GPU/TPU reads bf16 in place. In
  float32 the AR loop carries no copy (every cache write is ordered after its reads), so the roofline is exact."""
  cfg, compiled, c = _tiny_ar("float32")
  assert c.loop_carried_copies == 0, f"{c.loop_carried_copies} loop-carried copies ({c.bytes['copies']:.0f} bytes)"
  ideal = cost.ar_token_bytes(cfg, compiled.total_len)
  a = accelerators.ACCELERATORS["h200"]
  t = cost.step_seconds(c, a["peak_flops"], a["hbm_bandwidth"])
  assert t == pytest.approx(max(c.flops / a["peak_flops"], c.total_bytes / a["hbm_bandwidth"]))
  tok_s = cost.project(c, 1.0, {"h200": a})["h200"]
  assert tok_s == pytest.approx(1.0 / t)
  assert t == pytest.approx((ideal["weights"] + ideal["kv"]) / a["hbm_bandwidth"], rel=0.1)


def test_roofline_and_token_rates():
  c = cost.StepCost(flops=1e12)
  c.bytes["weights"] = 4.8e9
  assert cost.step_seconds(c, 1e15, 4.8e12) == pytest.approx(1e-3)
  assert cost.step_seconds(c, 1e14, 4.8e12) == pytest.approx(1e-2)
  c.ops = 1000
  assert cost.step_seconds(c, 1e15, 4.8e12, op_overhead=1e-6) == pytest.approx(2e-3)
  assert cost.loopspec_tokens_per_tick(32, 2, 14.5) == pytest.approx(14.5 * 2 / 32)
  assert cost.chain_tokens_per_round(32, 2, 8, 32 / 2) == pytest.approx(9.0)  # gamma = R/d1: all accepted
  assert cost.live_lanes(32, 2) == 17
