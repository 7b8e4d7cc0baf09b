"""`method="auto"`: pick the fastest exact decoder for a model, batch, context and device.

Every candidate is a registered lossless method (AR, chain at (d1, gamma), LoopSpec at (d1, d2) or (d1, -)), so
decoding is exact whatever the planner picks; only speed depends on the choice. For each candidate it predicts

  tokens per iteration  from the model's depth agreement phi(r) ~ E[mismatch(p_r, p_R)] = beta r^-alpha:
                        measured by a short probe on the prompt itself (readouts at every depth of its first
                        `probe_tokens` tokens: argmax disagreement when greedy, TV when sampling, fitted by
                        `theory.fit_power_law`), or Theorem 2's envelope (beta 0.175, alpha 1.03: Huginn-0125's
                        curve, docs/loopspec.md) when no probe runs. LoopSpec: gamma = R / C(d1, d2)
                        (`theory.curve_gamma`), gamma d1 / R tokens per tick; chain: (1 - a^(g+1)) / (1 - a)
                        with a = 1 - phi(d1); AR: 1.
  seconds per iteration from `hardware.Hardware` terms (calibrated on the host by `analysis/calibrate.py` at
                        the model's shapes, or an accelerator's public figures): each core step streams the
                        core weights once and its rows' KV, and runs its products at M = rows
                        (AR: R steps of B rows; LoopSpec: d1 steps of B (R / d1 + 1) rows; chain: g drafts of
                        d1 steps at B rows plus an R-step verify of B (g + 1) rows), plus the head and
                        `OPS_PER_LAYER_STEP` kernels per layer step at the device's per-op overhead.

and keeps the largest predicted tokens / second. The choice and the top candidates (tokens / iteration,
ms / iteration, tokens / s) go to `GenerateResult.stats["plan"]`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.analysis import theory
from loopspec_jax.analysis.hardware import Hardware
from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding.autoregressive import AR
from loopspec_jax.decoding.chain import Chain
from loopspec_jax.decoding.loopspec.decoder import LoopSpec
from loopspec_jax.decoding.method import Method
from loopspec_jax.models import looped as M

ENVELOPE = (0.175, 1.03)  # Theorem 2's (beta, alpha) for Huginn-0125 (docs/loopspec.md check value)
# Kernels per (layer, recurrent step) of a decode loop: tiny-raven's AR token compiles to 3085 ops for its
# R x n_core = 64 core layer steps plus prelude, coda and head (results/cost_calibration), ~48 per step.
OPS_PER_LAYER_STEP = 48


@dataclasses.dataclass(frozen=True)
class Candidate:
  method: Method
  tokens_per_iteration: float
  iteration_s: float
  batch: int

  @property
  def tokens_per_s(self) -> float:
    return self.batch * self.tokens_per_iteration / self.iteration_s

  def as_dict(self) -> dict:
    return {
        "method": self.method.spec,
        "tokens_per_iteration": self.tokens_per_iteration,
        "iteration_ms": self.iteration_s * 1e3,
        "tokens_per_s": self.tokens_per_s,
    }


# ---------------------------------------------------------------------------------------------------
# Depth agreement
# ---------------------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("cfg", "depths"))
def _depth_logits(params, tokens, lengths, *, cfg, depths):
  return M.forward_depths(params, tokens, lengths, depths, cfg, None)


def probe_curve(model, prompt: list, greedy: bool, probe_tokens: int = 32) -> Optional[Tuple[float, float]]:
  """(beta, alpha) of the prompt's own depth curve: mismatch between depth r and R readouts over its first
  `probe_tokens` tokens (argmax disagreement if greedy, else TV at temperature 1); None if it cannot fit."""
  cfg = model.config
  ids = list(prompt)[: max(min(probe_tokens, len(prompt)), 1)]
  n = 16 * ((len(ids) + 15) // 16)
  toks = jnp.asarray([ids + [0] * (n - len(ids))], jnp.int32)
  depths = tuple(range(1, cfg.recurrence + 1))
  logits = np.asarray(_depth_logits(model.params, toks, jnp.asarray([len(ids)], jnp.int32), cfg=cfg, depths=depths))
  logits = logits[:, 0, : len(ids)].astype(np.float64)
  if greedy:
    am = logits.argmax(-1)
    mis = (am[:-1] != am[-1][None]).mean(-1)
  else:
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    mis = 0.5 * np.abs(p[:-1] - p[-1][None]).sum(-1).mean(-1)
  r = np.asarray(depths[:-1], np.float64)
  floor = 0.5 / len(ids)  # a depth that never disagrees on the probe: below one token in 2 x probe
  try:
    beta, alpha = theory.fit_power_law(r, np.maximum(mis, floor))
  except (ValueError, np.linalg.LinAlgError):
    return None
  return (float(beta), float(alpha)) if np.isfinite(beta) and np.isfinite(alpha) and alpha > 0 else None


def phi(curve: Tuple[float, float], r: float) -> float:
  return min(curve[0] * float(r) ** (-curve[1]), 1.0)


# ---------------------------------------------------------------------------------------------------
# Time per iteration
# ---------------------------------------------------------------------------------------------------
def _layer_bytes(cfg: ModelConfig) -> dict:
  from loopspec_jax.analysis import cost  # cost imports the registry, which imports this module

  pb = cost.param_bytes(cfg)
  item = jnp.dtype(cfg.dtype).itemsize
  kv_pos = 2 * cfg.num_kv_heads * cfg.head_dim * item  # K and V of one position of one layer
  head = pb.get("lm_head", pb["embed"])
  return {
      "core": pb["core"] + pb.get("adapter", 0.0),
      "outer": pb.get("prelude", 0.0) + pb.get("coda", 0.0),
      "head": head,
      "kv_pos": kv_pos,
  }


def step_time(hw: Hardware, weight_bytes: float, params: float, rows: int, kv_bytes: float, ws: float, kernels: float):
  """One group of layers run on `rows` rows: max(weights + KV over BW, 2 params rows / P(rows)) + overhead."""
  mem = (weight_bytes + kv_bytes) / hw.stream_bandwidth(ws)
  comp = 2.0 * params * rows / hw.throughput(rows)
  return max(mem, comp) + kernels * hw.op_overhead_s


def iteration_seconds(hw: Hardware, cfg: ModelConfig, method: Method, batch: int, context: int) -> float:
  """Predicted seconds of one loop iteration of `method` (module docstring)."""
  lb = _layer_bytes(cfg)
  item = jnp.dtype(cfg.dtype).itemsize
  ws = lb["core"] + lb["outer"] + lb["head"] + batch * context * lb["kv_pos"] * (cfg.recurrence * cfg.n_core + 2)
  kv_core = context * lb["kv_pos"] * cfg.n_core  # one row, one core step

  def core(rows):
    return step_time(hw, lb["core"], lb["core"] / item, rows, rows * kv_core, ws, OPS_PER_LAYER_STEP * cfg.n_core)

  def outer(rows):
    layers = cfg.n_prelude + cfg.n_coda
    kv = rows * context * lb["kv_pos"] * layers
    return step_time(
        hw, lb["outer"] + lb["head"], (lb["outer"] + lb["head"]) / item, rows, kv, ws, OPS_PER_LAYER_STEP * (layers + 1)
    )

  r, b = cfg.recurrence, batch
  if isinstance(method, AR):
    return r * core(b) + outer(b)
  if isinstance(method, LoopSpec):
    lanes = r // method.d1 + 1
    return method.d1 * core(b * lanes) + outer(b * (2 if method.d2 is None else 3))
  if isinstance(method, Chain):
    g = int(method.gamma)
    return g * (method.d1 * core(b) + outer(b)) + r * core(b * (g + 1)) + outer(b * (g + 1))
  raise ValueError(f"the planner has no time model for {method.label}")


def tokens_per_iteration(cfg: ModelConfig, method: Method, curve: Tuple[float, float]) -> float:
  r = cfg.recurrence
  if isinstance(method, AR):
    return 1.0
  if isinstance(method, LoopSpec):
    return theory.curve_gamma(r, method.d1, method.d2, *curve) * method.d1 / r
  if isinstance(method, Chain):
    return float(theory.chain_expected_tokens(1.0 - phi(curve, method.d1), int(method.gamma)))
  raise ValueError(f"the planner has no acceptance model for {method.label}")


def candidates(cfg: ModelConfig) -> List[Method]:
  """AR, LoopSpec at every feasible (d1, d2) and (d1, -) with d1 in 1, 2, 4, chain at d1 1, 2, 4 x gamma 2, 4, 8."""
  r = cfg.recurrence
  out: List[Method] = [AR()]
  for d1, d2 in theory.feasible_configs(r, include_single=True):
    if d1 <= 4 and (d2 is None or d2 <= 16):
      out.append(LoopSpec(d1=d1, d2=d2))
  out += [Chain(d1=d1, gamma=g) for d1 in (1, 2, 4) if d1 < r for g in (2, 4, 8)]
  valid = []
  for m in out:
    try:
      m.validate(cfg)
    except ValueError:
      continue
    valid.append(m)
  return valid


# ---------------------------------------------------------------------------------------------------
# The device and the plan
# ---------------------------------------------------------------------------------------------------
_DEVICE_KINDS = (
    ("h200", "h200"),
    ("h100", "h100"),
    ("v5p", "tpu_v5p"),
    ("v5 lite", "tpu_v5e"),
    ("v5e", "tpu_v5e"),
    ("v4", "tpu_v4"),
)


@functools.lru_cache(maxsize=None)
def hardware_for(cfg: ModelConfig, working_set: float) -> Hardware:
  """The device's `Hardware`: an accelerator's public figures (configs/accelerators.py) when jax runs on one
  it knows, else this host measured at cfg's shapes (quick microbenchmarks, once per process and shape)."""
  from loopspec_jax.analysis import calibrate, hardware
  from loopspec_jax.configs import accelerators

  kind = jax.devices()[0].device_kind.lower()
  for key, name in _DEVICE_KINDS:
    if key in kind:
      return hardware.from_accelerator(name, accelerators.ACCELERATORS[name])
  return calibrate.calibrate_host(cfg, [working_set], rows=(1, 4, 16, 64), repeats=2)


