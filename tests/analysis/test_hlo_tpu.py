"""The HLO parser on what the TPU compiler writes (loopspec_jax.analysis.hlo / hlo_cost): products as
convolutions with batch dims and output dims written as windows, fusions nested in fusions, on-chip memory
spaces, async slices, trip counts whose start is a copy, weights threaded through inner loops; and the
programs of known traffic (`analysis/micro.py`) compiled for v5e, where libtpu is installed."""

import json

import pytest

from loopspec_jax.analysis import aot
from loopspec_jax.analysis import hlo
from loopspec_jax.analysis import hlo_cost
from loopspec_jax.analysis import micro

needs_tpu = pytest.mark.skipif(aot.tpu_unavailable() is not None, reason=f"TPU compiler: {aot.tpu_unavailable()}")


def _conv_flops(lhs: str, rhs: str, out: str, attrs: str) -> float:
  text = f"""HloModule c
ENTRY %main (a: {lhs}, b: {rhs}) -> {out} {{
  %a = {lhs} parameter(0)
  %b = {rhs} parameter(1)
  ROOT %c = {out} convolution(%a, %b), {attrs}
}}
"""
  comps, entry = hlo.parse_hlo(text)
  comp = comps[entry]
  return hlo.dot_flops(comp.instrs["c"], comp), hlo.dot_rows(comp.instrs["c"], comp)


def test_convolution_windows_count_real_taps_only():
  # attention over 16 stages x 8 heads: the window dims are batch dims (1 tap each), 8 query rows
  flops, rows = _conv_flops(
      "bf16[16,8,8,2049]",
      "bf16[16,8,2049,64]",
      "f32[16,8,8,64]",
      "window={size=16x8 stride=15x7 lhs_dilate=16x8}, dim_labels=01bf_01io->01bf",
  )
  assert flops == 2 * 16 * 8 * 8 * 64 * 2049 and rows == 8
  # a projection whose output dim is a reversed window over a one-element, fully padded lhs: 1 tap
  flops, rows = _conv_flops(
      "bf16[32,2048,1]",
      "bf16[32,64,2048]",
      "bf16[32,32,64]",
      "window={size=32 pad=31_31 rhs_reversal=1}, dim_labels=bf0_0oi->b0f",
  )
  assert flops == 2 * 32 * 32 * 64 * 2048 and rows == 32
  # a real 1-d convolution: 3 taps inside, 2 at the padded edges
  flops, _ = _conv_flops("f32[1,10,4]", "f32[3,4,5]", "f32[1,10,5]", "window={size=3 pad=1_1}, dim_labels=b0f_0io->b0f")
  assert flops == 2 * 5 * 4 * (2 + 3 * 8 + 2)


def test_memory_spaces_are_parsed_per_leaf():
  ins, _ = hlo.parse_instr(
      "  %s = ((bf16[6,8]{1,0}), bf16[2,8]{1,0:T(8,128)S(1)}, s32[]{:S(2)}) slice-start(%w), slice={[0:2], [0:8]}"
  )
  assert ins.spaces == (0, 1, 2) and not ins.on_chip(0) and ins.on_chip(1)
  assert ins.hbm_bytes() == 6 * 8 * 2


