"""The statistics of a sweep row: from the summed `DecodeStats` of its prompts to the fields of sweep.jsonl.

`make_row` writes what the measurement gives (timings, gamma, commit sources, rates, the cost identity's
prediction from the measured rates, the baselines' per-pass figures), with the per-prompt counts
(`per_prompt_counts`) that give jackknife standard errors across prompts (`gamma_standard_error`). The
`*_fields` functions are recomputed into every row when a table is written, never stored (`DERIVED`): Theorem
1 and the depth-curve predictions from the depth JSON, the engine against the greedy replay, the min/min wall
clock ratio and the projected ratio on an accelerator.
"""

from __future__ import annotations

import statistics
import time
from typing import Dict, List, Optional, Tuple

from loopspec_jax import methods
from loopspec_jax.analysis import depth_metrics as DA
from loopspec_jax.analysis import theory
from loopspec_jax.decoding.stats import DecodeStats
from loopspec_jax.experiment import sweep_grid

# row fields recomputed from the current depth JSON, replay and projection whenever rows are tabled
DERIVED = ("eps2", "theorem1", "theorem1_applies", "gamma_curve", "gamma_fit", "gamma_bound", "cost_bound")
DERIVED += ("projected_ratio", "gamma_all_spawns", "replay_first_matches", "wall_clock_ratio_min")


def per_prompt_counts(stats: List[DecodeStats]) -> List[List[int]]:
  """Per-prompt counts that determine gamma: LoopSpec [N, first, second, restart, reject_first]; chain
  [N, rounds, accepted drafts]; draft / lookup [N, rounds, accepted, offered, examined drafts]; AR [N]. Kept in
  the rows so standard errors can be taken across prompts."""
  out = []
  for s in stats:
    if s.method == methods.LoopSpec.name:
      keys = ("first", "second", "restart", "reject_first")
    elif s.method == methods.Chain.name:
      keys = ("rounds", "first")
    elif sweep_grid.is_separate_drafter(s.method):
      keys = ("rounds", "first", "drafted", "examined")
    else:
      keys = ()
    out.append([s.tokens] + [s.count(k) for k in keys])
  return out


def jackknife_se(values: List[float]) -> float:
  """Leave-one-out (jackknife) standard error of a statistic from its k leave-one-prompt-out values."""
  k = len(values)
  if k < 2:
    return 0.0
  v = [float(x) for x in values]
  m = sum(v) / k
  return float(((k - 1) / k * sum((x - m) ** 2 for x in v)) ** 0.5)


def gamma_standard_error(m: methods.Method, r: int, counts: List[List[int]]) -> Optional[float]:
  """Jackknife standard error of gamma over prompts (each prompt's commits left out in turn); draft / lookup:
  of tokens per verify pass. `counts` as `per_prompt_counts` gives them."""
  loopspec, chain = isinstance(m, methods.LoopSpec), isinstance(m, methods.Chain)
  if len(counts) < 2 or not (loopspec or chain or m.separate_drafter):
    return None
  tot = [sum(col) for col in zip(*counts)]
  loo = []
  for c in counts:
    t = [a - b for a, b in zip(tot, c)]
    if t[0] <= 0:
      return None
    if loopspec:
      loo.append(theory.gamma_from_counts(r, m.d1, m.d2, t[0], t[2] + t[3], t[3]))
    elif m.separate_drafter:  # tokens per verify pass
      if t[1] <= 0:
        return None
      loo.append(t[0] / t[1])
    else:
      loo.append(theory.chain_accepted_length(r, m.d1, m.gamma, t[0], t[1]))
  return jackknife_se(loo)


def rate_standard_errors(per_prompt: List[List[int]]) -> dict:
  """Standard errors across prompts of P(reject x1) and P(restart) from LoopSpec's per-prompt counts."""
  counts = [p[0] for p in per_prompt]
  return {
      "p_reject_first_se": float(DA.ratio_standard_error([[p[4]] for p in per_prompt], counts)[0]),
      "p_restart_se": float(DA.ratio_standard_error([[p[3]] for p in per_prompt], counts)[0]),
  }