@functools.lru_cache(maxsize=None)
def _hlo_cost(cfg: ModelConfig, method: Method, batch: int, greedy: bool):
  """The HLO cost (`hlo_cost.StepCost`) of one iteration of `method`'s compiled loop at cfg (abstract shapes)."""
  from loopspec_jax.analysis import cost

  return cost.loop_cost(cost.compile_decode_loop(cfg, method, batch=batch, greedy=greedy))


def rank(cfg: ModelConfig, hw: Hardware, batch: int, context: int, curve, greedy: bool = True, shortlist: int = 0):
  """Every candidate with its predicted tokens / iteration and seconds / iteration, fastest first.

  Seconds come from the analytic model (`iteration_seconds`); with `shortlist` = k > 0 the best analytic
  candidate of each family (LoopSpec with and without d2, chain) up to k, and AR, are re-timed from their
  compiled loops' HLO (`hardware.Hardware.step_seconds`, the model the calibration validates)."""
  out = [
      Candidate(m, tokens_per_iteration(cfg, m, curve), iteration_seconds(hw, cfg, m, batch, context), batch)
      for m in candidates(cfg)
  ]
  out = sorted(out, key=lambda c: -c.tokens_per_s)
  if not shortlist:
    return out
  picked, families = [], set()
  for c in out:
    if isinstance(c.method, AR):
      picked.append(c)
      continue
    fam = (type(c.method).__name__, isinstance(c.method, LoopSpec) and c.method.d2 is None)
    if fam not in families and len(families) < shortlist:
      families.add(fam)
      picked.append(c)
  ccfg = cfg.replace(max_len=context)
  from loopspec_jax.analysis import cost

  ws = sum(cost.param_bytes(cfg).values()) + batch * cost.ar_token_bytes(ccfg, context)["kv"]
  timed = [
      dataclasses.replace(c, iteration_s=hw.step_seconds(_hlo_cost(ccfg, c.method, batch, greedy), ws)) for c in picked
  ]
  return sorted(timed, key=lambda c: -c.tokens_per_s)


