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

and ranks by predicted tokens / second. Then (`Auto.measure` > 0, inside `generate`) a short measured probe:
AR and the best predicted candidates of each family (chain at d1 1 and 2: two gammas each; LoopSpec with and
without d2: one each; `PER_FAMILY`), prompt lookup and, given a `draft_model`, draft-model speculation each
decode `measure` new tokens of the requests themselves at the call's own shapes (so each compiles into its
method's normal jit cache, which the planned call then reuses; sampled, with the next seed's keys:
`probe_run`), in `rounds` interleaved rounds (`measure`);
the best median rate / AR's rate of the same round wins, unless it beats AR by less than `AR_MARGIN` (then AR).

Re-planning (`Auto.replan` = N tokens, default `REPLAN` = 16, 0: off; module function `generate`): when
max_new_tokens > N the first pick decodes N tokens, the measured probe of the same shortlist runs again on each
request's prompt + its N tokens, and its pick decodes the rest from there (a continuation: positions, keys and
noise go on from the prefix, so the join is exact). It catches acceptance the prompt alone does not show: text
that falls into repeats, where prompt lookup gains (results/bench_auto/epyc2-2026-12-04-replan-tau).

The plan is computed once per (model, batch, prompt and context buckets, sampling settings, device, planner
settings) and kept in `PLANS` (the second pick under the same key + ('replan', N); on disk too, in the user
cache once `user_cache.enable`d, as every console script does): later calls of that shape cost what the picked
method costs. The choice and the top candidates (measured and predicted tokens and ms per iteration, tokens/s)
go to stats["plan"], with `plan_seconds`, `cached`, `picks` and `replan` (the second plan, or why none). The
serving engine plans from the prediction alone (`engine_plan`: no requests when it starts; no re-planning).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from typing import List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.analysis import accelerators
from loopspec_jax.analysis import calibrate
from loopspec_jax.analysis import cost
from loopspec_jax.analysis import hardware
from loopspec_jax.analysis import theory
from loopspec_jax.analysis.hardware import Hardware
from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding.auto import Auto, REPLAN  # method "auto": the settings this module plans with
from loopspec_jax.decoding.autoregressive import AR
from loopspec_jax.decoding import common
from loopspec_jax.decoding.chain import Chain
from loopspec_jax.decoding.draft import Draft
from loopspec_jax.decoding.lookup import Lookup
from loopspec_jax.decoding.loopspec.decoder import LoopSpec
from loopspec_jax.decoding.method import Method
from loopspec_jax.models import looped as M
from loopspec_jax import user_cache
from loopspec_jax.probe import measure, probe_run  # the measured probe (re-exported)

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
  """The device's `Hardware`: an accelerator's public figures (analysis/accelerators.py) when jax runs on one
  it knows, else this host measured at cfg's shapes (quick microbenchmarks, once per process and shape)."""
  kind = jax.devices()[0].device_kind.lower()
  for key, name in _DEVICE_KINDS:
    if key in kind:
      return hardware.from_accelerator(name, accelerators.ACCELERATORS[name])
  return calibrate.calibrate_host(cfg, [working_set], rows=(1, 4, 16, 64), repeats=2)


@functools.lru_cache(maxsize=None)
def _hlo_cost(cfg: ModelConfig, method: Method, batch: int, greedy: bool):
  """The HLO cost (`hlo_cost.StepCost`) of one iteration of `method`'s compiled loop at cfg (abstract shapes)."""
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
  ws = sum(cost.param_bytes(cfg).values()) + batch * cost.ar_token_bytes(ccfg, context)["kv"]
  retime = lambda c: dataclasses.replace(c, iteration_s=hw.step_seconds(_hlo_cost(ccfg, c.method, batch, greedy), ws))
  return sorted(map(retime, picked), key=lambda c: -c.tokens_per_s)


# ---------------------------------------------------------------------------------------------------
# The plan: analytic ranking, then a short measured probe of the shortlist on the requests themselves
# ---------------------------------------------------------------------------------------------------
# plan_key(...) -> (method, plan), on disk too when `user_cache.enable`d; `clear_plans()` empties the memory
PLANS: dict = user_cache.PlanStore(salt=hashlib.sha256(open(__file__, "rb").read()).hexdigest())
AR_MARGIN = 1.05  # a speculative pick must beat AR's measured rate by this much (noise guard), else AR


