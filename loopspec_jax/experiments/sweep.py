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

  loopspec-sweep                                    # loopspec_jax/configs/sweeps/default.py
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
from loopspec_jax.analysis import depth_metrics as DA
from loopspec_jax.analysis import theory
from loopspec_jax.experiments import common

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


def method_specs(cfg, r: int) -> List[Tuple[str, dict]]:
  specs = [("loopspec", {"d1": d1, "d2": d2}) for d1, d2 in loopspec_grid(cfg, r)]
  if cfg.get("chain_d1"):
    specs += [("chain", {"d1": int(cfg.chain_d1), "gamma": g}) for g in _ints(cfg.chain_gammas)]
  return specs


def decode_all(model, prompts, name, kw, sampling, max_new_tokens, seed, eos_id, lane_capacity):
  """One pass over the prompts, one request at a time (request id = prompt index); stats and tokens."""
  stats, outputs = [], []
  extra = {"lane_capacity": lane_capacity} if name == "loopspec" and lane_capacity else {}
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


def measure(model, prompts, name, kw, sampling, *, max_new_tokens, repeats, seed, eos_id, lane_capacity=None):
  """Warm-up pass plus `repeats` timed passes; returns (aggregated stats, decode-second list, outputs)."""
  stats, outputs = decode_all(model, prompts, name, kw, sampling, max_new_tokens, seed, eos_id, lane_capacity)
  times = []
  for _ in range(max(1, repeats)):
    st, _ = decode_all(model, prompts, name, kw, sampling, max_new_tokens, seed, eos_id, lane_capacity)
    times.append(sum(s["decode_seconds"] for s in st))
    stats = st
  return common.aggregate(stats, model.config.recurrence), times, outputs


def make_row(
    base: dict, name: str, kw: dict, agg: dict, times: list, r: int, ar_row: Optional[dict], outputs: list, greedy: bool
) -> dict:
  """A result row: timings, gamma, rates and the cost-identity prediction."""
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
          "draft_len": kw.get("gamma") if name == "chain" else None,
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
  if ar_row is not None:
    row["ar_decode_seconds_median"] = ar_row["decode_seconds_median"]
    row["wall_clock_ratio"] = ar_row["decode_seconds_median"] / max(row["decode_seconds_median"], 1e-12)
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
  if name == "chain" and agg["rounds"]:
    g = kw["gamma"]
    row["rounds"] = agg["rounds"]
    row["tokens_per_round"] = agg["tokens_per_round"]
    row["acceptance_rate"] = agg["acceptance_rate"]  # accepted drafts / drafted
    row["implied_iid_acceptance"] = DA.implied_chain_acceptance(g, agg["tokens_per_round"])
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
  best_swept = (
      min(swept, key=lambda p: (theory.cost_bound(r, p[0], p[1], beta, alpha), p[0], r if p[1] is None else p[1]))
      if swept
      else None
  )
  return {
      "path": path,
      "beta": beta,
      "alpha": alpha,
      "optimal_continuous": list(theory.optimal_depths(r, beta, alpha)),
      "best_feasible": list(best),
      "best_swept": list(best_swept) if best_swept else None,
  }