_PLANS: dict = {}


def plan(model, prompts: list, max_new_tokens: int, greedy: bool, auto: "Auto") -> Tuple[Method, dict]:
  """The method `auto` resolves to for these requests, and the plan (choice, reasons, top candidates).
  Plans are kept per (config, batch, context, sampling, probe) for the process."""
  cfg = model.config
  context = min(max(len(p) for p in prompts) + max_new_tokens, cfg.max_len)
  context = min(32 * ((context + 31) // 32), cfg.max_len)
  key = (cfg, len(prompts), context, greedy, auto)
  if key not in _PLANS:
    curve, source = None, "envelope"
    if auto.probe_tokens:
      curve = probe_curve(model, prompts[0], greedy, auto.probe_tokens)
      source = "probe" if curve is not None else "envelope (probe did not fit)"
    curve = curve or ENVELOPE
    lb = _layer_bytes(cfg)
    ws = (
        lb["core"]
        + lb["outer"]
        + lb["head"]
        + len(prompts) * context * lb["kv_pos"] * (cfg.recurrence * cfg.n_core + 2)
    )
    hw = hardware_for(cfg, float(ws))
    ranked = rank(cfg, hw, len(prompts), context, curve, greedy, auto.shortlist)
    best, ar = ranked[0], next(c for c in ranked if isinstance(c.method, AR))
    reason = (
        f"{best.method.label}: {best.tokens_per_iteration:.2f} tokens / {best.iteration_s * 1e3:.3g} ms per iteration "
        f"= {best.tokens_per_s / ar.tokens_per_s:.2f}x AR predicted on {hw.label} (batch {len(prompts)}, context "
        f"{context}, depth curve beta {curve[0]:.3g} alpha {curve[1]:.3g} from {source})"
    )
    _PLANS[key] = (
        best.method,
        {
            "choice": best.method.spec,
            "reason": reason,
            "depth_curve": {"beta": curve[0], "alpha": curve[1], "source": source},
            "device": hw.label,
            "top": [c.as_dict() for c in ranked[:5]],
            "ar": ar.as_dict(),
        },
    )
  return _PLANS[key]


@dataclasses.dataclass(frozen=True)
class Auto(Method):
  """The planner's choice for the requests of each `generate` call (module docstring); `probe_tokens`: prompt
  tokens of the depth-agreement probe (0: Theorem 2's envelope, no probe); `shortlist`: see `rank`."""

  name = "auto"
  probe_tokens: Optional[int] = 32
  shortlist: Optional[int] = 3  # families re-timed from their compiled loops' HLO (0: the analytic model only)

  def resolve(self, model, prompts, max_new_tokens: int, greedy: bool):
    return plan(model, prompts, max_new_tokens, greedy, self)

  def make_decoder(self, cfg: ModelConfig, *, greedy: bool, random_init: bool):
    raise ValueError("method='auto' is resolved per call (Auto.resolve) before a decoder is built")