TUPLE = "(s32[], bf16[8,64]{1,0:T(8,128)S(1)}, bf16[6,64,64]{2,1,0})"
LOOP = f"""HloModule t

%slice_layer (p0: bf16[6,64,64], p1: s32[]) -> bf16[64,64] {{
  %p0 = bf16[6,64,64]{{2,1,0}} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = bf16[1,64,64]{{2,1,0}} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={{1,64,64}}
  ROOT %bc = bf16[64,64]{{1,0}} bitcast(%ds)
}}

%product (q0: bf16[8,64], q1: bf16[6,64,64], q2: s32[]) -> bf16[8,64] {{
  %q0 = bf16[8,64]{{1,0:T(8,128)S(1)}} parameter(0)
  %q1 = bf16[6,64,64]{{2,1,0}} parameter(1)
  %q2 = s32[] parameter(2)
  %wl = bf16[64,64]{{1,0}} fusion(%q1, %q2), kind=kLoop, calls=%slice_layer
  ROOT %d = bf16[8,64]{{1,0:T(8,128)S(1)}} convolution(%q0, %wl), dim_labels=bf_io->bf
}}

%inner_body (a: {TUPLE}) -> {TUPLE} {{
  %a = {TUPLE} parameter(0)
  %j = s32[] get-tuple-element(%a), index=0
  %x = bf16[8,64]{{1,0:T(8,128)S(1)}} get-tuple-element(%a), index=1
  %w = bf16[6,64,64]{{2,1,0}} get-tuple-element(%a), index=2
  %y = bf16[8,64]{{1,0:T(8,128)S(1)}} fusion(%x, %w, %j), kind=kOutput, calls=%product
  %one = s32[] constant(1)
  %j1 = s32[]{{:S(2)}} add(%j, %one)
  ROOT %t = {TUPLE} tuple(%j1, %y, %w)
}}

%inner_cond (a: {TUPLE}) -> pred[] {{
  %a = {TUPLE} parameter(0)
  %j = s32[] get-tuple-element(%a), index=0
  %two = s32[] constant(2)
  ROOT %lt = pred[] compare(%j, %two), direction=LT
}}

%outer_body (b: {TUPLE}) -> {TUPLE} {{
  %b = {TUPLE} parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %x = bf16[8,64]{{1,0:T(8,128)S(1)}} get-tuple-element(%b), index=1
  %w = bf16[6,64,64]{{2,1,0}} get-tuple-element(%b), index=2
  %ss = ((bf16[6,64,64]{{2,1,0}}), bf16[2,64,64]{{2,1,0:T(8,128)S(1)}}, s32[]{{:S(2)}}) slice-start(%w), slice={{[0:2], [0:64], [0:64]}}
  %sd = bf16[2,64,64]{{2,1,0:T(8,128)S(1)}} slice-done(%ss)
  %zero = s32[] constant(0)
  %start = s32[]{{:S(2)}} copy(%zero)
  %init = {TUPLE} tuple(%start, %x, %w)
  %loop = {TUPLE} while(%init), condition=%inner_cond, body=%inner_body
  %y = bf16[8,64]{{1,0:T(8,128)S(1)}} get-tuple-element(%loop), index=1
  %w2 = bf16[6,64,64]{{2,1,0}} get-tuple-element(%loop), index=2
  %one = s32[] constant(1)
  %i1 = s32[]{{:S(2)}} add(%i, %one)
  ROOT %t = {TUPLE} tuple(%i1, %y, %w2)
}}

%outer_cond (b: {TUPLE}) -> pred[] {{
  %b = {TUPLE} parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %five = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %five), direction=LT
}}

ENTRY %main (x0: bf16[8,64], w0: bf16[6,64,64]) -> bf16[8,64] {{
  %x0 = bf16[8,64]{{1,0}} parameter(0)
  %w0 = bf16[6,64,64]{{2,1,0}} parameter(1)
  %c0 = s32[] constant(0)
  %s = (s32[], bf16[8,64]{{1,0}}, bf16[6,64,64]{{2,1,0}}) tuple(%c0, %x0, %w0)
  %l = {TUPLE} while(%s), condition=%outer_cond, body=%outer_body
  ROOT %r = bf16[8,64]{{1,0}} get-tuple-element(%l), index=1
}}
"""


def test_tpu_loop_reads_one_layer_per_product_and_nothing_on_chip():
  """Per outer iteration: an inner loop of 2 trips (its start a copy of 0) whose product reads one layer of
  the weight stack through a nested fusion (2 x 64 x 64 x 2 bytes), an async slice of 2 layers into on-chip
  memory (2 x 64 x 64 x 2 bytes); the activations live on chip (S(1)): no HBM traffic."""
  c = hlo_cost.analyze_hlo(LOOP)
  layer = 64 * 64 * 2
  assert c.unknown_trip_counts == 0
  assert c.flops == 2 * (2 * 8 * 64 * 64)
  assert c.bytes["weights"] == 2 * layer + 2 * layer  # the weight stays a weight through the inner loop
  assert c.bytes["other"] + c.bytes["copies"] < 64  # scalars only


