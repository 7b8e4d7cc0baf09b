"""LoopSpec cost identity and theory (Theorems 1 and 2), in plain numpy.

These are the closed forms from shared/docs/loopspec.md ("Cost identity and theory"). They take no model;
experiments and reports call them to turn measured rates and TV curves into predicted speed-ups, and to pick
(d1, d2) configurations. Notation: R is the full recurrent depth, d1 / d2 the first / second proposal
depths (d2=None means single-proposal mode, which behaves as d2 = R), phi(r) = beta * r^(-alpha) a power-law
envelope of E[TV(p_r, p_R)].
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "expected_cost",
    "expected_gamma",
    "single_proposal_gamma",
    "gamma_from_counts",
    "power_law",
    "fit_power_law",
    "cost_bound",
    "optimal_depths",
    "feasible_configs",
    "best_feasible_depths",
    "predicted_gamma_bound",
    "theorem1_check",
    "chain_expected_tokens",
    "power_law_fit_quality",
    "curve_cost",
    "curve_gamma",
]


def _as_out(x):
  """Returns a Python float for 0-d results, else the array (so scalars stay scalars)."""
  x = np.asarray(x, dtype=np.float64)
  return float(x) if x.ndim == 0 else x


def _check_prob(name: str, p) -> None:
  """Raises if p is not a probability (element-wise); catches swapped arguments early."""
  arr = np.asarray(p, dtype=np.float64)
  if np.any(~np.isfinite(arr)) or np.any(arr < 0.0) or np.any(arr > 1.0):
    raise ValueError(f"{name} must lie in [0, 1], got {p!r}")


def _check_depths(R: int, d1, d2) -> None:
  """Raises unless 0 < d1 <= d2 <= R (d2 None allowed); the cost identity needs ordered depths."""
  if not 0 < d1 <= R:
    raise ValueError(f"need 0 < d1 <= R, got d1={d1}, R={R}")
  if d2 is not None and not d1 <= d2 <= R:
    raise ValueError(f"need d1 <= d2 <= R, got d1={d1}, d2={d2}, R={R}")


# ----------------------------------------------------------------------------------------------------------
# Cost identity: recurrent steps per committed token.
# ----------------------------------------------------------------------------------------------------------


def expected_cost(R: int, d1: int, d2: Optional[int], p_reject_first, p_restart=None):
  """Expected recurrent steps per committed token, C.

  C = d1 + (d2 - d1) * P(reject x1) + (R - d2) * P(restart). Each commit costs d1 steps of pipeline advance;
  a rejected x1 wastes the steps until the second proposal lands at d2, and a restart (both proposals
  rejected) wastes the rest of the way to R. With d2=None (single proposal) this is
  C = d1 + (R - d1) * P(reject x1); p_restart is then ignored (it equals p_reject_first).
  Accepts scalars or broadcastable arrays for the probabilities.
  """
  _check_depths(R, d1, d2)
  _check_prob("p_reject_first", p_reject_first)
  p1 = np.asarray(p_reject_first, dtype=np.float64)
  if d2 is None:
    return _as_out(d1 + (R - d1) * p1)
  if p_restart is None:
    raise ValueError("p_restart is required when d2 is given")
  _check_prob("p_restart", p_restart)
  pr = np.asarray(p_restart, dtype=np.float64)
  return _as_out(d1 + (d2 - d1) * p1 + (R - d2) * pr)


def expected_gamma(R: int, d1: int, d2: Optional[int], p_reject_first, p_restart=None):
  """Mean accepted length gamma = R / C: committed tokens per R recurrent steps (<= R / d1)."""
  return _as_out(R / np.asarray(expected_cost(R, d1, d2, p_reject_first, p_restart)))


def single_proposal_gamma(R: int, d1: int, p_reject_first):
  """gamma = R / (d1 + (R - d1) * P(reject x1)) for the single-proposal pipeline (no d2)."""
  return expected_gamma(R, d1, None, p_reject_first)


def gamma_from_counts(
    R: int, d1: int, d2: Optional[int], n_committed: int, n_reject_first: int, n_restart: int
) -> float:
  """gamma exactly as the release computes it from counts over N committed tokens.

  gamma = R * N / (N * d1 + n_rej1 * (d2 - d1) + n_restart * (R - d2)); d2=None means d2 = R (the restart
  term then vanishes and every first rejection costs R - d1). Equals expected_gamma at rates = counts / N.
  """
  _check_depths(R, d1, d2)
  n = int(n_committed)
  if n <= 0:
    raise ValueError(f"n_committed must be positive, got {n_committed}")
  if not 0 <= n_restart <= n or not 0 <= n_reject_first <= n:
    raise ValueError(f"counts must lie in [0, N={n}], got n_reject_first={n_reject_first}, " f"n_restart={n_restart}")
  d2_eff = R if d2 is None else d2
  cycles = n * d1 + n_reject_first * (d2_eff - d1) + n_restart * (R - d2_eff)
  return float(R * n / cycles)


def chain_round_steps(R: int, d1: int, gamma: int) -> int:
  """Sequential recurrent steps of one chain round: gamma + 1 drafted positions to d1, then d1..R at once."""
  return (gamma + 1) * d1 + (R - d1)


def chain_accepted_length(R: int, d1: int, gamma: int, n_committed: int, rounds: int) -> float:
  """Chain's mean accepted length on LoopSpec's scale: R * N / (sequential recurrent steps of all rounds)."""
  return float(R * n_committed / max(rounds * chain_round_steps(R, d1, gamma), 1))


# ----------------------------------------------------------------------------------------------------------
# Power-law TV envelope.
# ----------------------------------------------------------------------------------------------------------


def power_law(r, beta: float, alpha: float):
  """phi(r) = beta * r^(-alpha): the model of E[TV(p_r, p_R)] used by Theorem 2."""
  return _as_out(beta * np.asarray(r, dtype=np.float64) ** (-alpha))


def fit_power_law(depths: Sequence[float], tv: Sequence[float], envelope: bool = False) -> Tuple[float, float]:
  """Fits phi(r) = beta * r^(-alpha) to measured (depth, TV) points; returns (beta, alpha).

  envelope=False: ordinary least squares of log(tv) on log(r), over the points with tv > 0 (at least two
  distinct depths needed). envelope=True: the non-increasing power-law upper envelope Theorem 2 assumes.
  Its exponent is the least-squares slope clipped to alpha >= 0 (so phi never increases with depth), and
  beta is raised to the smallest value with phi(r_i) >= tv_i at every measured point,
  beta = max_i tv_i * r_i^alpha. Points with tv <= 0 are trivially below any positive phi.
  """
  r = np.asarray(depths, dtype=np.float64).ravel()
  t = np.asarray(tv, dtype=np.float64).ravel()
  if r.shape != t.shape:
    raise ValueError(f"depths and tv differ in length: {r.shape} vs {t.shape}")
  if np.any(r <= 0) or np.any(~np.isfinite(r)):
    raise ValueError("depths must be positive and finite")
  keep = np.isfinite(t) & (t > 0)
  rk, tk = r[keep], t[keep]
  if rk.size < 2 or np.unique(rk).size < 2:
    raise ValueError("need at least two points with tv > 0 at distinct depths")
  x, y = np.log(rk), np.log(tk)
  slope, intercept = np.polyfit(x, y, 1)
  alpha, beta = float(-slope), float(np.exp(intercept))
  if envelope:
    alpha = max(alpha, 0.0)
    beta = float(np.max(tk * rk**alpha))
  return beta, alpha


# ----------------------------------------------------------------------------------------------------------
# Theorem 2: the cost bound and its minimiser.
# ----------------------------------------------------------------------------------------------------------


def cost_bound(R: int, d1: float, d2: Optional[float], beta: float, alpha: float) -> float:
  """Upper bound J on the cost C under the envelope phi = beta * r^(-alpha).

  J = d1 + d2 * phi(d1) + 2R * phi(d2): P(reject x1) <= phi(d1) and, with the gate, P(restart) <= 2 eps2
  <= 2 phi(d2) (Theorem 1), and d2 - d1 <= d2, R - d2 <= R. d2=None (single proposal) uses the direct bound
  J = d1 + (R - d1) * phi(d1). Continuous depths are allowed (for the Theorem 2 optimum).
  """
  phi1 = beta * float(d1) ** (-alpha)
  if d2 is None:
    return float(d1 + (R - d1) * phi1)
  return float(d1 + d2 * phi1 + 2.0 * R * beta * float(d2) ** (-alpha))


def optimal_depths(R: int, beta: float, alpha: float) -> Tuple[float, float]:
  """Continuous minimiser (d1*, d2*) of cost_bound (Theorem 2 closed form).

  d2* = (2 alpha R)^((alpha+1)/(alpha^2+alpha+1)) * (alpha beta)^(alpha/(alpha^2+alpha+1)),
  d1* = (alpha beta d2*)^(1/(alpha+1)); both from setting dJ/dd1 = dJ/dd2 = 0. Needs alpha, beta > 0.
  """
  if not (alpha > 0 and beta > 0):
    raise ValueError(f"need alpha > 0 and beta > 0, got alpha={alpha}, beta={beta}")
  den = alpha * alpha + alpha + 1.0
  d2 = (2.0 * alpha * R) ** ((alpha + 1.0) / den) * (alpha * beta) ** (alpha / den)
  d1 = (alpha * beta * d2) ** (1.0 / (alpha + 1.0))
  return float(d1), float(d2)


def feasible_configs(R: int, include_single: bool = False) -> List[Tuple[int, Optional[int]]]:
  """All integer (d1, d2) with d1 | R, d1 | d2, d1 < d2 < R, sorted by (d1, d2).

  include_single=True adds (d1, None) single-proposal pairs for every d1 | R with d1 < R (listed after that
  d1's two-proposal pairs). These are the configurations the pipeline can run (lanes start at multiples of d1).
  """
  if R < 1:
    raise ValueError(f"R must be positive, got {R}")
  out: List[Tuple[int, Optional[int]]] = []
  for d1 in range(1, R):
    if R % d1:
      continue
    out.extend((d1, d2) for d2 in range(2 * d1, R, d1))
    if include_single:
      out.append((d1, None))
  return out


def best_feasible_depths(R: int, beta: float, alpha: float, include_single: bool = False) -> Tuple[int, Optional[int]]:
  """Feasible (d1, d2) minimising cost_bound; ties go to the smaller d1, then the smaller d2.

  The integer counterpart of optimal_depths (which is generally not feasible). Raises if R admits no config.
  """
  configs = feasible_configs(R, include_single=include_single)
  if not configs:
    raise ValueError(f"R={R} admits no feasible configuration")
  key = lambda c: (cost_bound(R, c[0], c[1], beta, alpha), c[0], R if c[1] is None else c[1])
  return min(configs, key=key)


def predicted_gamma_bound(R: int, d1: float, d2: Optional[float], beta: float, alpha: float) -> float:
  """Guaranteed mean accepted length R / J: a LOWER bound on gamma, since J upper-bounds the cost C."""
  return float(R / cost_bound(R, d1, d2, beta, alpha))


# ----------------------------------------------------------------------------------------------------------
# Theorem 1 and the chain baseline.
# ----------------------------------------------------------------------------------------------------------


def theorem1_check(restart_rate: float, eps2: float, gated: bool = True, slack: float = 0.0) -> Dict:
  """Checks a measured restart rate against Theorem 1: P(restart) <= eps2 (no gate) or 2 * eps2 (gate).

  eps2 = TV(p_d2, p_R) (measured mean). Returns {bound, restart_rate, eps2, gated, slack, margin, holds}
  with margin = bound - restart_rate and holds = restart_rate <= bound + slack (slack absorbs sampling noise).
  """
  bound = (2.0 if gated else 1.0) * float(eps2)
  rate = float(restart_rate)
  return {
      "bound": bound,
      "restart_rate": rate,
      "eps2": float(eps2),
      "gated": bool(gated),
      "slack": float(slack),
      "margin": bound - rate,
      "holds": bool(rate <= bound + slack),
  }


def chain_expected_tokens(a, gamma):
  """Expected tokens per verify pass of chain self-speculation: (1 - a^(gamma+1)) / (1 - a).

  a is the i.i.d. per-token acceptance rate, gamma the draft length; at a == 1 it is gamma + 1.
  """
  _check_prob("a", a)
  a_arr = np.asarray(a, dtype=np.float64)
  g = np.asarray(gamma, dtype=np.float64)
  one = a_arr == 1.0
  safe = np.where(one, 0.5, a_arr)
  val = np.where(one, g + 1.0, (1.0 - safe ** (g + 1.0)) / (1.0 - safe))
  return _as_out(val)


# ----------------------------------------------------------------------------------------------------------
# How well a power law describes a measured depth curve, and gamma read off a fitted curve.
# ----------------------------------------------------------------------------------------------------------


def power_law_fit_quality(depths: Sequence[float], tv: Sequence[float], beta: float, alpha: float) -> Dict:
  """Fit quality of phi = beta r^-alpha on (depth, tv) points with tv > 0, in log space.

  r2: 1 - SS_res / SS_tot of log(tv) against log(phi); rmse_log: root-mean-square log residual (0.1 is about
  10% off per point); max_ratio / min_ratio: the extremes of phi / tv (an envelope has min_ratio >= 1: it
  touches the curve where min_ratio = 1 and over-states it by max_ratio elsewhere); depths: the range used.
  """
  r = np.asarray(depths, dtype=np.float64).ravel()
  t = np.asarray(tv, dtype=np.float64).ravel()
  keep = np.isfinite(t) & (t > 0)
  r, t = r[keep], t[keep]
  if r.size == 0:
    return {"r2": None, "rmse_log": None, "max_ratio": None, "min_ratio": None, "points": 0, "depths": None}
  y, f = np.log(t), np.log(beta) - alpha * np.log(r)
  ss_tot = float(np.sum((y - y.mean()) ** 2))
  ss_res = float(np.sum((y - f) ** 2))
  ratio = np.exp(f - y)
  return {
      "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else None,
      "rmse_log": float(np.sqrt(ss_res / r.size)),
      "max_ratio": float(ratio.max()),
      "min_ratio": float(ratio.min()),
      "points": int(r.size),
      "depths": [float(r.min()), float(r.max())],
  }


def curve_cost(R: int, d1: int, d2: Optional[int], beta: float, alpha: float) -> float:
  """The cost identity with the rates read off a fitted curve phi = beta r^-alpha (a point estimate, not a bound).

  C = d1 + (d2 - d1) phi(d1) + (R - d2) phi(d2): P(reject x1) ~ phi(d1) (the first proposal is rejected with
  probability TV(p_d1, p_R) when sampling, and misses the argmax with the disagreement rate when greedy) and
  P(restart) ~ phi(d2) (greedy: a restart needs the depth-d2 argmax to miss too, and shallower misses are
  mostly nested in deeper ones; sampling: Theorem 1's ungated eps2). Rates are capped at 1. Single proposal:
  C = d1 + (R - d1) phi(d1). Unlike cost_bound (Theorem 2's J) this neither doubles eps2 nor widens d2 - d1
  to d2, so it estimates gamma rather than guaranteeing it.
  """
  _check_depths(R, d1, d2)
  p1 = min(beta * float(d1) ** (-alpha), 1.0)
  if d2 is None:
    return float(d1 + (R - d1) * p1)
  p2 = min(beta * float(d2) ** (-alpha), 1.0)
  return float(d1 + (d2 - d1) * p1 + (R - d2) * min(p2, p1))


def curve_gamma(R: int, d1: int, d2: Optional[int], beta: float, alpha: float) -> float:
  """gamma = R / curve_cost: the mean accepted length the fitted depth curve predicts for (d1, d2)."""
  return float(R / curve_cost(R, d1, d2, beta, alpha))