# ----------------------------------------------------------------------------------------------------------
# A measured row
# ----------------------------------------------------------------------------------------------------------
def make_row(
    base: dict,
    m: methods.Method,
    label: str,
    agg: dict,
    times: list,
    r: int,
    ar_row: Optional[dict],
    outputs: list,
    greedy: bool,
    ar_times: Optional[list] = None,
    per_prompt: Optional[List[List[int]]] = None,
    drafter: Optional[str] = None,
) -> dict:
  """A result row: timings, gamma, rates and the cost-identity prediction. `agg` is the `summary()` of the
  prompts' summed `DecodeStats`; `label` the row's (`sweep_grid.row_label`); `drafter` the draft model's name.

  With interleaved AR passes (`ar_times`, one before each timed pass) the wall-clock ratio is the median of
  the paired per-pass ratios; `wall_clock_ratio_reference` is the ratio to the group's AR row (timed once,
  at the start of the group) either way.
  """
  n = agg["tokens"]
  row = dict(base)
  row.update(method=m.name, label=label, R=r, **sweep_grid.grid_fields(m), tokens=n)
  row.update(
      {
          "decode_seconds_median": statistics.median(times),
          "decode_seconds_all": times,
          "prefill_seconds": agg["prefill_seconds"],
          "tokens_per_second": n / max(statistics.median(times), 1e-9),
          "mean_accepted_length": agg["mean_accepted_length"],
          "commits": agg["commits"],
          "gate_open_rate": agg["gate_open_rate"],
          "skipped_spawns": agg["skipped_spawns"],
          "core_step_calls_per_token": agg["core_step_calls_per_token"],
          "time": time.strftime("%Y-%m-%d %H:%M:%S"),
      }
  )
  if per_prompt is not None:
    row["per_prompt"] = per_prompt
    row["gamma_se"] = gamma_standard_error(m, r, per_prompt)
  row.update(_ratio_fields(row, ar_row, times, ar_times, outputs, greedy))
  if isinstance(m, methods.LoopSpec) and n > 0:
    row.update(_loopspec_fields(m, agg, r, per_prompt))
  if isinstance(m, methods.Chain) and agg["rounds"]:
    row["rounds"] = agg["rounds"]
    row["tokens_per_round"] = agg["tokens_per_round"]
    row["acceptance_rate"] = agg["acceptance_rate"]  # accepted drafts / drafted
    row["implied_iid_acceptance"] = DA.implied_chain_acceptance(m.gamma, agg["tokens_per_round"])
  if m.separate_drafter:
    for k in ("rounds", "tokens_per_round", "acceptance_rate", "alpha", "drafted", "examined", "mean_gamma"):
      row[k] = agg[k]
    row["alpha"] = agg["alpha"] if agg["examined"] else None  # no draft examined: no per-draft rate
    row["draft_cost_share"] = agg["draft_cost_share"]
    row["draft_model"] = drafter  # the config's name (None for lookup)
    row["ngram"] = getattr(m, "ngram", None)
  if "tau" in agg and not m.separate_drafter:  # a tree method (tree/verify.py's figures): per verify pass
    for k in ("rounds", "tau", "tokens_per_round", "acceptance_rate", "nodes_per_pass", "draft_cost_share"):
      row[k] = agg[k]
  return row