@needs_tpu
def test_micro_programs_known_traffic_on_v5e():
  """The parser's one iteration is the known traffic (the switch under the schedule's mean); XLA's
  cost_analysis counts a while body once (an inner loop of 4 matvecs as one) and a switch at its most
  expensive branch."""
  rows = {r["program"]: r for r in micro.measure("tpu:v5e", e=256, f=1024, t=512, d=256, s=4)}
  for name, r in rows.items():
    parser = r["parser_bytes_mean"] if name == "switch" else r["parser_bytes"]
    assert parser == pytest.approx(r["known_bytes_per_iteration"], rel=0.05, abs=8192), name
  assert rows["nested"]["parser_flops"] == rows["nested"]["known_flops_per_iteration"]
  assert rows["nested"]["xla_bytes"] < 0.5 * rows["nested"]["known_bytes_per_iteration"]
  dear = 256 * 1024 * 2
  assert rows["switch"]["xla_bytes"] == pytest.approx(dear, rel=0.1)


CB = 'custom-call(%x), custom_call_target="ConcatBitcast"'
CONCATS = f"""HloModule k

%b0 (p: f32[4]) -> f32[4] {{
  %p = f32[4] parameter(0)
  %x = f32[4] negate(%p)
  %c1 = f32[4] {CB}
  %c2 = f32[4] {CB}
  ROOT %c3 = f32[4] {CB}
}}

%b1 (p: f32[4]) -> f32[4] {{
  %p = f32[4] parameter(0)
  %x = f32[4] negate(%p)
  ROOT %c1 = f32[4] {CB}
}}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {{
  %t = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[4] get-tuple-element(%t), index=1
  %c1 = f32[4] {CB}
  %y = f32[4] conditional(%i, %c1, %c1), branch_computations={{%b0, %b1}}
  ROOT %r = (s32[], f32[4]) tuple(%i, %y)
}}

%cond (t: (s32[], f32[4])) -> pred[] {{
  %t = (s32[], f32[4]) parameter(0)
  ROOT %f = pred[] constant(false)
}}

ENTRY %main (x: f32[4]) -> f32[4] {{
  %x = f32[4] parameter(0)
  %c0 = f32[4] {CB}
  %z = s32[] constant(0)
  %s = (s32[], f32[4]) tuple(%z, %c0)
  %w = (s32[], f32[4]) while(%s), condition=%cond, body=%body
  ROOT %o = f32[4] get-tuple-element(%w), index=1
}}
"""


def test_xla_concat_bitcasts_walk_the_body_once_and_the_fewest_branch():
  """XLA's v5e optimal_seconds is -1 s per ConcatBitcast its walk meets (README of
  results/tpu_aot/2026-12-07-costs): entry 1 + loop body 1 + the branch with fewer (1, not 3)."""
  from loopspec_experiments import tpu_costs  # noqa: PLC0415

  assert tpu_costs.xla_concat_bitcasts(CONCATS) == 3