def run_sweep(cfg, model=None) -> dict:
  """Runs (or resumes) the sweep; returns {'rows': all rows of this run's keys, 'table': markdown}."""
  model = model or common.load_model(cfg)
  r = model.config.recurrence
  ident = common.model_identity(cfg)
  label = cfg.get("model_label") or cfg.model
  eos_id = cfg.get("eos_id")
  jsonl = os.path.join(cfg.out_dir, "sweep.jsonl")
  existing = {row["key"]: row for row in DA.read_jsonl(jsonl)}
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
      base = {
          "model": label,
          "task": task,
          "sampling": samp,
          "sampling_settings": sampling,
          "num_prompts": len(prompts),
          "max_new_tokens": cfg.max_new_tokens,
          "repeats": cfg.repeats,
      }
      measure_kw = dict(
          max_new_tokens=cfg.max_new_tokens,
          repeats=cfg.repeats,
          seed=cfg.seed,
          eos_id=eos_id,
          lane_capacity=cfg.get("lane_capacity"),
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
        agg, times, outputs = measure(model, prompts, name, kw, sampling, **measure_kw)
        ar_row = None if name == "ar" else existing[ar_key]  # AR comes first in every group
        row = make_row(dict(base, key=key), name, kw, agg, times, r, ar_row, outputs, greedy)
        DA.append_jsonl(jsonl, row)
        existing[key] = row
        new_rows += 1
        bar.update(1)
  finally:
    bar.close()
    summaries = {(t, s): load_depth_summary(cfg, t, s, r) for t, s in groups}
    rows = [existing[k] for k in keys_of_run if k in existing]
    derived = ("eps2", "theorem1", "theorem1_applies")  # recomputed from the current depth JSON, never stored
    rows = [
        dict(
            {k: v for k, v in x.items() if k not in derived},
            **theorem1_fields(x, summaries[(x["task"], x["sampling"])]),
        )
        for x in rows
    ]
    preds = {(t, s): load_prediction(cfg, t, s, r) for t, s in groups}
    table = summary_markdown(rows, preds)
    if common.is_main_process() and rows:
      common.atomic_write_text(os.path.join(cfg.out_dir, "sweep.md"), table + "\n")
  return {"rows": rows, "table": table, "predictions": preds}


def pair_str(d1, d2) -> str:
  return f"({d1}, {'-' if d2 is None else d2})"


def _thm1(row) -> str:
  t = row.get("theorem1")
  if not t:
    return "-"
  return f"{t['bound']:.3f} " + ("ok" if t["holds"] else "VIOLATED" if row["theorem1_applies"] else "n/a: skips")


def _yes(v) -> str:
  return "-" if v is None else ("yes" if v else "NO")


def best_rows(rows: List[dict], pred: Optional[dict]) -> Dict[str, Optional[dict]]:
  """The measured best LoopSpec row (highest wall-clock ratio) and the rows of the predicted pairs."""
  ls = [x for x in rows if x["method"] == "loopspec"]
  find = lambda pair: next((x for x in ls if pair is not None and [x["d1"], x["d2"]] == list(pair)), None)
  return {
      "measured": max(ls, key=lambda x: x["wall_clock_ratio"]) if ls else None,
      "measured_gamma": max(ls, key=lambda x: x["mean_accepted_length"]) if ls else None,
      "predicted": find(pred["best_feasible"]) if pred else None,
      "predicted_swept": find(pred["best_swept"]) if pred else None,
  }


def summary_markdown(rows: List[dict], preds: dict) -> str:
  """Markdown tables per (task, sampling): LoopSpec grid, chain, and measured vs predicted best."""
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
          f": AR {ar['tokens']} tokens, decode {ar['decode_seconds_median']:.3f} s "
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
    ls = [x for x in grp if x["method"] == "loopspec"]
    if ls:
      out += [
          "",
          "| (d1, d2) | gamma | gamma (ticks) | gamma pred. R/C | C pred. | ratio vs AR | commits f/s/r | "
          "P(rej x1) | P(restart) | Thm 1 bound | gate open | identical | mark |",
          "|" + "---|" * 13,
      ]
      for x in ls:
        marks = []
        if best["measured"] is x:
          marks.append("**measured best**")
        if best["predicted"] is x:
          marks.append("**predicted best**")
        elif best["predicted_swept"] is x:
          marks.append("predicted best (swept)")
        c = x["commits"]
        out.append(
            f"| {pair_str(x['d1'], x['d2'])} | {x['mean_accepted_length']:.2f} | "
            f"{x.get('tokens_per_r_steps', float('nan')):.2f} | {x.get('predicted_gamma', float('nan')):.2f} | "
            f"{x.get('predicted_cost', float('nan')):.2f} | {x['wall_clock_ratio']:.2f}x | "
            f"{c['first']}/{c['second']}/{c['restart']} | {x.get('p_reject_first', 0):.3f} | "
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
          "| draft len | gamma | tokens / round | (1-a^(g+1))/(1-a) | drafts accepted | ratio vs AR | identical |",
          "|---|---|---|---|---|---|---|",
      ]
      for x in ch:
        out.append(
            f"| {x['draft_len']} | {x['mean_accepted_length']:.2f} | {x['tokens_per_round']:.2f} | "
            f"{theory.chain_expected_tokens(a, x['draft_len']):.2f} | {x.get('acceptance_rate', 0):.3f} | "
            f"{x['wall_clock_ratio']:.2f}x | {_yes(x.get('identical_to_ar'))} |"
        )
    if ls:
      out += ["", "| | (d1, d2) | gamma | gamma pred. R/C | ratio vs AR |", "|---|---|---|---|---|"]
      for name, x in (
          ("measured best (wall clock)", best["measured"]),
          ("highest gamma", best["measured_gamma"]),
          ("predicted best (Theorem 2)", best["predicted"]),
          ("predicted best among swept", best["predicted_swept"]),
      ):
        if x is None:
          if name.startswith("predicted best (") and pred:
            out.append(f"| {name} | {pair_str(*pred['best_feasible'])} | not swept | | |")
          continue
        out.append(
            f"| {name} | {pair_str(x['d1'], x['d2'])} | {x['mean_accepted_length']:.2f} | "
            f"{x.get('predicted_gamma', float('nan')):.2f} | {x['wall_clock_ratio']:.2f}x |"
        )
    out.append("")
  return "\n".join(out)


def main(argv):
  del argv
  cfg = _CONFIG.value
  res = run_sweep(cfg)
  print(res["table"])
  print(f"rows in {os.path.join(cfg.out_dir, 'sweep.jsonl')}, table in {os.path.join(cfg.out_dir, 'sweep.md')}")


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
