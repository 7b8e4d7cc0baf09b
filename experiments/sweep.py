"""(d1, d2) and chain-gamma sweep against AR, compared with the cost identity and Theorem 2's prediction.

Per (task, sampling): an AR reference (measured once, stored as a row and reused for every ratio, also by
a resumed run), then every LoopSpec pair of the grid (`theory.feasible_configs`, optionally restricted) and
the chain baseline for each draft length at one draft depth. Each configuration decodes every prompt once
untimed (compile) and `repeats` times timed (decode after prefill, summed over prompts, median). A row
holds the wall-clock ratio to AR, gamma (mean accepted length; LoopSpec also the tick-based value), commit
sources, gate-open and rejection rates, the cost C and gamma = R / C predicted from the measured rates
(`theory.expected_cost` with P(reject x1) = reject_first / N, P(restart) = restart / N), and for greedy
decoding whether the tokens equal AR's. Rows are appended to <out_dir>/sweep.jsonl one at a time (a single
fsynced line); a rerun skips keys already present (model, task, sampling, method config, prompt settings),
so a killed sweep loses at most the configuration in flight and never duplicates one. <out_dir>/sweep.md
tables every group and marks the measured best and Theorem 2's predicted best (from the depth JSON).

The classic speculative baselines can be rows of the same run: a separate draft model (`draft_model`, a bundled
name or checkpoint loaded once, for each of `draft_gammas`, "auto" allowed) and prompt lookup (`lookup_ngram`,
`lookup_gammas`). Their rows hold tokens per verify pass, the acceptance rate (accepted / offered drafts), the
per-draft acceptance alpha (accepted / examined drafts), drafts offered per pass and the draft cost share
(`decoding/draft.py` `summarize`, recomputed from the summed counts), and a table compares every method of the
group (AR, chain, draft, lookup, LoopSpec) by those and the wall-clock ratio.

  loopspec-sweep                                    # configs/sweeps/default.py
  loopspec-sweep --config=sweeps/default.py:quick   # a few configurations
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Dict, List, Optional, Tuple

from absl import flags
from absl import logging
from ml_collections import config_flags
from tqdm import tqdm

import loopspec_jax
from loopspec_jax.analysis import cost
from loopspec_jax.analysis import depth_metrics as DA
from loopspec_jax.analysis import theory
from loopspec_jax.configs import accelerators
from loopspec_jax.configs.models import model_config
from loopspec_jax.experiments import common
from loopspec_jax.parallel import distributed

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("sweeps/default.py"), "Sweep settings.", flag_values=FLAGS
)


class SweepInterrupted(RuntimeError):
  """Raised after `stop_after` new rows (the config's stand-in for a killed sweep)."""


def _ints(text) -> List[int]:
  return [int(x) for x in common.split_list(text)]


def loopspec_grid(cfg, r: int) -> List[Tuple[int, Optional[int]]]:
  """The (d1, d2) pairs to sweep: an explicit 'd1,d2;...' list, or the feasible grid restricted by d1s/d2s."""
  if cfg.get("configs"):
    out = []
    feasible = set(theory.feasible_configs(r, include_single=True))
    for item in str(cfg.configs).split(";"):
      a, b = (x.strip() for x in item.split(","))
      pair = (int(a), common.parse_optional_int(b))
      if pair not in feasible:
        raise ValueError(f"configuration {pair} is not feasible for R={r}")
      out.append(pair)
    return out
  d1s, d2s = set(_ints(cfg.get("d1s", ""))), set(_ints(cfg.get("d2s", "")))
  out = []
  for d1, d2 in theory.feasible_configs(r, include_single=cfg.include_single):
    if d1s and d1 not in d1s:
      continue
    if d2s and d2 is not None and d2 not in d2s:
      continue
    out.append((d1, d2))
  return out


def _gammas(text) -> list:
  """'4,auto' -> [4, 'auto'] (draft lengths of the draft-model and lookup rows)."""
  return [g if g == "auto" else int(g) for g in common.split_list(text)]


SPECULATIVE = ("draft", "lookup")  # the separate-drafter baselines (decoding/draft.py, decoding/lookup.py)


def method_specs(cfg, r: int) -> List[Tuple[str, dict]]:
  """(method, arguments) of every row but AR: the LoopSpec grid, chain, draft model and prompt lookup.

  A draft row names its drafter (`draft_model`, the config's string), so its key and label say which one;
  `decode_all` passes the loaded model in its place."""
  specs = [("loopspec", {"d1": d1, "d2": d2}) for d1, d2 in loopspec_grid(cfg, r)]
  if cfg.get("chain_d1"):
    specs += [("chain", {"d1": int(cfg.chain_d1), "gamma": g}) for g in _ints(cfg.chain_gammas)]
  if cfg.get("draft_model"):
    specs += [("draft", {"draft_model": str(cfg.draft_model), "gamma": g}) for g in _gammas(cfg.draft_gammas)]
  if cfg.get("lookup_ngram"):
    specs += [("lookup", {"ngram": int(cfg.lookup_ngram), "gamma": g}) for g in _gammas(cfg.lookup_gammas)]
  return specs


_DRAFTERS: Dict[str, object] = {}


def load_drafter(spec: str, model=None):
  """The draft model of `spec` (a bundled name or checkpoint directory), loaded once per process; `model`
  registers an already built one under that name (tests, a caller that loaded it)."""
  if model is not None:
    _DRAFTERS[spec] = model
  if spec not in _DRAFTERS:
    _DRAFTERS[spec] = common.resolve_model(spec)
  return _DRAFTERS[spec]


def decode_all(model, prompts, name, kw, sampling, max_new_tokens, seed, eos_id, lane_capacity):
  """One pass over the prompts, one request at a time (request id = prompt index); stats and tokens.

  A draft row's `draft_model` (a name) is replaced by the model `load_drafter` loaded once."""
  stats, outputs = [], []
  extra = {"lane_capacity": lane_capacity} if name == "loopspec" and lane_capacity else {}
  if name == "draft":
    kw = dict(kw, draft_model=load_drafter(kw["draft_model"]))
  for i, p in enumerate(prompts):
    res = loopspec_jax.generate(
        model,
        [p],
        max_new_tokens=max_new_tokens,
        method=name,
        seed=seed,
        eos_id=eos_id,
        request_ids=[i],
        **sampling,
        **kw,
        **extra,
    )
    stats.append(res.stats)
    outputs.append(res.tokens[0])
  return stats, outputs


def measure(
    model,
    prompts,
    name,
    kw,
    sampling,
    *,
    max_new_tokens,
    repeats,
    seed,
    eos_id,
    lane_capacity=None,
    interleave_ar=False,
):
  """Warm-up pass plus `repeats` timed passes; returns (aggregated stats, decode seconds, outputs, AR seconds,
  per-prompt stats).

  With interleave_ar, every timed pass of the configuration is preceded by a timed AR pass over the same
  prompts (AR is already compiled, so this costs AR's decode time only): on a shared, loaded machine the load
  drifts over a long sweep, and a ratio of passes taken seconds apart tracks the configuration, not the drift.
  """
  args = (model, prompts)
  rest = (sampling, max_new_tokens, seed, eos_id, lane_capacity)
  stats, outputs = decode_all(*args, name, kw, *rest)
  times, ar_times = [], []
  for _ in range(max(1, repeats)):
    if interleave_ar and name != "ar":
      st, _ = decode_all(*args, "ar", {}, *rest)
      ar_times.append(sum(s["decode_seconds"] for s in st))
    st, _ = decode_all(*args, name, kw, *rest)
    times.append(sum(s["decode_seconds"] for s in st))
    stats = st
  return aggregate(stats, model.config.recurrence), times, outputs, ar_times, stats


def aggregate(stats: List[dict], r: int) -> dict:
  """`common.aggregate`, plus for draft / lookup the round counts of `decoding/draft.py` `summarize` recomputed
  from the per-prompt sums: tokens per verify pass (also their mean_accepted_length, the library's value),
  acceptance_rate = accepted / offered drafts, alpha = accepted / examined drafts, mean_gamma = drafts offered
  per pass, and draft_cost_share = drafter layer calls / all layer calls (each prompt's drafter calls recovered
  from its share and its verify passes, whose layer calls are the same per pass for every prompt)."""
  out = common.aggregate(stats, r)
  if not stats or stats[0]["method"] not in SPECULATIVE:
    return out
  tot = lambda k: sum(s.get(k, 0) for s in stats)
  n, rounds, accepted, drafted = out["tokens"], tot("rounds"), out["commits"]["first"], tot("drafted")
  examined = sum(sum((s.get("per_request") or {}).get("examined", [])) for s in stats)
  share = [(s.get("draft_cost_share", 0.0), s.get("ticks", 0)) for s in stats]
  d_calls = sum(t * a / max(1.0 - a, 1e-12) for a, t in share)  # in units of one verify pass's layer calls
  tpr = n / max(rounds, 1)
  out.update(
      rounds=rounds,
      accepted=accepted,
      drafted=drafted,
      examined=examined,
      tokens_per_round=tpr,
      mean_accepted_length=tpr,
      acceptance_rate=accepted / max(drafted, 1),
      alpha=accepted / max(examined, 1) if examined else None,
      mean_gamma=drafted / max(rounds, 1),
      draft_cost_share=d_calls / max(d_calls + sum(t for _, t in share), 1e-12),
  )
  return out


def per_prompt_counts(name: str, stats: List[dict]) -> List[List[int]]:
  """Per-prompt counts that determine gamma: LoopSpec [N, first, second, restart, reject_first]; chain
  [N, rounds, accepted drafts]; draft / lookup [N, rounds, accepted, offered, examined drafts]; AR [N]. Kept in
  the rows so standard errors can be taken across prompts."""
  out = []
  for s in stats:
    n, c = s["tokens_generated"], s["commits"]
    if name == "loopspec":
      out.append([n, c["first"], c["second"], c["restart"], s.get("reject_first", c["second"] + c["restart"])])
    elif name == "chain":
      out.append([n, s.get("rounds", 0), c["first"]])
    elif name in SPECULATIVE:
      examined = sum((s.get("per_request") or {}).get("examined", []))
      out.append([n, s.get("rounds", 0), c["first"], s.get("drafted", 0), examined])
    else:
      out.append([n])
  return out


def jackknife_se(values: List[float]) -> float:
  """Leave-one-out (jackknife) standard error of a statistic from its k leave-one-prompt-out values."""
  k = len(values)
  if k < 2:
    return 0.0
  v = [float(x) for x in values]
  m = sum(v) / k
  return float(((k - 1) / k * sum((x - m) ** 2 for x in v)) ** 0.5)


def gamma_standard_error(name: str, r: int, kw: dict, counts: List[List[int]]) -> Optional[float]:
  """Jackknife standard error of gamma over prompts (each prompt's commits left out in turn); draft / lookup:
  of tokens per verify pass."""
  if len(counts) < 2 or name not in ("loopspec", "chain") + SPECULATIVE:
    return None
  tot = [sum(col) for col in zip(*counts)]
  loo = []
  for c in counts:
    t = [a - b for a, b in zip(tot, c)]
    if t[0] <= 0:
      return None
    if name == "loopspec":
      loo.append(theory.gamma_from_counts(r, kw["d1"], kw.get("d2"), t[0], t[2] + t[3], t[3]))
    elif name in SPECULATIVE:  # tokens per verify pass
      if t[1] <= 0:
        return None
      loo.append(t[0] / t[1])
    else:
      loo.append(theory.chain_accepted_length(r, kw["d1"], kw["gamma"], t[0], t[1]))
  return jackknife_se(loo)


def make_row(
    base: dict,
    name: str,
    kw: dict,
    agg: dict,
    times: list,
    r: int,
    ar_row: Optional[dict],
    outputs: list,
    greedy: bool,
    ar_times: Optional[list] = None,
    per_prompt: Optional[List[List[int]]] = None,
) -> dict:
  """A result row: timings, gamma, rates and the cost-identity prediction.

  With interleaved AR passes (`ar_times`, one before each timed pass) the wall-clock ratio is the median of
  the paired per-pass ratios; `wall_clock_ratio_reference` is the ratio to the group's AR row (timed once,
  at the start of the group) either way.
  """
  n = agg["tokens"]
  c = agg["commits"]
  row = dict(base)
  row.update(
      {
          "method": name,
          "label": common.method_label(name, kw),
          "R": r,
          "d1": kw.get("d1"),
          "d2": kw.get("d2") if name == "loopspec" else None,
          "draft_len": kw.get("gamma") if name in ("chain",) + SPECULATIVE else None,
          "tokens": n,
          "decode_seconds_median": statistics.median(times),
          "decode_seconds_all": times,
          "prefill_seconds": agg["prefill_seconds"],
          "tokens_per_second": n / max(statistics.median(times), 1e-9),
          "mean_accepted_length": agg["mean_accepted_length"],
          "commits": c,
          "gate_open_rate": agg["gate_open_rate"],
          "skipped_spawns": agg["skipped_spawns"],
          "core_step_calls_per_token": agg["core_step_calls_per_token"],
          "time": time.strftime("%Y-%m-%d %H:%M:%S"),
      }
  )
  if per_prompt is not None:
    row["per_prompt"] = per_prompt
    row["gamma_se"] = gamma_standard_error(name, r, kw, per_prompt)
  if ar_row is not None:
    row["ar_decode_seconds_median"] = ar_row["decode_seconds_median"]
    row["wall_clock_ratio_reference"] = ar_row["decode_seconds_median"] / max(row["decode_seconds_median"], 1e-12)
    row["wall_clock_ratio"] = row["wall_clock_ratio_reference"]
    if ar_times:
      row["ar_decode_seconds_interleaved"] = ar_times
      paired = [a / max(t, 1e-12) for a, t in zip(ar_times, times)]
      row["wall_clock_ratios_paired"] = paired
      row["wall_clock_ratio"] = statistics.median(paired)
    row["identical_to_ar"] = (outputs == ar_row["outputs"]) if greedy else None
  else:
    row["wall_clock_ratio"] = 1.0
    row["outputs"] = outputs
  if name == "loopspec" and n > 0:
    d1, d2 = kw["d1"], kw.get("d2")
    row["reject_first"] = agg["reject_first"]
    row["p_reject_first_commits"] = (c["second"] + c["restart"]) / n  # as the release's gamma counts it
    row["tokens_per_r_steps"] = r * n / max(agg["request_ticks"] * d1, 1)  # gamma from the pipeline's ticks
    row["max_live_lanes"] = agg["max_live_lanes"]
    row.update(DA.predicted_loopspec(r, d1, d2, n, agg["reject_first"], c["restart"]))
    row["reject_rate_first"] = row["p_reject_first"]
    row["restart_rate"] = row["p_restart"]
    if per_prompt is not None and len(per_prompt) > 1:
      counts = [p[0] for p in per_prompt]
      row["p_reject_first_se"] = float(DA.ratio_standard_error([[p[4]] for p in per_prompt], counts)[0])
      row["p_restart_se"] = float(DA.ratio_standard_error([[p[3]] for p in per_prompt], counts)[0])
  if name == "chain" and agg["rounds"]:
    g = kw["gamma"]
    row["rounds"] = agg["rounds"]
    row["tokens_per_round"] = agg["tokens_per_round"]
    row["acceptance_rate"] = agg["acceptance_rate"]  # accepted drafts / drafted
    row["implied_iid_acceptance"] = DA.implied_chain_acceptance(g, agg["tokens_per_round"])
  if name in SPECULATIVE:
    for k in ("rounds", "tokens_per_round", "acceptance_rate", "alpha", "drafted", "examined", "mean_gamma"):
      row[k] = agg[k]
    row["draft_cost_share"] = agg["draft_cost_share"]
    row["draft_model"] = kw.get("draft_model")  # the config's name (None for lookup)
    row["ngram"] = kw.get("ngram")
  return row


def load_depth_summary(cfg, task: str, samp: str, r: int) -> Optional[dict]:
  """The depth-analysis JSON of this (task, sampling) (`depths_json` pattern), or None if absent / other R."""
  pattern = cfg.get("depths_json") or ""
  if not pattern:
    return None
  path = pattern.format(task=task, sampling=samp)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    s = json.load(f)
  if s.get("recurrence") != r:
    logging.warning("%s has R=%s, not %d: ignored", path, s.get("recurrence"), r)
    return None
  s["path"] = path
  return s


def theorem1_fields(row: dict, depths: Optional[dict]) -> dict:
  """Theorem 1 on a two-proposal LoopSpec row: restart rate vs 2 * eps2 (gated), eps2 = measured E[TV(p_d2, p_R)].

  `theorem1_applies` is False when spawns were skipped (lanes at capacity): a commit whose child lane was never
  created counts as a restart too, which the theorem does not cover.
  """
  if depths is None or row["method"] != "loopspec" or row["d2"] is None or "p_restart" not in row:
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
  if depths is None or row["method"] != "loopspec":
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
  if y is None or row["method"] != "loopspec" or "per_prompt" not in row or row["sampling"] != "greedy":
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


def load_prediction(cfg, task: str, samp: str, r: int) -> Optional[dict]:
  """Theorem 2's prediction from the depth JSON of this (task, sampling), or None."""
  s = load_depth_summary(cfg, task, samp, r)
  env = None if s is None else (s.get("fits") or {}).get("envelope")
  if not env or env["alpha"] <= 0:
    return None
  path = s["path"]
  beta, alpha = env["beta"], env["alpha"]
  swept = loopspec_grid(cfg, r)
  best = theory.best_feasible_depths(r, beta, alpha, include_single=cfg.include_single)
  tie = lambda p: (p[0], r if p[1] is None else p[1])
  best_swept = min(swept, key=lambda p: (theory.cost_bound(r, p[0], p[1], beta, alpha),) + tie(p)) if swept else None
  out = {
      "path": path,
      "beta": beta,
      "alpha": alpha,
      "optimal_continuous": list(theory.optimal_depths(r, beta, alpha)),
      "best_feasible": list(best),
      "best_swept": list(best_swept) if best_swept else None,
      "best_feasible_two_proposal": (s.get("theorem2") or {}).get("best_feasible_two_proposal"),
  }
  ls = s["fits"].get("least_squares")
  if ls:  # the pair the fitted curve's point estimate of gamma prefers (not Theorem 2's bound)
    feas = theory.feasible_configs(r, include_single=cfg.include_single)
    key = lambda p: (-theory.curve_gamma(r, p[0], p[1], ls["beta"], ls["alpha"]),) + tie(p)
    out["best_fit"] = list(min(feas, key=key))
  return out


def run_sweep(cfg, model=None, draft_model=None) -> dict:
  """Runs (or resumes) the sweep; returns {'rows': all rows of this run's keys, 'table': markdown}.

  `draft_model`: an already built drafter for the config's `draft_model` name (else it is loaded once)."""
  model = model or common.load_model(cfg)
  if cfg.get("draft_model") and draft_model is not None:
    load_drafter(str(cfg.draft_model), draft_model)
  r = model.config.recurrence
  ident = common.model_identity(cfg)
  label = cfg.get("model_label") or cfg.model
  eos_id = cfg.get("eos_id")
  jsonl = os.path.join(cfg.out_dir, "sweep.jsonl")
  # process 0's rows on every process (only it may see the file), so all processes skip the same keys
  existing = {
      row["key"]: row for row in distributed.broadcast_json(DA.read_jsonl(jsonl) if common.is_main_process() else None)
  }
  specs = method_specs(cfg, r)
  groups = [(t, s) for t in common.split_list(cfg.tasks) for s in common.split_list(cfg.samplings)]
  bar = tqdm(total=len(groups) * (len(specs) + 1), desc="sweep", disable=not cfg.get("progress", True))
  new_rows = 0
  keys_of_run = []
  try:
    prompts_by_task = {}
    for task, samp in groups:
      if task not in prompts_by_task:
        prompts_by_task[task] = common.prompts_for(cfg, task, model)
      prompts = prompts_by_task[task]
      sampling = dict(cfg.sampling_settings[samp])
      greedy = float(sampling.get("temperature", 0.0)) == 0.0
      base_key = dict(
          ident,
          task=task,
          sampling=sampling,
          num_prompts=len(prompts),
          max_new_tokens=cfg.max_new_tokens,
          prompt_len=cfg.prompt_len if task == "random" else None,
          max_prompt_tokens=cfg.get("max_prompt_tokens"),
          eos_id=eos_id,
      )
      if cfg.get("lane_capacity"):  # part of the key only when set (rows of the default capacity keep theirs)
        base_key["lane_capacity"] = cfg.lane_capacity
      base = {
          "model": label,
          "task": task,
          "sampling": samp,
          "sampling_settings": sampling,
          "num_prompts": len(prompts),
          "max_new_tokens": cfg.max_new_tokens,
          "repeats": cfg.repeats,
          "lane_capacity": cfg.get("lane_capacity"),
      }
      measure_kw = dict(
          max_new_tokens=cfg.max_new_tokens,
          repeats=cfg.repeats,
          seed=cfg.seed,
          eos_id=eos_id,
          lane_capacity=cfg.get("lane_capacity"),
          interleave_ar=bool(cfg.get("interleave_ar", False)),
      )
      ar_key = DA.run_key(**base_key, method="ar")
      print(f"sweep {label} / {task} / {samp}: {len(prompts)} prompts, {len(specs)} configurations", flush=True)
      for name, kw in [("ar", {})] + specs:
        key = DA.run_key(**base_key, method=common.method_label(name, kw))
        keys_of_run.append(key)
        if key in existing:
          bar.update(1)
          continue
        if cfg.get("stop_after") and new_rows >= cfg.stop_after:
          raise SweepInterrupted(f"stopped after {new_rows} new rows (stop_after)")
        bar.set_postfix_str(f"{task}/{samp}/{common.method_label(name, kw)}")
        agg, times, outputs, ar_times, stats = measure(model, prompts, name, kw, sampling, **measure_kw)
        ar_row = None if name == "ar" else existing[ar_key]  # AR comes first in every group
        row = make_row(
            dict(base, key=key),
            name,
            kw,
            agg,
            times,
            r,
            ar_row,
            outputs,
            greedy,
            ar_times=ar_times,
            per_prompt=per_prompt_counts(name, stats),
        )
        if common.is_main_process():  # one row per configuration, however many processes run the sweep
          DA.append_jsonl(jsonl, row)
        existing[key] = row
        new_rows += 1
        bar.update(1)
      common.release_compiled()  # as the bench does between groups (JIT code mappings)
  finally:
    bar.close()
    summaries = {(t, s): load_depth_summary(cfg, t, s, r) for t, s in groups}
    rows = [existing[k] for k in keys_of_run if k in existing]
    # recomputed from the current depth JSON, never stored
    derived = ("eps2", "theorem1", "theorem1_applies", "gamma_curve", "gamma_fit", "gamma_bound", "cost_bound")
    derived += ("projected_ratio", "gamma_all_spawns", "replay_first_matches", "wall_clock_ratio_min")
    proj = load_projection(cfg)
    replay_path = cfg.get("replay_jsonl") or os.path.join(cfg.out_dir, "replay.jsonl")
    replayed = {(y["task"], y["label"]): y for y in DA.read_jsonl(replay_path, repair=False)}
    rows = [
        dict(
            {k: v for k, v in x.items() if k not in derived},
            **theorem1_fields(x, summaries[(x["task"], x["sampling"])]),
            **curve_fields(x, summaries[(x["task"], x["sampling"])]),
            **projection_fields(x, proj),
            **replay_fields(x, replayed),
            **min_ratio_fields(x),
        )
        for x in rows
    ]
    preds = {(t, s): load_prediction(cfg, t, s, r) for t, s in groups}
    table = summary_markdown(rows, preds)
    if common.is_main_process() and rows:
      common.atomic_write_text(os.path.join(cfg.out_dir, cfg.get("table_md") or "sweep.md"), table + "\n")
  return {"rows": rows, "table": table, "predictions": preds}


# ----------------------------------------------------------------------------------------------------------
# Greedy replay: gamma of every feasible configuration without decoding it
# ----------------------------------------------------------------------------------------------------------
def _depth_records(cfg, task: str, prompts: list) -> Dict[int, dict]:
  """Greedy depth-analysis records (index -> record) of `task` whose prompts equal ours, from depths.jsonl."""
  path = cfg.get("depths_jsonl") or ""
  if not path:
    pattern = cfg.get("depths_json") or ""
    if not pattern:
      return {}
    path = os.path.join(os.path.dirname(pattern), "depths.jsonl")
  out = {}
  for rec in DA.read_jsonl(path, repair=False):
    try:
      key = json.loads(rec["key"])
    except (KeyError, TypeError, json.JSONDecodeError):
      continue
    i = rec.get("index", -1)
    greedy = float((key.get("sampling") or {}).get("temperature", 0.0)) == 0.0
    if (
        key.get("task") == task
        and greedy
        and key.get("max_new_tokens") == cfg.max_new_tokens
        and 0 <= i < len(prompts)
        and rec["prompt"] == list(prompts[i])
    ):
      out[i] = rec
  return out


def replay_rows(cfg, model=None) -> dict:
  """Greedy gamma of every configuration of the grid (and chain draft length) on every task, by replay.

  For each task, the first `replay_prompts` prompts are decoded greedily at full depth (or their AR tokens
  are taken from the depth analysis's records), their `DA.greedy_agreement` bits computed in one forward per
  prompt, and `DA.replay_loopspec_counts` / `DA.replay_chain_counts` give every configuration's commits, hence
  gamma exactly as the engine would count it (no skipped spawns assumed). Writes <out_dir>/replay.jsonl
  (rewritten whole: it is cheap) and replay.md; returns {'rows', 'table', 'predictions'}.
  """
  model = model or common.load_model(cfg)
  r = model.config.recurrence
  label = cfg.get("model_label") or cfg.model
  grid = loopspec_grid(cfg, r)
  chain = [int(cfg.chain_d1), _ints(cfg.chain_gammas)] if cfg.get("chain_d1") else None
  rows = []
  n_prompts = int(cfg.get("replay_prompts") or cfg.num_prompts)
  for task in common.split_list(cfg.tasks):
    sub = dict(cfg.to_dict())
    sub["num_prompts"] = n_prompts
    prompts = common.prompts_for(_Cfg(sub), task, model)
    recs = _depth_records(cfg, task, prompts)
    agree = []
    for i, p in enumerate(prompts):
      if i in recs:
        tokens = recs[i]["tokens"]
      else:
        res = loopspec_jax.generate(model, [p], max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, request_ids=[i])
        tokens = res.tokens[0]
      agree.append(DA.greedy_agreement(model, p, tokens))
    base = {
        "model": label,
        "task": task,
        "sampling": "greedy",
        "sampling_settings": {"temperature": 0.0},
        "num_prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens,
        "source": "replay",
        "from_depth_records": len(recs),
        "R": r,
    }
    n_tok = sum(a.shape[1] for a in agree)
    for d1, d2 in grid:
      per = [DA.replay_loopspec_counts(a, d1, d2) for a in agree]
      counts = [[c["n"], c["first"], c["second"], c["restart"], c["reject_first"]] for c in per]
      tot = [sum(col) for col in zip(*counts)]
      c = {"first": tot[1], "second": tot[2], "restart": tot[3]}
      row = dict(base, method="loopspec", label=common.method_label("loopspec", {"d1": d1, "d2": d2}))
      row.update(d1=d1, d2=d2, draft_len=None, tokens=n_tok, commits=c, per_prompt=counts)
      row["mean_accepted_length"] = theory.gamma_from_counts(r, d1, d2, n_tok, tot[4], tot[3])
      row["gamma_se"] = gamma_standard_error("loopspec", r, {"d1": d1, "d2": d2}, counts)
      row.update(DA.predicted_loopspec(r, d1, d2, n_tok, tot[4], tot[3]))
      row["p_reject_first_se"] = float(DA.ratio_standard_error([[x[4]] for x in counts], [x[0] for x in counts])[0])
      row["p_restart_se"] = float(DA.ratio_standard_error([[x[3]] for x in counts], [x[0] for x in counts])[0])
      rows.append(row)
    if chain:
      d1, gammas = chain
      for g in gammas:
        per = [DA.replay_chain_counts(a, d1, g) for a in agree]
        counts = [[c["n"], c["rounds"], c["accepted"]] for c in per]
        rounds, acc = sum(x[1] for x in counts), sum(x[2] for x in counts)
        row = dict(base, method="chain", label=common.method_label("chain", {"d1": d1, "gamma": g}))
        row.update(d1=d1, d2=None, draft_len=g, tokens=n_tok, rounds=rounds, per_prompt=counts)
        row["commits"] = {"first": acc, "second": 0, "restart": n_tok - acc}
        row["mean_accepted_length"] = theory.chain_accepted_length(r, d1, g, n_tok, rounds)
        row["gamma_se"] = gamma_standard_error("chain", r, {"d1": d1, "gamma": g}, counts)
        row["tokens_per_round"] = n_tok / rounds
        row["acceptance_rate"] = acc / max(rounds * g, 1)
        rows.append(row)
    print(f"replay {label} / {task}: {len(prompts)} prompts, {n_tok} tokens, {len(grid)} pairs", flush=True)
  summaries = {t: load_depth_summary(cfg, t, "greedy", r) for t in common.split_list(cfg.tasks)}
  proj = load_projection(cfg)
  rows = [dict(x, **curve_fields(x, summaries[x["task"]]), **theorem1_fields(x, summaries[x["task"]])) for x in rows]
  rows = [dict(x, **projection_fields(x, proj)) for x in rows]
  preds = {(t, "greedy"): load_prediction(cfg, t, "greedy", r) for t in common.split_list(cfg.tasks)}
  table = replay_markdown(rows, preds)
  if common.is_main_process():
    text = "".join(json.dumps(x, default=DA._json_default) + "\n" for x in rows)
    common.atomic_write_text(os.path.join(cfg.out_dir, "replay.jsonl"), text)
    common.atomic_write_text(os.path.join(cfg.out_dir, "replay.md"), table + "\n")
  return {"rows": rows, "table": table, "predictions": preds}


# ----------------------------------------------------------------------------------------------------------
# Projection onto an accelerator at a real model's shape (loopspec_jax/analysis/cost.py)
# ----------------------------------------------------------------------------------------------------------
def projection_path(cfg) -> str:
  return cfg.get("projection_json") or os.path.join(cfg.out_dir, "projection.json")


def _projection_key(row: dict) -> Optional[str]:
  """The compiled loop a row's projection needs: its per-iteration cost depends on d1 and on whether a second
  lane column exists (LoopSpec), or on d1 and the draft length (chain), not on d2 or on acceptance."""
  if row["method"] == "ar":
    return "ar"
  if row["method"] == "loopspec":
    return f"loopspec:d1={row['d1']},second={int(row['d2'] is not None)}"
  if row["method"] == "chain":
    return f"chain:d1={row['d1']},gamma={row['draft_len']}"
  return None


def project_costs(cfg, rows: List[dict]) -> dict:
  """Compiles (from abstract shapes) one iteration of every loop the rows need at `projection_model`'s shape
  and stores its roofline seconds on `projection_accelerator` in projection.json (resumable, one key at a time)."""

  path = projection_path(cfg)
  data = {}
  if os.path.exists(path):
    with open(path) as f:
      data = json.load(f)
  acc = accelerators.ACCELERATORS[cfg.projection_accelerator]
  pcfg = model_config(cfg.projection_model).replace(dtype="bfloat16", max_len=int(cfg.projection_context))
  meta = {
      "model": cfg.projection_model,
      "context": int(cfg.projection_context),
      "dtype": "bfloat16",
      "accelerator": cfg.projection_accelerator,
      "peak_flops": acc["peak_flops"],
      "hbm_bandwidth": acc["hbm_bandwidth"],
  }
  if data.get("meta") != meta:
    data = {"meta": meta, "loops": {}}
  keys = ["ar"] + sorted({k for k in map(_projection_key, rows) if k and k != "ar"})
  for k in keys:
    if k in data["loops"]:
      continue
    name, kw = common.parse_method(k.replace("second=", "d2="))
    if name == "loopspec":  # any d2 of the right kind: d2 only decides which lanes read out
      kw = {"d1": kw["d1"], "d2": 2 * kw["d1"] if kw["d2"] else None, "lane_capacity": None}
    if name == "loopspec" and kw["d2"] is not None and kw["d2"] >= pcfg.recurrence:
      continue
    compiled = cost.compile_decode_loop(pcfg, name, greedy=True, **kw)
    step = cost.loop_cost(compiled)
    data["loops"][k] = {
        "seconds": cost.step_seconds(step, acc["peak_flops"], acc["hbm_bandwidth"]),
        "flops": step.flops,
        "bytes": step.total_bytes,
        "compile_seconds": compiled.compile_seconds,
    }
    print(f"projection {k}: {data['loops'][k]['seconds'] * 1e3:.2f} ms per iteration", flush=True)
    if common.is_main_process():
      common.atomic_write_json(path, data)
  return data


def load_projection(cfg) -> Optional[dict]:
  path = projection_path(cfg)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def projection_fields(row: dict, proj: Optional[dict]) -> dict:
  """The projected ratio vs AR on the accelerator at the real shape, from the row's measured gamma:
  LoopSpec commits gamma d1 / R tokens per tick, chain its measured tokens per round, AR one per token."""
  if not proj or "ar" not in proj["loops"]:
    return {}
  k = _projection_key(row)
  loop = proj["loops"].get(k) if k else None
  if loop is None:
    return {}
  if row["method"] == "loopspec":
    per_iter = row["mean_accepted_length"] * row["d1"] / row["R"]
  elif row["method"] == "chain":
    per_iter = row["tokens_per_round"]
  else:
    per_iter = 1.0
  return {"projected_ratio": per_iter / loop["seconds"] * proj["loops"]["ar"]["seconds"]}


# ----------------------------------------------------------------------------------------------------------
# The headline: predicted vs measured best over every model, task and sampling that has results
# ----------------------------------------------------------------------------------------------------------
def _best(rows: List[dict], key: str) -> Optional[dict]:
  rows = [x for x in rows if x.get(key) is not None]
  tie = lambda x: (-x["d1"], -(x["R"] if x["d2"] is None else x["d2"]))
  return max(rows, key=lambda x: (x[key],) + tie(x)) if rows else None


def headline_markdown(model_dirs: List[str], wall_clock_subdir: str = "sweep") -> str:
  """The paper's comparison per (model, task, sampling): Theorem 2's predicted pair against the measured best
  by gamma (device independent; replay rows where present, else engine rows) and by wall clock (engine rows,
  this CPU), with the projected accelerator ratio. `model_dirs` hold depths/ and sweep/ of one model each; the
  wall-clock columns read <model_dir>/<wall_clock_subdir>/sweep.jsonl where it exists (e.g. a rerun of the engine
  sweep on a quieter machine), else sweep/."""
  head = [
      "model",
      "task",
      "sampling",
      "depth curve: envelope beta r^-alpha (LS R^2)",
      "(d1*, d2*)",
      "predicted best (Thm 2)",
      "its gamma",
      "measured best gamma",
      "gamma source",
      "best wall clock (CPU, engine; by min/min)",
      "predicted pair on the engine (CPU)",
      "projected x AR at predicted / at best-gamma pair",
  ]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for d in model_dirs:
    engine = DA.read_jsonl(os.path.join(d, "sweep", "sweep.jsonl"), repair=False)
    wc_path = os.path.join(d, wall_clock_subdir, "sweep.jsonl")
    timed = DA.read_jsonl(wc_path if os.path.exists(wc_path) else os.path.join(d, "sweep", "sweep.jsonl"), False)
    replay = DA.read_jsonl(os.path.join(d, "sweep", "replay.jsonl"), repair=False)
    proj = None
    if os.path.exists(os.path.join(d, "sweep", "projection.json")):
      with open(os.path.join(d, "sweep", "projection.json")) as f:
        proj = json.load(f)
    summaries = []
    for name in sorted(os.listdir(os.path.join(d, "depths"))) if os.path.isdir(os.path.join(d, "depths")) else []:
      if name.startswith("depths_") and name.endswith(".json"):
        with open(os.path.join(d, "depths", name)) as f:
          summaries.append(json.load(f))
    order = ("gsm8k", "math500", "mbpp", "humaneval", "shakespeare")
    summaries.sort(
        key=lambda s: (order.index(s["meta"]["task"]) if s["meta"]["task"] in order else 9, s["meta"]["sampling_name"])
    )
    for s in summaries:
      m = s["meta"]
      task, samp, r = m["task"], m["sampling_name"], s["recurrence"]
      env, ls, t2 = s["fits"].get("envelope"), s["fits"].get("least_squares"), s.get("theorem2")
      eng = [
          dict(x, **min_ratio_fields(x))
          for x in engine
          if (x["task"], x["sampling"], x["method"]) == (task, samp, "loopspec")
      ]
      rep = [x for x in replay if (x["task"], x["sampling"], x["method"]) == (task, samp, "loopspec")]
      gamma_rows, source = (rep, f"replay, {rep[0]['num_prompts']} prompts") if rep else (eng, "engine")
      if gamma_rows and not rep:
        source = f"engine, {gamma_rows[0]['num_prompts']} prompts, {len(gamma_rows)} pairs"
      cells = [m.get("model", ""), task, samp]
      cells.append(
          f"{env['beta']:.3g} r^-{env['alpha']:.2f} ({ls['r2']:.2f})"
          if env and ls and ls.get("r2") is not None
          else "-"
      )
      if not t2:
        lines.append("| " + " | ".join(cells + ["-"] * (len(head) - len(cells))) + " |")
        continue
      o, b = t2["optimal_continuous"], t2["best_feasible"]
      cells += [f"({o[0]:.2f}, {o[1]:.2f})", pair_str(*b)]
      find = lambda rs: next((x for x in rs if [x["d1"], x["d2"]] == list(b)), None)
      pg = find(gamma_rows)
      top = _best(gamma_rows, "mean_accepted_length")
      cells.append(_gamma(pg) if pg else "not swept")
      cells.append(f"{pair_str(top['d1'], top['d2'])} {_gamma(top)}" if top else "-")
      cells.append(source if top else "-")
      eng_t = [
          dict(x, **min_ratio_fields(x))
          for x in timed
          if (x["task"], x["sampling"], x["method"]) == (task, samp, "loopspec")
      ] or eng
      wc = _best(eng_t, "wall_clock_ratio_min") or _best(eng_t, "wall_clock_ratio")  # the less load-sensitive one
      wm = lambda x: f"{x['wall_clock_ratio']:.2f}x (min/min {_x(x.get('wall_clock_ratio_min'))})"
      cells.append(f"{pair_str(wc['d1'], wc['d2'])} {wm(wc)}" if wc else "-")
      pe, pt = find(eng), find(eng_t)
      cells.append(
          f"gamma {_gamma(pe)}, {pe['skipped_spawns']} skipped spawns, {wm(pt or pe)}"
          if pe
          else ("not swept" if eng else "-")
      )
      pr = [projection_fields(x, proj).get("projected_ratio") if x else None for x in (pg, top)]
      cells.append(" / ".join("-" if v is None else f"{v:.2f}x" for v in pr) if proj else "-")
      lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


class _Cfg(dict):
  """A plain dict read like a ConfigDict (attribute access, .get) for prompts_for."""

  __getattr__ = dict.__getitem__


def replay_markdown(rows: List[dict], preds: dict) -> str:
  """Per task: the predicted vs measured best of the replayed grid, then gamma of every pair as a d1 x d2 grid."""
  out = []
  for task in dict.fromkeys(x["task"] for x in rows):
    grp = [x for x in rows if x["task"] == task]
    ls = [x for x in grp if x["method"] == "loopspec"]
    pred = preds.get((task, "greedy"))
    out.append(
        f"### {grp[0]['model']} / {task} / greedy (replay): {grp[0]['num_prompts']} prompts, {grp[0]['tokens']} tokens"
    )
    if pred:
      o = pred["optimal_continuous"]
      out.append(
          f"Envelope {pred['beta']:.4g} r^-{pred['alpha']:.3f}; (d1*, d2*) = ({o[0]:.3f}, {o[1]:.3f}); "
          f"Theorem 2 best feasible {pair_str(*pred['best_feasible'])}."
      )
    out += ["", "| | (d1, d2) | gamma ± se | gamma (depth curve) | gamma (fit) | R/J |", "|---|---|---|---|---|---|"]
    for name, x, pair in comparison_rows(grp, pred):
      if "wall clock" in name or "measured rates" in name:
        continue  # no timing in a replay; the rates are the measurement
      if x is None:
        if pair is not None:
          out.append(f"| {name} | {pair_str(*pair)} | not in grid | | | |")
        continue
      out.append(
          f"| {name} | {pair_str(x['d1'], x['d2'])} | {_gamma(x)} | {_f(x.get('gamma_curve'))} | "
          f"{_f(x.get('gamma_fit'))} | {_f(x.get('gamma_bound'))} |"
      )
    d1s = sorted({x["d1"] for x in ls})
    d2s = sorted({x["d2"] for x in ls if x["d2"] is not None})
    out += ["", "gamma by (d1 rows, d2 columns; '-' single proposal):", ""]
    out.append("| d1 \\ d2 | " + " | ".join(str(v) for v in d2s) + " | - |")
    out.append("|" + "---|" * (len(d2s) + 2))
    cell = {(x["d1"], x["d2"]): x["mean_accepted_length"] for x in ls}
    for d1 in d1s:
      vals = [cell.get((d1, d2)) for d2 in d2s + [None]]
      out.append(f"| {d1} | " + " | ".join("" if v is None else f"{v:.2f}" for v in vals) + " |")
    ch = [x for x in grp if x["method"] == "chain"]
    if ch:
      out += [
          "",
          f"Chain (draft depth {ch[0]['d1']}): "
          + ", ".join(
              f"g={x['draft_len']}: gamma {x['mean_accepted_length']:.2f}, {x['tokens_per_round']:.2f} tok/round"
              for x in ch
          ),
      ]
    out.append("")
  return "\n".join(out)


def pair_str(d1, d2) -> str:
  return f"({d1}, {'-' if d2 is None else d2})"


def _thm1(row) -> str:
  t = row.get("theorem1")
  if not t:
    return "-"
  return f"{t['bound']:.3f} " + ("ok" if t["holds"] else "VIOLATED" if row["theorem1_applies"] else "n/a: skips")


def _yes(v) -> str:
  return "-" if v is None else ("yes" if v else "NO")


def _f(x, fmt=".2f") -> str:
  return "-" if x is None or (isinstance(x, float) and x != x) else format(x, fmt)


def _x(v) -> str:
  return "-" if v is None else f"{v:.2f}x"


def _gamma(x) -> str:
  se = x.get("gamma_se")
  return _f(x["mean_accepted_length"]) + ("" if se is None else f" ± {se:.2f}")


def best_rows(rows: List[dict], pred: Optional[dict]) -> Dict[str, Optional[dict]]:
  """The measured best LoopSpec rows (by wall clock, by gamma) and the rows of the predicted pairs."""
  ls = [x for x in rows if x["method"] == "loopspec"]
  find = lambda pair: next((x for x in ls if pair is not None and [x["d1"], x["d2"]] == list(pair)), None)
  tie = lambda x: (x["d1"], x["R"] if x["d2"] is None else x["d2"])
  top = lambda key: max(ls, key=lambda x: (x.get(key, float("-inf")),) + tuple(-v for v in tie(x))) if ls else None
  return {
      "measured": top("wall_clock_ratio"),
      "measured_gamma": top("mean_accepted_length"),
      "rates": top("predicted_gamma"),
      "curve": top("gamma_curve") if any("gamma_curve" in x for x in ls) else None,
      "predicted": find(pred["best_feasible"]) if pred else None,
      "predicted_swept": find(pred["best_swept"]) if pred else None,
      "predicted_fit": find(pred.get("best_fit")) if pred else None,
  }


def comparison_rows(rows: List[dict], pred: Optional[dict]) -> List[Tuple[str, Optional[dict], Optional[list]]]:
  """(name, row or None, pair) of the paper's comparison: the predicted best pairs against the measured best."""
  best = best_rows(rows, pred)
  out = [
      ("measured best by gamma", best["measured_gamma"], None),
      ("measured best by wall clock (this CPU)", best["measured"], None),
  ]
  if pred:
    out.append(("predicted: Theorem 2 best feasible (min J)", best["predicted"], pred["best_feasible"]))
    if pred.get("best_swept") != pred["best_feasible"]:
      out.append(("predicted: Theorem 2 best among swept", best["predicted_swept"], pred["best_swept"]))
    if pred.get("best_fit"):
      out.append(("predicted: fitted curve's best gamma", best["predicted_fit"], pred["best_fit"]))
  if best["curve"] is not None:
    out.append(("predicted: measured depth curve's best gamma", best["curve"], None))
  out.append(("predicted: cost identity on measured rates", best["rates"], None))
  return out


_METHOD_ORDER = ("ar", "chain", "draft", "lookup", "loopspec")


def _method_cell(x: dict) -> str:
  if x["method"] == "loopspec":
    return f"LoopSpec {pair_str(x['d1'], x['d2'])}"
  if x["method"] == "chain":
    return f"chain d1={x['d1']}, gamma={x['draft_len']}"
  if x["method"] == "draft":
    return f"draft {x.get('draft_model')}, gamma={x['draft_len']}"
  if x["method"] == "lookup":
    return f"lookup ngram={x.get('ngram')}, gamma={x['draft_len']}"
  return x.get("label", x["method"])


def baselines_markdown(grp: List[dict]) -> List[str]:
  """Every method of one (task, sampling) group side by side: the speculative baselines' per-pass numbers
  (tokens per verify pass, acceptance, drafts per pass, draft cost share) next to gamma and the wall clock."""
  rows = sorted(
      grp, key=lambda x: _METHOD_ORDER.index(x["method"]) if x["method"] in _METHOD_ORDER else len(_METHOD_ORDER)
  )
  out = [
      "",
      "All methods (tokens / verify pass: AR 1, chain / draft / lookup per full-depth verify pass; acceptance: "
      "accepted / offered drafts; alpha: accepted / examined drafts; gamma: LoopSpec and chain on LoopSpec's "
      "scale, R x tokens / sequential recurrent steps, draft and lookup tokens per verify pass)",
      "",
      "| method | tokens / verify pass | acceptance | alpha | drafts / pass | draft cost share | gamma ± se | "
      "ratio vs AR | ratio (min/min) | ratio vs AR ref. | identical |",
      "|" + "---|" * 11,
  ]
  for x in rows:
    m = x["method"]
    tpr = 1.0 if m == "ar" else x.get("tokens_per_round")
    drafts = x.get("mean_gamma") if m in SPECULATIVE else (x["draft_len"] if m == "chain" else None)
    share = x.get("draft_cost_share") if m in SPECULATIVE else None
    out.append(
        f"| {_method_cell(x)} | {_f(tpr)} | {_f(x.get('acceptance_rate'), '.3f')} | {_f(x.get('alpha'), '.3f')} | "
        f"{_f(drafts)} | {_f(share, '.3f')} | {_gamma(x)} | {x['wall_clock_ratio']:.2f}x | "
        f"{_x(x.get('wall_clock_ratio_min'))} | {_x(x.get('wall_clock_ratio_reference', x['wall_clock_ratio']))} | "
        f"{_yes(x.get('identical_to_ar'))} |"
    )
  return out


def summary_markdown(rows: List[dict], preds: dict) -> str:
  """Markdown tables per (task, sampling): every method side by side (when the group has draft / lookup rows),
  the LoopSpec grid, chain, and measured vs predicted best."""
  out = []
  groups = []
  for x in rows:
    g = (x["task"], x["sampling"])
    if g not in groups:
      groups.append(g)
  for task, samp in groups:
    grp = [x for x in rows if (x["task"], x["sampling"]) == (task, samp)]
    ar = next((x for x in grp if x["method"] == "ar"), None)
    pred = preds.get((task, samp))
    best = best_rows(grp, pred)
    head = f"### {grp[0]['model']} / {task} / {samp}"
    if ar:
      head += (
          f": {ar['num_prompts']} prompts, AR {ar['tokens']} tokens, decode {ar['decode_seconds_median']:.3f} s "
          f"({ar['tokens_per_second']:.1f} tok/s), median of {ar['repeats']}"
      )
    out.append(head)
    if pred:
      o = pred["optimal_continuous"]
      out.append(
          f"Theorem 2 from {pred['path']}: envelope phi(r) = {pred['beta']:.4g} r^-{pred['alpha']:.3f}; "
          f"optimum (d1*, d2*) = ({o[0]:.3f}, {o[1]:.3f}); predicted best feasible "
          f"{pair_str(*pred['best_feasible'])}"
          + (f"; best swept {pair_str(*pred['best_swept'])}" if pred["best_swept"] else "")
          + "."
      )
    if any(x["method"] in SPECULATIVE for x in grp):  # only then: the tables of other sweeps stay as they were
      out += baselines_markdown(grp)
    ls = [x for x in grp if x["method"] == "loopspec"]
    if ls:
      out += [
          "",
          "| (d1, d2) | gamma ± se | gamma (ticks) | gamma R/C (rates) | gamma, all spawns (replay) | "
          "gamma (depth curve) | gamma (fit) | R/J (Thm 2) | ratio vs AR | ratio (min/min) | ratio vs AR ref. | "
          "x AR projected | commits f/s/r | skipped spawns | P(rej x1) | P(restart) | Thm 1 bound | gate open | "
          "identical | mark |",
          "|" + "---|" * 20,
      ]
      for x in ls:
        marks = []
        if best["measured"] is x:
          marks.append("**measured best**")
        if best["measured_gamma"] is x:
          marks.append("**highest gamma**")
        if best["predicted"] is x:
          marks.append("**predicted best**")
        elif best["predicted_swept"] is x:
          marks.append("predicted best (swept)")
        if best["predicted_fit"] is x:
          marks.append("fit's best")
        c = x["commits"]
        out.append(
            f"| {pair_str(x['d1'], x['d2'])} | {_gamma(x)} | "
            f"{_f(x.get('tokens_per_r_steps'))} | {_f(x.get('predicted_gamma'))} | "
            f"{_f(x.get('gamma_all_spawns'))}{'' if x.get('replay_first_matches', True) else ' (first differs!)'} | "
            f"{_f(x.get('gamma_curve'))} | "
            f"{_f(x.get('gamma_fit'))} | {_f(x.get('gamma_bound'))} | {x['wall_clock_ratio']:.2f}x | "
            f"{_x(x.get('wall_clock_ratio_min'))} | "
            f"{_x(x.get('wall_clock_ratio_reference', x['wall_clock_ratio']))} | {_x(x.get('projected_ratio'))} | "
            f"{c['first']}/{c['second']}/{c['restart']} | {x.get('skipped_spawns', 0)} | "
            f"{x.get('p_reject_first', 0):.3f} | "
            f"{x.get('p_restart', 0):.3f} | {_thm1(x)} | {x['gate_open_rate']:.2f} | "
            f"{_yes(x.get('identical_to_ar'))} | "
            f"{' '.join(marks)} |"
        )
    ch = [x for x in grp if x["method"] == "chain"]
    if ch:
      a = DA.fit_chain_acceptance([x["draft_len"] for x in ch], [x["tokens_per_round"] for x in ch])
      out += [
          "",
          f"Chain (draft depth {ch[0]['d1']}; fitted i.i.d. acceptance a = {a:.3f})",
          "",
          "| draft len | gamma ± se | tokens / round | (1-a^(g+1))/(1-a) | drafts accepted | ratio vs AR | "
          "ratio (min/min) | ratio vs AR ref. | x AR projected | identical |",
          "|---|---|---|---|---|---|---|---|---|---|",
      ]
      for x in ch:
        out.append(
            f"| {x['draft_len']} | {_gamma(x)} | {x['tokens_per_round']:.2f} | "
            f"{theory.chain_expected_tokens(a, x['draft_len']):.2f} | {x.get('acceptance_rate', 0):.3f} | "
            f"{x['wall_clock_ratio']:.2f}x | {_x(x.get('wall_clock_ratio_min'))} | "
            f"{_x(x.get('wall_clock_ratio_reference', x['wall_clock_ratio']))} | "
            f"{_x(x.get('projected_ratio'))} | {_yes(x.get('identical_to_ar'))} |"
        )
    if ls:
      out += [
          "",
          "| | (d1, d2) | gamma ± se | gamma, all spawns | gamma (fit) | R/J | ratio vs AR | x AR projected |",
          "|---|---|---|---|---|---|---|---|",
      ]
      for name, x, pair in comparison_rows(grp, pred):
        if x is None:
          if pair is not None:
            out.append(f"| {name} | {pair_str(*pair)} | not swept | | | | | |")
          continue
        out.append(
            f"| {name} | {pair_str(x['d1'], x['d2'])} | {_gamma(x)} | {_f(x.get('gamma_all_spawns'))} | "
            f"{_f(x.get('gamma_fit'))} | {_f(x.get('gamma_bound'))} | {x['wall_clock_ratio']:.2f}x | "
            f"{_x(x.get('projected_ratio'))} |"
        )
    out.append("")
  return "\n".join(out)


def main(argv):
  del argv
  distributed.initialize_from_env()  # a no-op for one process
  cfg = _CONFIG.value
  if cfg.get("mode", "engine") == "project":  # the loops of the configured engine grid (replayed pairs share d1)
    r = model_config(cfg.projection_model).recurrence
    rows = [
        {"method": n, "d1": kw["d1"], "d2": kw.get("d2"), "draft_len": kw.get("gamma")}
        for n, kw in method_specs(cfg, r)
        if n not in SPECULATIVE  # no projected loop: their cost depends on the drafter, not on (d1, d2)
    ]
    project_costs(cfg, rows)
    return
  if cfg.get("mode", "engine") == "headline":
    dirs = common.split_list(cfg.headline_dirs)
    text = headline_markdown(dirs, cfg.get("headline_wall_clock") or "sweep")
    print(text)
    if common.is_main_process():
      common.atomic_write_text(cfg.headline_out, text + "\n")
    return
  if cfg.get("mode", "engine") == "replay":
    res = replay_rows(cfg)
    print(res["table"])
    print(f"rows in {os.path.join(cfg.out_dir, 'replay.jsonl')}, table in {os.path.join(cfg.out_dir, 'replay.md')}")
    return
  res = run_sweep(cfg)
  print(res["table"])
  print(f"rows in {os.path.join(cfg.out_dir, 'sweep.jsonl')}, table in {os.path.join(cfg.out_dir, 'sweep.md')}")


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