def _ratio_fields(row: dict, ar_row: Optional[dict], times, ar_times, outputs, greedy: bool) -> dict:
  """Wall clock against AR (the group's AR row and the interleaved AR passes) and losslessness; the AR row
  itself keeps its outputs, which every other row of the group is compared with."""
  if ar_row is None:
    return {"wall_clock_ratio": 1.0, "outputs": outputs}
  out = {"ar_decode_seconds_median": ar_row["decode_seconds_median"]}
  out["wall_clock_ratio_reference"] = ar_row["decode_seconds_median"] / max(row["decode_seconds_median"], 1e-12)
  out["wall_clock_ratio"] = out["wall_clock_ratio_reference"]
  if ar_times:
    out["ar_decode_seconds_interleaved"] = ar_times
    paired = [a / max(t, 1e-12) for a, t in zip(ar_times, times)]
    out["wall_clock_ratios_paired"] = paired
    out["wall_clock_ratio"] = statistics.median(paired)
  out["identical_to_ar"] = (outputs == ar_row["outputs"]) if greedy else None
  return out


def _loopspec_fields(m: methods.LoopSpec, agg: dict, r: int, per_prompt) -> dict:
  """A LoopSpec row's rates and the cost identity's gamma from them (`DA.predicted_loopspec`)."""
  n, c = agg["tokens"], agg["commits"]
  out = {
      "reject_first": agg["reject_first"],
      "p_reject_first_commits": (c["second"] + c["restart"]) / n,  # as the release's gamma counts it
      "tokens_per_r_steps": agg["tokens_per_r_steps"],  # gamma from the pipeline's ticks
      "max_live_lanes": agg["max_live_lanes"],
  }
  out.update(DA.predicted_loopspec(r, m.d1, m.d2, n, agg["reject_first"], c["restart"]))
  out["reject_rate_first"] = out["p_reject_first"]
  out["restart_rate"] = out["p_restart"]
  if per_prompt is not None and len(per_prompt) > 1:
    out.update(rate_standard_errors(per_prompt))
  return out


# ----------------------------------------------------------------------------------------------------------
# Fields recomputed whenever rows are tabled (DERIVED)
# ----------------------------------------------------------------------------------------------------------
def with_derived(rows: List[dict], summaries: dict, proj: Optional[dict], replayed: dict) -> List[dict]:
  """Rows with their DERIVED fields recomputed: `summaries` maps (task, sampling) to the depth JSON (or None),
  `proj` is projection.json, `replayed` maps (task, label) to the replay's rows."""
  out = []
  for x in rows:
    s = summaries[(x["task"], x["sampling"])]
    y = {k: v for k, v in x.items() if k not in DERIVED}
    y.update(**theorem1_fields(x, s), **curve_fields(x, s), **projection_fields(x, proj))
    y.update(**replay_fields(x, replayed), **min_ratio_fields(x))
    out.append(y)
  return out


def theorem1_fields(row: dict, depths: Optional[dict]) -> dict:
  """Theorem 1 on a two-proposal LoopSpec row: restart rate vs 2 * eps2 (gated), eps2 = measured E[TV(p_d2, p_R)].

  `theorem1_applies` is False when spawns were skipped (lanes at capacity): a commit whose child lane was never
  created counts as a restart too, which the theorem does not cover.
  """
  if depths is None or row["method"] != methods.LoopSpec.name or row["d2"] is None or "p_restart" not in row:
    return {}
  eps2 = depths["mean_tv"][row["d2"] - 1]
  return {
      "eps2": eps2,
      "theorem1": theory.theorem1_check(row["p_restart"], eps2, gated=True),
      "theorem1_applies": row.get("skipped_spawns", 0) == 0,
  }


