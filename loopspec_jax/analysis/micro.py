"""Programs of known HBM traffic, compiled for a target: what XLA's `cost_analysis()` and the HLO parser
(`hlo_cost.py`) each count for the constructs a decode loop is made of.

Each program is a `lax.while_loop` of `TRIPS` iterations (the decode loop's shape) whose body does one thing
of known traffic per iteration, bf16 throughout:

  dynamic-slice   one cache slot [T, D] read (and reduced) out of a cache [S, T, D] at the loop index
  dus             one row [1, D] written into a loop-carried, donated buffer [S * T, D] at the loop index
  dus-kept        the same, the buffer not donated: the program copies it before the loop
  scatter         the same row written by a scatter (`x.at[idx].set`)
  switch          a `lax.switch` on the loop index parity between a cheap matvec (weight [E, E]) and an
                  expensive one (weight [E, F]): a schedule runs each branch half the time
  nested          an inner `fori_loop` of INNER matvecs (weight [E, F]) per outer iteration
  reuse           4 unrolled passes over a stack of 6 [E, E] layers (a recurrence): the TPU compiler copies
                  the stack into on-chip memory (copy-start) while the first pass reads it from HBM, and the
                  later passes read it on chip: 2 x the stack from HBM, not 4 x
  matvec          one matvec (weight [E, F]) per iteration: the reference

Known figures are per outer iteration: the bytes a TPU must move from HBM (every weight / slot read once,
every update written once) and 2 flops per multiply-add. A row (`measure`): those beside XLA's bytes,
flops and optimal_seconds for the whole program and the parser's one iteration (and, for the switch, its
branch policies: "max", "mean").
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import jax
import jax.numpy as jnp

from loopspec_jax.analysis import aot, hlo
from loopspec_jax.analysis.hlo_cost import analyze_hlo

TRIPS = 10
INNER = 4
REUSE = (6, 4)  # (layers, passes) of the `reuse` program
BF16 = 2.0


def _loop(body: Callable, carry: tuple):
  """A while loop of TRIPS iterations over (i, *carry); body(i, carry) -> carry."""
  step = lambda c: (c[0] + 1,) + tuple(body(c[0], c[1:]))
  return jax.lax.while_loop(lambda c: c[0] < TRIPS, step, (0,) + tuple(carry))[1:]


def programs(e: int = 2048, f: int = 8192, t: int = 4096, d: int = 1024, s: int = 16) -> Dict[str, tuple]:
  """name -> (function, argument shapes, known bytes per iteration, known flops per iteration, what)."""
  mv = lambda x, w: (x @ w).reshape(1, -1, e).sum(1).astype(x.dtype)  # every column of w read
  cheap, dear = e * e * BF16, e * f * BF16

  def dynamic_slice(cache, acc):
    return _loop(lambda i, c: (c[0] + jax.lax.dynamic_index_in_dim(cache, i % s, 0, False).sum(0),), (acc,))

  def dus(buf, row):  # buf [S * T, D]: too large for on-chip memory (v5e: 128 MiB), so it stays in HBM
    return _loop(lambda i, c: (jax.lax.dynamic_update_slice(c[0], c[1] + 1, (i, 0)), c[1] + 1), (buf, row))

  def scatter(buf, row):  # the same row written by a scatter (`x.at[idx].set`, how the caches are written)
    return _loop(lambda i, c: (c[0].at[jnp.stack([i])].set(c[1] + 1), c[1] + 1), (buf, row))

  def switch(x, w1, w2):
    br = (lambda x: mv(x, w1), lambda x: mv(x, w2))
    return _loop(lambda i, c: (jax.lax.switch(i % 2, br, c[0]),), (x,))

  def nested(x, w):
    return _loop(lambda i, c: (jax.lax.fori_loop(0, INNER, lambda j, y: mv(y, w), c[0]),), (x,))

  def reuse(x, stack):  # R passes over a stack of L [E, E] layers, unrolled: the compiler may keep it on chip
    def passes(y):
      for _ in range(REUSE[1]):
        for l in range(REUSE[0]):
          y = (y @ stack[l]).astype(y.dtype)
      return y

    return _loop(lambda i, c: (passes(c[0]),), (x,))

  def matvec(x, w):
    return _loop(lambda i, c: (mv(c[0], w),), (x,))

  return {
      "dynamic-slice": (
          dynamic_slice,
          ((s, t, d), (d,)),
          t * d * BF16,
          0.0,
          f"one slot [{t},{d}] of a cache [{s},{t},{d}]",
      ),
      "dus": (dus, ((s * t, d), (1, d)), d * BF16, 0.0, f"one row [1,{d}] into a donated [{s * t},{d}]"),
      "dus-kept": (dus, ((s * t, d), (1, d)), d * BF16, 0.0, f"as dus, the buffer not donated (copied first)"),
      "scatter": (
          scatter,
          ((s * t, d), (1, d)),
          d * BF16,
          0.0,
          f"one row [1,{d}] scattered into a donated [{s * t},{d}]",
      ),
      "switch": (
          switch,
          ((1, e), (e, e), (e, f)),
          (cheap + dear) / 2,
          e * (e + f),
          "switch: [1,E]x[E,E] or [1,E]x[E,F]",
      ),
      "nested": (nested, ((1, e), (e, f)), INNER * dear, INNER * 2.0 * e * f, f"inner fori_loop of {INNER} matvecs"),
      "reuse": (
          reuse,
          ((1, e), (REUSE[0], e, e)),
          REUSE[0] * e * e * BF16 * 2,
          REUSE[0] * REUSE[1] * 2.0 * e * e,
          f"{REUSE[1]} passes over {REUSE[0]} [E,E] layers: the stack copied on chip once while the first pass reads HBM",
      ),
      "matvec": (matvec, ((1, e), (e, f)), dear, 2.0 * e * f, f"one [1,{e}]x[{e},{f}] matvec"),
  }


DONATED = ("dus", "scatter")  # programs whose first argument is donated, as a decode loop donates its state


def compile_program(fn: Callable, shapes: Tuple[tuple, ...], target: str = "tpu:v5e", donate: bool = False):
  """fn compiled for one device of the target from bf16 abstract arguments (the first donated)."""
  tgt = aot.parse_target(target)
  sh = jax.sharding.NamedSharding(aot.target_mesh(tgt), jax.sharding.PartitionSpec())
  args = [jax.ShapeDtypeStruct(x, jnp.bfloat16, sharding=sh) for x in shapes]
  return aot.compile_only(jax.jit(fn, donate_argnums=(0,) if donate else ()).lower(*args))


def measure(target: str = "tpu:v5e", **sizes) -> List[dict]:
  """One row per program: known bytes / flops per iteration, XLA's whole-program figures and the parser's
  one iteration (the switch also under branch="mean": the schedule's half-and-half)."""
  rows = []
  for name, (fn, shapes, known_bytes, known_flops, what) in programs(**sizes).items():
    compiled = compile_program(fn, shapes, target, donate=name in DONATED)
    xla = aot.xla_cost_row(compiled)
    hlo = compiled.as_text()
    step = analyze_hlo(hlo)
    row = {
        "program": name,
        "what": what,
        "target": target,
        "trips": TRIPS,
        "known_bytes_per_iteration": known_bytes,
        "known_flops_per_iteration": known_flops,
        "xla_bytes": xla.get("bytes accessed"),
        "xla_flops": xla.get("flops"),
        "xla_optimal_seconds": xla.get("optimal_seconds"),
        "parser_bytes": step.total_bytes,
        "parser_flops": step.flops,
        "parser_top": [[w, c, b] for w, c, b in step.top_items(4)],
    }
    if name == "switch":
      mean = analyze_hlo(hlo, branch="mean")
      row.update(parser_bytes_mean=mean.total_bytes, parser_flops_mean=mean.flops)
    rows.append(row)
  return rows


def xla_like_bytes(hlo_text: str) -> float:
  """XLA's convention as read from its figures: every op of the program (each computation once: the entry,
  a while body once, a conditional at its largest branch, as XLA takes each figure at its largest branch)
  reads its operands whole (a fusion's sliced operand: the slice) and writes its output, in whatever memory
  space they live; the async moves' done halves are free. Reproduces XLA's bytes accessed within 1% for
  Raven-Llama AR on v5e, within 25% for the AR and chain loops, not the LoopSpec ticks on v5e (README of
  results/tpu_aot/2026-12-07-costs): a model of XLA's count, not of the traffic."""
  comps, entry = hlo.parse_hlo(hlo_text)

  def walk(name: str) -> float:
    comp, total = comps[name], 0.0
    for ins in comp.instrs.values():
      if ins.opcode in hlo.FREE_OPS or ins.opcode in ("copy-done", "slice-done"):
        continue
      if ins.opcode in ("while", "call"):
        total += walk(ins.attr("body") or ins.attr("to_apply"))
        continue
      if ins.opcode == "conditional":
        total += max(walk(b) for b in ins.attr_list("branch_computations"))
        continue
      fused = comps.get(ins.attr("calls")) if ins.opcode == "fusion" else None
      for k, o in enumerate(ins.operands):
        src = comp.instrs.get(o)
        sliced = hlo.sliced_elements(fused, fused.params[k], comps) if fused and k in fused.params else None
        if src is not None:
          total += sliced[0] * src.nbytes() / max(src.elements(), 1) if sliced else src.nbytes()
      moved = comp.instrs[ins.operands[0]].nbytes() if ins.opcode in ("copy-start", "slice-start") else 0.0
      total += ins.nbytes() - moved
    return total

  return walk(entry)
