"""Measuring the host's `hardware.Hardware` terms, and one decode-loop iteration of a real model, on the host.

Every figure is the median of interleaved repeats of a small jitted program run in a `lax.fori_loop` (so the
host dispatch of one call is spread over many iterations):

  stream bandwidth  a pass of matrix-vector products [1, K] x [K, N] over distinct matrices of the model's
                    K = hidden size, N = MLP size totalling S bytes at the model's dtype (the access pattern
                    of a decode step), at the working-set sizes asked for: cache-resident to DRAM;
  P(M)              a product [M, K] x [K, N] at the model's own K = hidden size, N = MLP size, for each M;
  per-op overhead   a loop body of tiny dependent products (one kernel each): seconds per iteration divided
                    by the ops `hlo_cost` counts in that body (the same count the prediction multiplies);
  transcendentals   a loop body of SiLU / exp(-x^2) / tanh over [16, N] (a softmax's or an MLP's vector work):
                    transcendental elements (as `hlo_cost` counts them in that body) per second;
  product shapes    every distinct product of a loop body (`hlo_cost.dot_signature`), timed at that shape
                    with its operands in the caches (`dot_seconds`; the bytes side stays BW(S)).

`host_fns` gives every microbenchmark as a callable so the calibration can run them interleaved with the
decode loops it predicts (`measure_runs(..., host=)`), under the same load.

`time_decode_loop` compiles a method's real decode loop for a model once, runs it to completion on a random
prompt that fills the context, and returns its optimised HLO (what the prediction reads) with the seconds and
tokens of each run, so the predicted and measured iterations are of one and the same program.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax import methods
from loopspec_jax.analysis import hlo_cost
from loopspec_jax.analysis.hardware import Hardware
from loopspec_jax.decoding import common

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = {"now": time.perf_counter}


def set_clock(name: str):
  """Which clock every timing here reads: "wall" (perf_counter) or "cpu" (process CPU time, all threads: on a
  host shared with other jobs, the time this process ran rather than the time it waited for a core). "cpu"
  is only sound for calls much longer than a scheduler tick: Linux folds a thread's running time into the
  process clock at a tick or a context switch, so the work XLA's worker threads do in a sub-millisecond call
  may not be counted by the time the call returns (measured here: product timings of 200-2200 GFLOP/s on a
  host that peaks near 190)."""
  if name not in CLOCKS:
    raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {name!r}")
  _clock["now"] = CLOCKS[name]


def _now() -> float:
  return _clock["now"]()


def median_seconds(fns: Dict[str, Callable], repeats: int) -> Dict[str, float]:
  """Median wall seconds of each callable (each returns something to block on), run interleaved `repeats`
  times after one warm-up call each."""
  for f in fns.values():
    jax.block_until_ready(f())
  times = {k: [] for k in fns}
  for _ in range(repeats):
    for k, f in fns.items():
      t0 = _now()
      jax.block_until_ready(f())
      times[k].append(_now() - t0)
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


def _matvec_pass(k: int, n: int, count: int, dtype, iters: int):
  """A callable running `iters` passes of `count` matrix-vector products [1, k] x [k, n], each over its own
  matrix (a decode step's access pattern: every weight read once per pass, in order)."""
  ws = [jax.random.normal(jax.random.PRNGKey(i), (k, n), dtype) / np.sqrt(k) for i in range(count)]
  x = jnp.ones((1, k), dtype)

  @jax.jit
  def run(x, ws):
    def body(_, x):
      for w in ws:
        y = jnp.tanh(x @ w)
        x = y[:, :k] if n >= k else jnp.pad(y, ((0, 0), (0, k - n)))
      return x

    return jax.lax.fori_loop(0, iters, body, x)

  return lambda: run(x, ws)


def _bandwidth_fn(s: float, k: int, n: int, dtype, max_count: int = 64):
  """(callable, bytes moved per call) of passes over distinct [k, n] matrices totalling about s bytes. Past
  `max_count` matrices the matrices widen (n grows) instead of multiplying, to bound the compile."""
  item = jnp.dtype(dtype).itemsize
  count = int(max(1, min(max_count, round(s / (item * k * n)))))
  width = int(max(n, round(s / (item * k * count))))
  nbytes = float(count * k * width * item)
  iters = int(max(3, min(256, 2e9 / nbytes)))
  return _matvec_pass(k, width, count, dtype, iters), nbytes, nbytes * iters


def stream_bandwidth(sizes: Sequence[float], dtype="float32", repeats: int = 5, k: int = 1024, n: int = 1024):
  """[(bytes, B/s)] of passes of matrix-vector products over distinct [k, n] matrices (the model's own
  shape) totalling about `bytes`, for each size: cache-resident at small sizes, DRAM at large ones."""
  fns = {s: _bandwidth_fn(s, k, n, dtype) for s in sizes}
  secs = median_seconds({s: f[0] for s, f in fns.items()}, repeats)
  return [(fns[s][1], fns[s][2] / secs[s]) for s in sizes]


def _op_loop(chain: int = 16, iters: int = 2000):
  """(callable, ops per call): a loop body of `chain` tiny dependent products ([1, 8] x [8, 8], tanh between)."""
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
  return (lambda: run(x, w)), ops * iters


def _transcendental_loop(rows: int, n: int, iters: int = 200):
  """(callable, transcendental elements per call): a loop body of elementwise transcendentals over [rows, n]
  (SiLU, exp(-x^2), tanh: the vector work of an MLP, a softmax, a gate), counted by `hlo_cost` in its body."""

  def f(x):
    def body(_, x):
      for _ in range(2):
        x = jnp.tanh(jnp.exp(-x * x) * jax.nn.silu(x) + 0.5)
      return x

    return jax.lax.fori_loop(0, iters, body, x)

  x = jnp.linspace(-1.0, 1.0, rows * n, dtype=jnp.float32).reshape(rows, n)
  run = jax.jit(f)
  elements = hlo_cost.analyze_hlo(run.lower(x).compile().as_text()).transcendentals
  return (lambda: run(x)), elements * iters


def parse_signature(sig: str):
  """(lhs (dtype, dims), rhs (dtype, dims), dimension_numbers) of a `hlo_cost.dot_signature`."""
  shapes, *dn = sig.split(";")
  operands = []
  for part in shapes.split("x"):
    dt, dims = part.split("[")
    operands.append((dt, tuple(int(d) for d in dims.rstrip("]").split(",") if d)))
  nums = [tuple(int(d) for d in f.split("=")[1].split(",") if d) for f in dn]
  return operands[0], operands[1], ((nums[0], nums[1]), (nums[2], nums[3]))


_JNP_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "s32": jnp.int32, "f64": jnp.float64}