def curve_fields(row: dict, depths: Optional[dict]) -> dict:
  """gamma of a LoopSpec row predicted from the depth curve alone (no decoding), three ways.

  gamma_curve: the cost identity with P(reject x1) = measured E[TV(p_d1, p_R)] and P(restart) =
  E[TV(p_d2, p_R)] (greedy: the disagreement rates) read off the measured depth curve;
  gamma_fit: the same with the least-squares power law (`theory.curve_gamma`);
  gamma_bound: Theorem 2's guaranteed R / J from the envelope (a lower bound, with 2 eps2 and d2 for d2 - d1).
  """
  if depths is None or row["method"] != methods.LoopSpec.name:
    return {}
  r, d1, d2 = row["R"], row["d1"], row["d2"]
  tv = depths["mean_tv"]
  p1 = min(tv[d1 - 1], 1.0)
  out = {"gamma_curve": theory.expected_gamma(r, d1, d2, p1, None if d2 is None else min(tv[d2 - 1], p1))}
  fits = depths.get("fits") or {}
  ls, env = fits.get("least_squares"), fits.get("envelope")
  if ls:
    out["gamma_fit"] = theory.curve_gamma(r, d1, d2, ls["beta"], ls["alpha"])
  if env and env["alpha"] > 0:
    out["cost_bound"] = theory.cost_bound(r, d1, d2, env["beta"], env["alpha"])
    out["gamma_bound"] = r / out["cost_bound"]
  return out


def min_ratio_fields(row: dict) -> dict:
  """wall_clock_ratio_min: fastest interleaved AR pass / fastest pass of the configuration. On a loaded machine
  other processes only ever add time, so each side's minimum is its least-disturbed pass (a second estimate
  beside the median of the paired ratios)."""
  ar, t = row.get("ar_decode_seconds_interleaved"), row.get("decode_seconds_all")
  if not ar or not t:
    return {}
  return {"wall_clock_ratio_min": min(ar) / max(min(t), 1e-12)}


def replay_fields(row: dict, replay: Dict[Tuple[str, str], dict]) -> dict:
  """An engine row against the greedy replay on the same prompts (the replay's first `num_prompts`).

  gamma_all_spawns: the gamma the engine would measure if every spawn were granted (Theorem 1's setting);
  below it, skipped second proposals (lane table full) turned would-be second-proposal commits into restarts.
  replay_first_matches: every prompt's first-proposal commits equal the replay's (they never need lane space).
  """
  y = replay.get((row["task"], row["label"]))
  if y is None or row["method"] != methods.LoopSpec.name or "per_prompt" not in row or row["sampling"] != "greedy":
    return {}
  n = len(row["per_prompt"])
  pp = y["per_prompt"][:n]
  if len(pp) < n or [p[0] for p in pp] != [p[0] for p in row["per_prompt"]]:
    return {}
  tot = [sum(col) for col in zip(*pp)]
  return {
      "gamma_all_spawns": theory.gamma_from_counts(row["R"], row["d1"], row["d2"], tot[0], tot[4], tot[3]),
      "replay_first_matches": all(a[1] == b[1] for a, b in zip(pp, row["per_prompt"])),
  }


def projection_key(row: dict) -> Optional[str]:
  """The compiled loop a row's projection needs: its per-iteration cost depends on d1 and on whether a second
  lane column exists (LoopSpec), or on d1 and the draft length (chain), not on d2 or on acceptance."""
  if row["method"] == methods.AR.name:
    return "ar"
  if row["method"] == methods.LoopSpec.name:
    return f"loopspec:d1={row['d1']},second={int(row['d2'] is not None)}"
  if row["method"] == methods.Chain.name:
    return f"chain:d1={row['d1']},gamma={row['draft_len']}"
  return None


def projection_fields(row: dict, proj: Optional[dict]) -> dict:
  """The projected ratio vs AR on the accelerator at the real shape, from the row's measured gamma:
  LoopSpec commits gamma d1 / R tokens per tick, chain its measured tokens per round, AR one per token."""
  if not proj or "ar" not in proj["loops"]:
    return {}
  k = projection_key(row)
  loop = proj["loops"].get(k) if k else None
  if loop is None:
    return {}
  if row["method"] == methods.LoopSpec.name:
    per_iter = row["mean_accepted_length"] * row["d1"] / row["R"]
  elif row["method"] == methods.Chain.name:
    per_iter = row["tokens_per_round"]
  else:
    per_iter = 1.0
  return {"projected_ratio": per_iter / loop["seconds"] * proj["loops"]["ar"]["seconds"]}