def test_projection_divides_each_iteration_by_its_tokens():
  """Parser ms per token = roofline of one iteration / tokens it commits (a LoopSpec (2, 8) tick at gamma 14.5:
  0.906); XLA's only on the chip its HLO was compiled for; another chip's HLO is named in the table."""
  from loopspec_experiments import tpu_costs  # noqa: PLC0415

  def row(method, target, gb):
    return {"model": "huginn:0125", "method": method, "target": target, "parser_bytes_steady": gb * 1e9}

  costs = [row("ar", "tpu:v5e:2x2", 81.9), row(tpu_costs.METHODS[2], "tpu:v5p:2x2x1", 8.19)]
  for c in costs:
    c.update(parser_flops_steady=0.0, xla_seconds=0.05)
  (v5e,) = [r for r in tpu_costs.projection(costs) if r["chip"] == "v5e"]
  assert v5e["ar"]["parser_ms_per_token"] == pytest.approx(100.0)  # 81.9 GB at 819 GB/s, one token
  assert v5e["ar"]["xla_ms_per_token"] == pytest.approx(50.0)
  ls = v5e[tpu_costs.METHODS[2]]
  assert ls["parser_ms_per_token"] == pytest.approx(10.0 / (14.5 * 2 / 32)) and ls["xla_ms_per_token"] is None
  assert "tpu:v5e:2x2, tpu:v5p:2x2x1" in tpu_costs.markdown([v5e])


def test_loops_once_counts_an_inner_loop_as_xla_does():
  """`tpu_costs.LoopsOnce`: the parser with the inner loop's 2 trips counted once, as XLA's cost_analysis
  counts it (micro `nested`): one layer read by the product instead of two; the slice into on-chip memory
  outside the inner loop unchanged."""
  from loopspec_experiments import tpu_costs  # noqa: PLC0415

  layer = 64 * 64 * 2
  once = tpu_costs.LoopsOnce(LOOP).analyze()
  assert once.bytes["weights"] == layer + 2 * layer and once.flops == 2 * 8 * 64 * 64


def test_attribute_names_the_steps_that_carry_a_gap():
  """A gap under 25% has no cause; an inner loop counted once pulls XLA under the parser (Huginn-0125 chain on
  v5p); on-chip reads push it over, within the XLA-like count (Huginn-0125 LoopSpec); XLA outside the bracket
  of the two counts, or a gap nothing carries, is 'rest'."""
  from loopspec_experiments import tpu_costs  # noqa: PLC0415

  def c(parser, once, like, xla):
    keys = ("parser_bytes_max", "parser_bytes_loops_once", "xla_like_bytes", "xla_bytes")
    return dict(zip(keys, (parser, once, like, xla)))

  assert tpu_costs.attribute(c(100, 100, 110, 120)) == []
  assert tpu_costs.attribute(c(270, 120, 160, 168)) == ["nested"]
  assert tpu_costs.attribute(c(19, 19, 33, 33)) == ["on_chip"]
  assert tpu_costs.attribute(c(146, 38, 110, 71)) == ["nested"]  # draft: XLA inside the bracket
  assert tpu_costs.attribute(c(100, 100, 100, 160)) == ["rest"]  # the XLA-like count does not reach XLA
  assert tpu_costs.attribute(c(100, 100, 240, 300)) == ["on_chip"]
  row = {**c(270e9, 120e9, 160e9, 168e9), "model": "m", "method": "chain", "target": "t"}
  line = tpu_costs.gaps_markdown([{**row, "parser_outside_bytes": 3e9}]).splitlines()[-1]
  assert (
      line.startswith("| m | chain | t | 270.00 | 120.00 | 3.00 | 160.00 | 168.00 | 0.62 |") and "micro nested" in line
  )


def test_earlier_costs_join_where_no_hlo_was_parsed(tmp_path):
  """`--costs`: a loop of an earlier costs.jsonl (its HLO no longer kept) joins the table, unless the HLO
  parsed now has the same loop; the result sorted by key."""
  from loopspec_experiments import tpu_costs  # noqa: PLC0415

  def c(model, xla):
    return {"model": model, "method": "ar", "target": "t", "mesh": "1x1", "batch": 1, "context": 2048, "xla_bytes": xla}

  earlier = tmp_path / "costs.jsonl"
  earlier.write_text("".join(json.dumps(r) + "\n" for r in (c("b", 1.0), c("a", 2.0))))
  got = tpu_costs.joined([c("b", 3.0)], [str(earlier)])
  assert [(r["model"], r["xla_bytes"]) for r in got] == [("a", 2.0), ("b", 3.0)]
