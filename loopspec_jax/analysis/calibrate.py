"""Measuring the host's `hardware.Hardware` terms, and one decode-loop iteration of a real model, on the host.

Every figure is the median of interleaved repeats of a small jitted program run in a `lax.fori_loop` (so the
host dispatch of one call is spread over many iterations):

  stream bandwidth  a matrix-vector product [1, K] x [K, N] over a matrix of S bytes at the model's dtype
                    (the access pattern of a decode step), at the working-set sizes asked for;
  P(M)              a product [M, K] x [K, N] at the model's own K = hidden size, N = MLP size, for each M;
  per-op overhead   a loop body of tiny dependent products (one kernel each): seconds per iteration divided
                    by the ops `hlo_cost` counts in that body (the same count the prediction multiplies).

`time_decode_loop` compiles a method's real decode loop for a model once, runs it to completion on a random
prompt that fills the context, and returns its optimised HLO (what the prediction reads) with the seconds and
tokens of each run, so the predicted and measured iterations are of one and the same program.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Dict, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax import methods
from loopspec_jax.analysis import hlo_cost
from loopspec_jax.analysis.hardware import Hardware
from loopspec_jax.decoding import common


def median_seconds(fns: Dict[str, Callable], repeats: int) -> Dict[str, float]:
  """Median wall seconds of each callable (each returns something to block on), run interleaved `repeats`
  times after one warm-up call each."""
  for f in fns.values():
    jax.block_until_ready(f())
  times = {k: [] for k in fns}
  for _ in range(repeats):
    for k, f in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(f())
      times[k].append(time.perf_counter() - t0)
  return {k: statistics.median(v) for k, v in times.items()}


def _product_loop(rows: int, k: int, n: int, dtype, iters: int):
  """A callable running `iters` products x [rows, k] @ w [k, n] (the result feeds the next x)."""
  w = jax.random.normal(jax.random.PRNGKey(k + n), (k, n), dtype) / np.sqrt(k)
  x = jax.random.normal(jax.random.PRNGKey(rows), (rows, k), dtype)

  @jax.jit
  def run(x, w):
    body = lambda _, x: jnp.tanh(x @ w)[:, :k] if n >= k else jnp.pad(jnp.tanh(x @ w), ((0, 0), (0, k - n)))
    return jax.lax.fori_loop(0, iters, body, x)

  return lambda: run(x, w)


def stream_bandwidth(sizes: Sequence[float], dtype="float32", repeats: int = 5) -> List[tuple]:
  """[(bytes, B/s)] of a matrix-vector product over a matrix of about `bytes` bytes, for each size."""
  item = jnp.dtype(dtype).itemsize
  fns, shapes = {}, {}
  for s in sizes:
    n = 1024
    k = max(int(s / (item * n)), 16)
    iters = int(max(4, min(256, 2e9 / max(s, 1.0))))
    fns[s], shapes[s] = _product_loop(1, k, n, dtype, iters), (k * n * item, iters)
  secs = median_seconds(fns, repeats)
  return [(float(shapes[s][0]), shapes[s][0] * shapes[s][1] / secs[s]) for s in sizes]


def product_throughput(rows: Sequence[int], k: int, n: int, dtype="float32", repeats: int = 5) -> List[tuple]:
  """[(M, FLOP/s)] of [M, k] x [k, n] products for each M (the weight stays in the caches when it fits)."""
  fns = {m: _product_loop(m, k, n, dtype, max(4, int(2e8 / (2 * m * k * n)))) for m in rows}
  iters = {m: max(4, int(2e8 / (2 * m * k * n))) for m in rows}
  secs = median_seconds(fns, repeats)
  return [(int(m), 2.0 * m * k * n * iters[m] / secs[m]) for m in rows]


def op_overhead(repeats: int = 7, chain: int = 16, iters: int = 2000) -> dict:
  """Seconds per kernel of a loop body of `chain` tiny dependent products ([1, 8] x [8, 8], tanh between)."""
  w = jnp.eye(8, dtype=jnp.float32)

  def f(x, w):
    def body(_, x):
      for _ in range(chain):
        x = jnp.tanh(x @ w)
      return x

    return jax.lax.fori_loop(0, iters, body, x)

  x = jnp.ones((1, 8), jnp.float32)
  run = jax.jit(f)
  ops = hlo_cost.analyze_hlo(run.lower(x, w).compile().as_text()).ops
  sec = median_seconds({"loop": lambda: run(x, w)}, repeats)["loop"]
  return {"op_overhead_s": sec / iters / max(ops, 1.0), "ops_per_iteration": ops, "iteration_s": sec / iters}


def calibrate_host(cfg, working_sets: Sequence[float], rows: Sequence[int] = (1, 2, 4, 8, 16, 32), repeats: int = 5):
  """The host's `Hardware` at model cfg's shapes: bandwidth at each working set, P(M), per-op overhead."""
  dtype = "float32" if cfg.dtype == "float32" else cfg.dtype
  bw = stream_bandwidth(sorted(set(float(s) for s in working_sets)), dtype, repeats)
  prod = product_throughput(rows, cfg.hidden_size, cfg.intermediate_size, dtype, repeats)
  over = op_overhead(repeats)
  return Hardware(
      label="host",
      bandwidth=min(b for _, b in bw),
      peak_flops=max(f for _, f in prod),
      op_overhead_s=over["op_overhead_s"],
      flops_at_rows=tuple(prod),
      bandwidth_at_bytes=tuple(bw),
      source=f"measured on this host (per-op: {over['ops_per_iteration']:.0f} ops, {over['iteration_s']*1e6:.1f} us/iter)",
  )


# ---------------------------------------------------------------------------------------------------
# One decode loop, compiled once, its HLO and its measured runs
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class LoopRun:
  """A method's decode loop on a model, compiled once: `hlo` (what the prediction reads), kv_dims and
  slot_bytes (what `hlo_cost` needs), and `run()` -> (seconds of the loop, iterations, tokens)."""

  method: methods.Method
  hlo: str
  kv_dims: list
  slot_bytes: float
  run: Callable


def _dynamic_kw(kw: dict) -> dict:
  """The traced keyword arguments of a decoder's loop / init (array pytrees, e.g. a drafter's parameters)."""
  out = {}
  for k, v in kw.items():
    leaves = jax.tree_util.tree_leaves(v)
    if leaves and all(isinstance(x, (jax.Array, np.ndarray)) for x in leaves):
      out[k] = v
  return out


def time_decode_loop(model, method, *, context: int, new_tokens: int, greedy: bool, seed: int = 0) -> LoopRun:
  """Compiles `method`'s loop for `model` at a cache of `context` positions, for one request whose random
  prompt of context - new_tokens tokens fills it; `run()` decodes `new_tokens` tokens once."""
  from loopspec_jax.analysis import cost  # cost imports hardware / hlo_cost; keep this module light

  cfg = model.config.replace(max_len=context)
  m = methods.parse(method)
  m.validate(cfg)
  m.check_target(model)
  dec = m.make_decoder(cfg, greedy=greedy, random_init=False)
  rng = np.random.default_rng(seed)
  prompt = [int(t) for t in rng.integers(0, cfg.vocab_size, context - new_tokens)]
  tp, total = common.buckets([len(prompt)], new_tokens, cfg)
  prompt_arr, len_arr = common.batch_prompts([prompt], tp)
  sp = common.make_sampling_params(1, new_tokens, 0.0 if greedy else 1.0, 0, 1.0, seed, None)

  def fresh_state():
    cache, tokens = common.prefill_for(
        dec, model.params, prompt_arr, len_arr, sp, cfg=cfg, total=total, random_init=False
    )
    return dec.init(cache, tokens, len_arr, sp, **dec.init_kw)

  state = fresh_state()
  compiled = dec.loop.lower(model.params, state, sp, **dec.loop_kw).compile()
  dyn = _dynamic_kw(dec.loop_kw)

  def run():
    st = fresh_state()
    jax.block_until_ready(st)
    t0 = time.perf_counter()
    out = compiled(model.params, st, sp, **dyn)
    jax.block_until_ready(out.tokens)
    seconds = time.perf_counter() - t0
    counts = dec.stats(out)
    return seconds, int(counts.totals["iterations"]), int(sum(counts.per_request["tokens"]))

  hlo = compiled.as_text()
  return LoopRun(m, hlo, cost.kv_leaf_dims(state), cost.slot_bytes(cfg, 1, total + dec.extra_positions), run)


def measure_runs(loops: Dict[str, LoopRun], repeats: int) -> Dict[str, dict]:
  """Runs every loop `repeats` times, interleaved (after one warm-up each); per loop the median seconds per
  iteration and the tokens per iteration of the runs."""
  for lr in loops.values():
    lr.run()
  per_iter = {k: [] for k in loops}
  tpi = {k: [] for k in loops}
  for _ in range(repeats):
    for k, lr in loops.items():
      sec, iters, toks = lr.run()
      per_iter[k].append(sec / max(iters, 1))
      tpi[k].append(toks / max(iters, 1))
  return {
      k: {"iteration_s": statistics.median(per_iter[k]), "tokens_per_iteration": statistics.median(tpi[k])}
      for k in loops
  }
