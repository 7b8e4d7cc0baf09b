"""A device as the cost model sees it, and the time of one decode-loop iteration on it.

One iteration's HLO cost (`hlo_cost.StepCost`: per kernel its bytes and its products' flops by rows M) becomes
seconds as a sum over kernels, since the kernels of one loop body run one after the other:

    t = sum_k max(sum_c bytes_k,c / BW(S_c),  sum_M flops_k,M / P(M),  trans_k / V)  +  ops x per-op overhead

  BW(S)   stream bandwidth at the working set S: a model whose bytes stay in the caches streams faster than
          one that does not (`bandwidth_at_bytes`, measured; else `bandwidth`). S may differ per byte
          category (weights / kv / copies / other): a tiny looped model re-reads its core weights R times
          per token from the caches while its KV cache streams once from further out.
  P(M)    product throughput at M rows (the skinny extent, `hlo.dot_rows`): a 1-row product runs far below
          peak on a CPU (`flops_at_rows`, measured; else `peak_flops` at every M). Where the host timed a
          product of that very shape (`dot_seconds`, keyed by `hlo_cost.dot_signature`: the calibration times
          every product shape of the loop body), that time replaces flops / P(M).
  V       transcendental elements per second (exp, tanh, logistic, rsqrt, divide, ...: `hlo_cost`
          `transcendentals`): a CPU computes a softmax or a SiLU over M rows at ~1 element per ns, far below
          its stream bandwidth (`transcendental_rate`, measured; 0: not a bound, as on an accelerator whose
          special-function units keep up with its memory).
  ops     every kernel of the loop body (`StepCost.ops`); the per-op overhead is a kernel launch on a GPU
          (less with CUDA graphs / XLA command buffers), the loop's own dispatch cost on a CPU.

`mode="roofline"` gives the classic max(flops / peak, bytes / BW) + ops x overhead of the whole iteration
(the cost report's projection before calibration). A `Hardware` comes from an accelerator's public figures
(`from_accelerator`, configs/accelerators.py) or from measuring the host (`analysis/calibrate.py`); the same
formula serves both, so the CPU validation checks the formula that projects onto H100 / H200 / TPUs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Mapping, Optional, Sequence, Tuple

from loopspec_jax.analysis.hlo import CATEGORIES
from loopspec_jax.analysis.hlo_cost import StepCost


def _interp_log(points: Sequence[Tuple[float, float]], x: float) -> float:
  """Piecewise-linear interpolation in log(x) of (x, y) points sorted by x; clamped at both ends."""
  pts = sorted(points)
  if x <= pts[0][0]:
    return pts[0][1]
  if x >= pts[-1][0]:
    return pts[-1][1]
  for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
    if x0 <= x <= x1:
      w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
      return y0 + w * (y1 - y0)
  return pts[-1][1]


@dataclasses.dataclass(frozen=True)
class Hardware:
  """Per-second figures of one device. Bandwidth in B/s, throughput in FLOP/s, overhead in s per kernel."""

  label: str
  bandwidth: float
  peak_flops: float
  op_overhead_s: float = 0.0
  flops_at_rows: Tuple[Tuple[int, float], ...] = ()  # measured (rows M, FLOP/s); empty: peak at any M
  bandwidth_at_bytes: Tuple[Tuple[float, float], ...] = ()  # measured (working-set bytes, B/s); empty: bandwidth
  dot_seconds: Tuple[Tuple[str, float], ...] = ()  # measured (`hlo_cost.dot_signature`, s); else flops / P(M)
  transcendental_rate: float = 0.0  # transcendental elements per second; 0: not a bound
  source: str = ""

  def throughput(self, rows: int) -> float:
    """FLOP/s of a product of `rows` rows."""
    return _interp_log(self.flops_at_rows, rows) if self.flops_at_rows else self.peak_flops

  def stream_bandwidth(self, working_set: Optional[float] = None) -> float:
    """B/s streaming a working set of that many bytes (None: the memory bandwidth)."""
    if working_set is None or not self.bandwidth_at_bytes:
      return self.bandwidth
    return _interp_log(self.bandwidth_at_bytes, working_set)

  def with_overhead(self, op_overhead_s: float) -> "Hardware":
    return dataclasses.replace(self, op_overhead_s=float(op_overhead_s))

  def _bandwidths(self, working_set) -> Dict[str, float]:
    """B/s per byte category (`hlo.CATEGORIES`): one working set for all, or a {category: bytes} mapping
    (e.g. weights at the weights' bytes, kv at the whole working set; a missing category: the smallest)."""
    if not isinstance(working_set, Mapping):
      return {c: self.stream_bandwidth(working_set) for c in CATEGORIES}
    smallest = min(working_set.values()) if working_set else None
    return {c: self.stream_bandwidth(working_set.get(c, smallest)) for c in CATEGORIES}

  def _compute_seconds(self, cost: StepCost, kernel: dict) -> float:
    """A kernel's products: each at its measured time where its shape was timed, else flops / P(rows)."""
    timed = dict(self.dot_seconds)
    if not timed or not kernel["dots"]:
      return sum(f / self.throughput(m) for m, f in kernel["flops"].items())
    total = 0.0
    for sig, n in kernel["dots"].items():
      flops, rows = cost.dot_shapes[sig]
      total += n * (timed[sig] if sig in timed else flops / self.throughput(rows))
    return total

  def terms(self, cost: StepCost, working_set=None) -> dict:
    """The iteration's time split into its terms (seconds): memory-bound kernels, product-bound kernels,
    transcendental-bound kernels (vector), per-op overhead, and the total (`step_seconds`). working_set:
    bytes, or bytes per category."""
    bws = self._bandwidths(working_set)
    out = {"memory_s": 0.0, "compute_s": 0.0, "vector_s": 0.0}
    for k in cost.kernels().values():
      t = {
          "memory_s": sum(b / bws[c] for c, b in k["by_category"].items()),
          "compute_s": self._compute_seconds(cost, k),
          "vector_s": k.get("transcendentals", 0.0) / self.transcendental_rate if self.transcendental_rate else 0.0,
      }
      bound = max(t, key=t.get)
      out[bound] += t[bound]
    out["overhead_s"] = cost.ops * self.op_overhead_s
    out["total_s"] = sum(out.values())
    return out

  def step_seconds(self, cost: StepCost, working_set=None, mode: str = "kernels") -> float:
    """Seconds of one iteration of the loop whose cost is `cost` (module docstring; mode kernels | roofline)."""
    if mode == "roofline":
      bws = self._bandwidths(working_set)
      t_mem = sum(b / bws[c] for c, b in cost.bytes.items())
      bound = max(cost.flops / self.peak_flops, t_mem)
      return bound + cost.ops * self.op_overhead_s
    if mode != "kernels":
      raise ValueError(f"mode must be 'kernels' or 'roofline', got {mode!r}")
    return self.terms(cost, working_set)["total_s"]

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "Hardware":
    d = dict(d)
    d["flops_at_rows"] = tuple((int(m), float(f)) for m, f in d.get("flops_at_rows", ()))
    d["bandwidth_at_bytes"] = tuple((float(s), float(b)) for s, b in d.get("bandwidth_at_bytes", ()))
    d["dot_seconds"] = tuple((str(k), float(t)) for k, t in d.get("dot_seconds", ()))
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def from_accelerator(name: str, figures: dict, op_overhead_s: Optional[float] = None) -> Hardware:
  """A `Hardware` from a configs/accelerators.py entry (peak_flops, hbm_bandwidth, op_overhead_s, sources)."""
  over = figures.get("op_overhead_s", 0.0) if op_overhead_s is None else op_overhead_s
  return Hardware(
      label=figures.get("label", name),
      bandwidth=float(figures["hbm_bandwidth"]),
      peak_flops=float(figures["peak_flops"]),
      op_overhead_s=float(over),
      source=str(figures.get("overhead_source", "")),
  )