def clear_plans() -> None:
  PLANS.clear()


def plan_key(model, prompts, max_new_tokens: int, sampling, auto: Auto) -> tuple:
  """What a plan depends on: the model (config and identity), batch, the prompt and context buckets of the
  call (its compiled shapes), the sampling settings, the device and the planner's own settings."""
  cfg = model.config
  tp, total = common.buckets([len(p) for p in prompts], max_new_tokens, cfg)
  device = jax.devices()[0].device_kind
  ident = user_cache.identity
  return (cfg, ident(model), len(prompts), tp, total, sampling, device, auto, ident(auto.draft_model))


def _family(m: Method):
  """The shortlist's family of a candidate: chain per d1, LoopSpec with and without d2, each other method."""
  if isinstance(m, Chain):
    return ("chain", m.d1)
  if isinstance(m, LoopSpec):
    return ("loopspec", m.d2 is None)
  return (type(m).__name__,)


# Candidates per family the probe measures, best predicted first: the analytic gamma is the weakest part of
# the prediction (results/bench_auto/vm-2026-12-03: at d1 = 2 it preferred gamma 4 and the fastest fixed
# method, chain (2, 8), was never probed), so chain keeps its two best gammas per d1.
PER_FAMILY = {"chain": 2, "loopspec": 1}


def measured_shortlist(ranked: List[Candidate], draft_model=None, per_family: Optional[dict] = None) -> List[Method]:
  """AR, the `per_family` best predicted candidates of each family (chain at each d1 <= 2: its two best gammas;
  LoopSpec with and without d2: the best of each), prompt lookup and, with a drafter, draft-model
  speculation: what the probe decodes."""
  per_family = PER_FAMILY if per_family is None else per_family
  out, counts = [AR()], {}
  for c in ranked:
    m = c.method
    if isinstance(m, AR) or (isinstance(m, Chain) and m.d1 > 2):
      continue
    fam = _family(m)
    if counts.get(fam, 0) < per_family.get(fam[0], 1):
      counts[fam] = counts.get(fam, 0) + 1
      out.append(m)
  out.append(Lookup(ngram=3, gamma=4))
  if draft_model is not None:
    out.append(Draft(draft_model=draft_model, gamma=4))
  return out


def _predicted(cfg, m, hw, batch, context, curve) -> Optional[Candidate]:
  try:
    return Candidate(m, tokens_per_iteration(cfg, m, curve), iteration_seconds(hw, cfg, m, batch, context), batch)
  except ValueError:  # lookup, draft: no analytic model (measured only)
    return None


def _row(c: Candidate, predicted: Optional[Candidate]) -> dict:
  row = c.as_dict()
  row["predicted_tokens_per_iteration"] = predicted.tokens_per_iteration if predicted else None
  row["predicted_iteration_ms"] = predicted.iteration_s * 1e3 if predicted else None
  return row


def _curve(model, prompts, greedy, auto):
  if auto.probe_tokens:
    curve = probe_curve(model, prompts[0], greedy, auto.probe_tokens)
    if curve is not None:
      return curve, "probe"
    return ENVELOPE, "envelope (probe did not fit)"
  return ENVELOPE, "envelope"