MAX_COPIES = 32  # distinct copies of a timed product's larger operand (bounds the compile)
MAX_COPY_BYTES = 64e6  # and their bytes (twice this host's L3: the DRAM regime)


def signature_flops(sig: str) -> float:
  """FLOPs of one product of a `hlo_cost.dot_signature`: 2 x batch x rows x columns x contraction."""
  (_, ldims), (_, rdims), dn = parse_signature(sig)
  flops = 2.0 * float(np.prod(ldims)) * float(np.prod(rdims)) / max(float(np.prod([ldims[i] for i in dn[0][0]])), 1)
  return flops / max(float(np.prod([ldims[i] for i in dn[1][0]])), 1.0)


def _dot_fn(sig: str, footprint: float = 0.0, unroll: int = 4, pool: Optional[dict] = None):
  """(callable, products per call): dependent products of this very shape in a loop (the smaller operand
  perturbed by the previous result so nothing is hoisted). The larger operand (the weight, or the KV cache of
  an attention product) cycles through distinct copies totalling about `footprint` bytes, so that it comes
  from the cache level it comes from in the decode loop (0: one copy, in the caches). `pool`: copies shared
  between the products of one calibration (keyed by shape, dtype and count: a model's many products of one
  weight shape hold one set of copies, not one each)."""
  (ldt, ldims), (rdt, rdims), dn = parse_signature(sig)
  lhs = jnp.ones(ldims, _JNP_DTYPES.get(ldt, jnp.float32))
  rhs = jax.random.normal(jax.random.PRNGKey(1), rdims, jnp.float32).astype(_JNP_DTYPES.get(rdt, jnp.float32))
  flops = signature_flops(sig)
  small_lhs = lhs.size <= rhs.size  # perturb the smaller operand: its update is not part of the product
  big = rhs if small_lhs else lhs
  nbytes = float(big.size * big.dtype.itemsize)
  copies = int(max(1, min(MAX_COPIES, round(footprint / nbytes), MAX_COPY_BYTES // max(nbytes, 1.0))))
  pool = {} if pool is None else pool
  key = (tuple(big.shape), str(big.dtype), copies)
  if key not in pool:
    pool[key] = [big] + [big + jnp.asarray(1e-3 * i, big.dtype) for i in range(1, copies)]
  bigs = pool[key]
  per_body = max(unroll, copies)
  iters = int(max(8, min(1000, 5e7 / max(flops * per_body, 1.0))))

  @jax.jit
  def run(small, bigs):
    def body(_, c):
      for i in range(per_body):
        a = small + c.astype(small.dtype)
        x, y = (a, bigs[i % copies]) if small_lhs else (bigs[i % copies], a)
        c = jax.lax.dot_general(x, y, dn).reshape(-1)[0].astype(jnp.float32) * 1e-30
      return c

    return jax.lax.fori_loop(0, iters, body, jnp.float32(0))

  small = lhs if small_lhs else rhs
  return (lambda: run(small, bigs)), iters * per_body


def dot_footprint(sig: str, working_sets: dict) -> float:
  """The bytes a product's larger operand cycles through in the loop: a batched product (attention over
  the cache) the whole working set (`kv`), any other (a weight) the weights re-read every step."""
  batched = "lb=;" not in sig
  return float(working_sets.get("kv" if batched else "weights", 0.0))


def host_fns(cfg, working_sets, rows: Sequence[int], signatures: Sequence[str] = ()) -> tuple:
  """(callables, work per call) of every host microbenchmark at cfg's shapes, keyed ("bw", bytes),
  ("flops", M), ("op",), ("trans",), ("dot", signature): what `hardware_from` turns into a `Hardware`.
  working_sets: bytes, or {category: bytes} (then products are timed at their footprint, `dot_footprint`)."""
  by_cat = dict(working_sets) if isinstance(working_sets, dict) else {}
  working_sets = list(by_cat.values()) if by_cat else list(working_sets)
  dtype = "float32" if cfg.dtype == "float32" else cfg.dtype
  k, n = cfg.hidden_size, cfg.intermediate_size
  fns, work = {}, {}
  for s in sorted(set(float(s) for s in working_sets)):
    fn, nbytes, moved = _bandwidth_fn(s, k, n, dtype)
    fns[("bw", nbytes)], work[("bw", nbytes)] = fn, moved
  for m in rows:
    iters = max(4, int(2e8 / (2 * m * k * n)))
    fns[("flops", int(m))], work[("flops", int(m))] = _product_loop(m, k, n, dtype, iters), 2.0 * m * k * n * iters
  fns[("op",)], work[("op",)] = _op_loop()
  fns[("trans",)], work[("trans",)] = _transcendental_loop(16, n)
  pool = {}
  for sig in signatures:
    fns[("dot", sig)], work[("dot", sig)] = _dot_fn(sig, dot_footprint(sig, by_cat), pool=pool)
  return fns, work


def hardware_from(secs: dict, work: dict) -> Hardware:
  """The `Hardware` of the medians `secs` of `host_fns`'s callables (same keys)."""
  rate = {key: work[key] / secs[key] for key in work}
  bw = tuple(sorted((key[1], r) for key, r in rate.items() if key[0] == "bw"))
  prod = tuple(sorted((key[1], r) for key, r in rate.items() if key[0] == "flops"))
  dots = tuple(sorted((key[1], 1.0 / r) for key, r in rate.items() if key[0] == "dot"))
  over = 1.0 / rate[("op",)]
  # A product timed faster than 1.5x the best rate of the M sweep is a timing artefact (e.g. the "cpu" clock
  # on sub-tick calls, `set_clock`): counted in `source` so a table built on it says so.
  implausible = sum(signature_flops(sig) / s > 1.5 * max(f for _, f in prod) for sig, s in dots)
  return Hardware(
      label="host",
      bandwidth=min(b for _, b in bw),
      peak_flops=max(f for _, f in prod),
      op_overhead_s=over,
      flops_at_rows=prod,
      bandwidth_at_bytes=bw,
      dot_seconds=dots,
      transcendental_rate=rate.get(("trans",), 0.0),
      source=(
          f"measured on this host ({len(dots)} product shapes timed, {implausible} faster than 1.5x the"
          f" M sweep's best rate; per-op {over * 1e9:.0f} ns)"
      ),
  )


def calibrate_host(cfg, working_sets: Sequence[float], rows: Sequence[int] = (1, 2, 4, 8, 16, 32), repeats: int = 5):
  """The host's `Hardware` at model cfg's shapes: bandwidth at each working set, P(M), per-op overhead."""
  fns, work = host_fns(cfg, working_sets, rows)
  return hardware_from(median_seconds(fns, repeats), work)


# ---------------------------------------------------------------------------------------------------
# One decode loop, compiled once, its HLO and its measured runs
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class LoopRun:
  """A method's decode loop on a model, compiled once: `hlo` (what the prediction reads), kv_dims and
  slot_bytes (what `hlo_cost` needs), and `run()` -> (seconds of the loop, iterations, tokens, mean width).
  `widths`: the lane-column widths of a LoopSpec tick's `lax.switch` (`PipelineShape.ladder`; () for a loop
  without one), and the mean width is the columns its ticks computed on average (None without a ladder):
  which branch runs is a property of the decoding trajectory, measured like tokens per iteration."""

  method: methods.Method
  hlo: str
  kv_dims: list
  slot_bytes: float
  run: Callable
  widths: tuple = ()


def branch_mix(widths: tuple, mean_width: Optional[float]):
  """hlo_cost's branch weights for a ladder `widths` (ascending) run at `mean_width` columns per tick on
  average: the two rungs around the mean, linearly (exact for a two-rung ladder; for more rungs the
  narrowest mix with that mean). "max" (the widest branch) when unknown or without a ladder."""
  if len(widths) < 2 or mean_width is None:
    return "max"
  x = min(max(float(mean_width), widths[0]), widths[-1])
  hi = next(i for i, w in enumerate(widths) if w >= x)
  weights = [0.0] * len(widths)
  if hi == 0 or widths[hi] == x:
    weights[hi] = 1.0
  else:
    t = (x - widths[hi - 1]) / (widths[hi] - widths[hi - 1])
    weights[hi - 1], weights[hi] = 1.0 - t, t
  return tuple(weights)


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
    t0 = _now()
    out = compiled(model.params, st, sp, **dyn)
    jax.block_until_ready(out.tokens)
    seconds = _now() - t0
    counts = dec.stats(out)
    width = None
    if widths:  # one request: each tick's switch ran at its own ladder width
      width = float(sum(counts.per_request["cols_sum"])) / max(float(sum(counts.per_request["ticks"])), 1.0)
    return seconds, int(counts.totals["iterations"]), int(sum(counts.per_request["tokens"])), width

  shape = dec.loop_kw.get("shape")
  widths = tuple(shape.ladder) if dec.name == "loopspec" and shape.dynamic and len(shape.ladder) > 1 else ()
  hlo = compiled.as_text()
  slots = cost.slot_bytes(cfg, 1, total + dec.extra_positions)
  return LoopRun(m, hlo, cost.kv_leaf_dims(state), slots, run, widths)


def measure_runs(loops: Dict[str, LoopRun], repeats: int, host: Optional[Dict] = None, stat: str = "median") -> tuple:
  """Runs every loop `repeats` times, interleaved (after one warm-up each) with the callables of `host`
  (microbenchmarks, so that the host's load weighs on both alike); per loop the median seconds per iteration
  and the tokens per iteration of the runs, and the median seconds of each host callable. stat="min": the
  fastest run of each instead (on a host shared with other jobs, the least disturbed one)."""
  if stat not in ("median", "min"):
    raise ValueError(f"stat must be 'median' or 'min', got {stat!r}")
  pick = statistics.median if stat == "median" else min
  host = host or {}
  for lr in loops.values():
    lr.run()
  for f in host.values():
    jax.block_until_ready(f())
  per_iter = {k: [] for k in loops}
  tpi = {k: [] for k in loops}
  width = {k: [] for k in loops}
  host_t = {k: [] for k in host}
  for _ in range(repeats):
    for k, f in host.items():
      t0 = _now()
      jax.block_until_ready(f())
      host_t[k].append(_now() - t0)
    for k, lr in loops.items():
      sec, iters, toks, w = lr.run()
      per_iter[k].append(sec / max(iters, 1))
      tpi[k].append(toks / max(iters, 1))
      if w is not None:
        width[k].append(w)
  runs = {
      k: {
          "iteration_s": pick(per_iter[k]),
          "iteration_s_median": statistics.median(per_iter[k]),
          "iteration_s_all": per_iter[k],
          "tokens_per_iteration": statistics.median(tpi[k]),
          "mean_width": statistics.median(width[k]) if width[k] else None,
      }
      for k in loops
  }
  return runs, {k: pick(v) for k, v in host_t.items()}