def make_plan(
    model, prompts: list, max_new_tokens: int, greedy: bool, auto: Auto, run=None, curve=None, sampling=None
) -> Tuple[Method, dict]:
  """The method `auto` resolves to for these requests and the plan (choice, reasons, top candidates with
  their predicted and, when `run` is given and auto.measure > 0, measured tokens and ms per iteration).
  `curve`: (beta, alpha) and its source, given by a re-plan (the first plan's: no second depth probe)."""
  t0 = time.perf_counter()
  cfg, batch = model.config, len(prompts)
  _, context = common.buckets([len(p) for p in prompts], max_new_tokens, cfg)
  curve, source = _curve(model, prompts, greedy, auto) if curve is None else curve
  lb = _layer_bytes(cfg)
  ws = lb["core"] + lb["outer"] + lb["head"] + batch * context * lb["kv_pos"] * (cfg.recurrence * cfg.n_core + 2)
  hw = hardware_for(cfg, float(ws))
  ranked = rank(cfg, hw, batch, context, curve, greedy, auto.shortlist)
  predicted = {c.method: c for c in ranked}
  basis, ratios = "predicted", {}
  if run is not None and auto.measure:
    budget = min(int(auto.measure), max_new_tokens)
    shortlist = measured_shortlist(ranked, auto.draft_model)
    shortlist = shortlist if auto.candidates is None else shortlist[: 1 + int(auto.candidates)]
    for m in shortlist:
      predicted.setdefault(m, _predicted(cfg, m, hw, batch, context, curve))
    rounds = int(auto.rounds or 5)
    got = measure(probe_run(run, sampling), shortlist, budget, rounds)
    ratios = {m: q for m, (_, _, q) in got.items()}
    ranked = sorted((Candidate(m, t, s, batch) for m, (t, s, _) in got.items()), key=lambda c: -ratios[c.method])
    basis = (
        f"measured on these requests ({budget} new tokens, {rounds} interleaved rounds, "
        "median of each candidate's rate / AR's in the same round)"
    )
  ar = next(c for c in ranked if isinstance(c.method, AR))
  best = ranked[0]
  ratio = ratios[best.method] if ratios else best.tokens_per_s / ar.tokens_per_s
  if ratio < AR_MARGIN:
    best, ratio = ar, 1.0  # within the noise of AR: AR (nothing to lose)
  reason = (
      f"{best.method.label}: {best.tokens_per_iteration:.2f} tokens / {best.iteration_s * 1e3:.3g} ms per iteration "
      f"= {ratio:.2f}x AR {basis} on {hw.label} (batch {batch}, context {context}, "
      f"depth curve beta {curve[0]:.3g} alpha {curve[1]:.3g} from {source})"
  )
  top = [best] + [c for c in ranked if c is not best]
  return best.method, {
      "choice": best.method.spec,
      "reason": reason,
      "basis": basis,
      "depth_curve": {"beta": curve[0], "alpha": curve[1], "source": source},
      "device": hw.label,
      "top": [dict(_row(c, predicted.get(c.method)), x_ar=ratios.get(c.method)) for c in top[:12]],
      "ar": _row(ar, predicted.get(ar.method)),
      "plan_seconds": time.perf_counter() - t0,
  }


def _key(model, prompts, max_new_tokens: int, greedy: bool, auto: Auto, sampling) -> tuple:
  """`plan_key` of a call: its sampling settings but the seed (`common.Sampling`), or just `greedy`."""
  return plan_key(model, prompts, max_new_tokens, greedy if sampling is None else sampling.plan_key(), auto)


def plan(
    model, prompts: list, max_new_tokens: int, greedy: bool, auto: Auto, run=None, sampling=None
) -> Tuple[Method, dict]:
  """`make_plan`, once per `plan_key` for the process (the cache `PLANS`); a cached plan says `cached`.
  `sampling`: the call's `common.Sampling` (its settings key the plan; a sampled probe runs at its next seed)."""
  key = _key(model, prompts, max_new_tokens, greedy, auto, sampling)
  if key in PLANS:
    method, p = PLANS[key]
    return method, dict(p, cached=True)
  method, p = make_plan(model, prompts, max_new_tokens, greedy, auto, run, sampling=sampling)
  PLANS[key] = (method, p)
  return method, dict(p, cached=False)


def engine_plan(model, auto: Auto, slots: int, total: int, greedy: bool) -> Tuple[Method, dict]:
  """The plan of a serving engine (`serving.Engine`, method 'auto'): `slots` requests decoding up to `total`
  positions; no requests exist yet, so the ranking is the prediction alone (Theorem 2's envelope, no probe,
  no measurement), cached like any plan."""
  auto = dataclasses.replace(auto, probe_tokens=0, measure=0, replan=0)
  prompt = min(16, max(total - 1, 1))
  return plan(model, [[0] * prompt] * int(slots), max(total - prompt, 1), greedy, auto)


# ---------------------------------------------------------------------------------------------------
# Re-planning: a second measured probe after the first `replan` tokens, on prompt + those tokens
# ---------------------------------------------------------------------------------------------------
def generate(model, prompts: list, max_new_tokens: int, sampling: common.Sampling, auto: Auto, run, run_at=None):
  """`generate(method=auto)`: decode with the first plan's pick; with re-planning on (`auto.replan` = N > 0,
  max_new_tokens > N, a measured probe) decode only the first N tokens with it, re-run the measured probe of
  the first plan's shortlist on each request's prompt + its N tokens (at the continuation's own shapes, the
  first plan's depth curve), and decode the remaining max_new_tokens - N tokens with that pick from there.

  Exact whatever the picks: the continuation is a `generate` call on prompt + prefix, whose positions (and
  so its per-(request, position) keys and Raven noise) go on from the prefix's, so greedy output is AR's and
  sampled output is AR's distribution (AR + AR: AR's tokens up to float rounding: a prefill and step-by-step
  decoding of the prefix may round the logits differently). A request that finished (its eos) within the
  first N tokens runs the continuation as a one-token dummy (the batch keeps its compiled shapes) and its
  token and counts are dropped. Both picks are cached (`PLANS`: the second under the first's key + ('replan',
  N)); a cached call whose second pick is the first decodes in one run. stats["plan"]: the first plan, with
  `picks` ([first] or [first, second]) and `replan` (the second plan with `after_tokens`, or `skipped`: why
  not); with two segments, stats are their counts joined (`DecodeStats.then`) and each one's in `segments`."""
  auto.validate(model.config)
  greedy = sampling.greedy
  n = REPLAN if auto.replan is None else int(auto.replan)
  first, p1 = plan(model, prompts, max_new_tokens, greedy, auto, run, sampling)
  key = _key(model, prompts, max_new_tokens, greedy, auto, sampling) + ("replan", n)
  skip = None
  if not n:
    skip = "off (replan=0)"
  elif max_new_tokens <= n:
    skip = f"max_new_tokens {max_new_tokens} <= replan {n}"
  elif not auto.measure or run_at is None:
    skip = "nothing to re-measure (measure=0)" if not auto.measure else "no continuation call (run_at)"
  elif key in PLANS and PLANS[key][0] == first:
    skip = f"the cached second pick is the first ({first.spec}): one run"
  if skip is not None:
    result = run(first)
    result.counts = result.counts.as_planned()  # it adds to the counts of other picks of an `auto` row
    result.stats["plan"] = dict(p1, picks=[first.spec], replan={"skipped": skip})
    return result
  head = run(first, n)
  head.counts, eos = head.counts.as_planned(), sampling.eos_id
  live = [len(t) == n and not (eos is not None and eos in t) for t in head.tokens]
  if not any(live):
    head.stats["plan"] = dict(p1, picks=[first.spec], replan={"skipped": f"every request finished within {n} tokens"})
    return head
  ext = [list(p) + list(t) for p, t in zip(prompts, head.tokens)]
  rest = max_new_tokens - n
  budgets = [rest if ok else 1 for ok in live]
  run2 = run_at(ext, rest)
  if key in PLANS:
    second, p2 = PLANS[key][0], dict(PLANS[key][1], cached=True)
  else:
    run2_probe = probe_run(run2, sampling)
    probe = lambda m, b: run2_probe(m, [min(int(b), x) for x in budgets])
    dc = p1["depth_curve"]
    second, p2 = make_plan(model, ext, rest, greedy, auto, probe, curve=((dc["beta"], dc["alpha"]), dc["source"]))
    p2 = dict(p2, after_tokens=n, reason=f"after {n} tokens of {first.label}, on prompt + those: {p2['reason']}")
    PLANS[key] = (second, p2)
    p2 = dict(p2, cached=False)
  tail = run2(second, budgets)
  counts = head.counts.then(tail.counts, live)
  stats = dict(counts.summary(), segments=[head.stats, tail.stats])
  stats["plan"] = dict(p1, picks=[first.spec, second.spec], replan=p2)
  tokens = [h + (t if ok else []) for h, t, ok in zip(head.tokens, tail.tokens, live)]
  return common.GenerateResult(tokens, stats, counts)
