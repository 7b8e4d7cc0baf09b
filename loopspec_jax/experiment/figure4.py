"""Figure 4 of the LoopSpec paper on the bundled targets (`experiments/figure4.py` is the command): LoopSpec
(its best depth pair) against DFlash (its best gamma) and AR, greedy and sampled, on held-out GSM8K and
MATH-500 prompts: the candidates, one interleaved group per (target, mode) with wall-clock medians and ratios
against AR of the same run, the pick of the best candidate of each kind, the tables and the figure.
"""

from __future__ import annotations

import time

import numpy as np

import loopspec_jax as lj
from loopspec_jax import methods
from loopspec_jax.experiment import timing

# candidates per target: LoopSpec depth pairs (skip-free: the default lane table holds the schedule's worst
# case, decoding/loopspec/state.py stage_width) and DFlash block sizes (the drafters are trained for 6)
LOOPSPEC = {
    "tiny-ouro": ["loopspec:1,2", "loopspec:1,3"],
    "tiny-raven": ["loopspec:2,8", "loopspec:4,16"],
}
GAMMAS = (3, 6)
TASKS = ("gsm8k", "math500")
MODES = {"greedy": {}, "sampled": {"temperature": 1.0, "top_p": 0.7}}
PAPER = "up to 1.7x (LoopSpec over DFlash, Ouro thinking models, Figure 4 of the LoopSpec paper)"


def candidates(target: str) -> list:
  """AR, the target's LoopSpec depth pairs and DFlash (its bundled drafter) at every gamma of GAMMAS."""
  return ["ar"] + LOOPSPEC[target] + [f"dflash:heads={target}-dflash,gamma={g}" for g in GAMMAS]


def kind(spec: str) -> str:
  """The method name of a spec ('dflash:heads=...,gamma=3' -> 'dflash')."""
  return spec.partition(":")[0]


def skip_free(stats: dict) -> bool:
  """Whether a LoopSpec run skipped no first or second proposal (its lane table held the schedule)."""
  pr = stats.get("per_request", {})
  return sum(pr.get("skipped_first", [0])) + sum(pr.get("skipped_second", [0])) == 0


def figures(spec: str, stats: dict) -> dict:
  """tau (DFlash: tokens per verify pass; LoopSpec: its mean accepted length gamma on the R-step scale)."""
  out = {"tokens": stats.get("tokens_generated")}
  if kind(spec) == "dflash":
    out.update(tau=stats["tau"], alpha=stats["alpha"], level_acceptance=stats["level_acceptance"])
  elif kind(spec) == "loopspec":
    out.update(tau=stats["mean_accepted_length"], skip_free=skip_free(stats))
  else:
    out.update(tau=1.0)
  return out


def run_group(model, target: str, mode: str, prompts: dict, repeats: int, max_new: int) -> list:
  """Every candidate of `target` in `mode`, the tasks interleaved, `repeats` timed rounds (rotated order)."""
  specs = candidates(target)
  kw = MODES[mode]
  built = {s: methods.build_checked(s, model) for s in specs}
  rows = {(s, t): {"spec": s, "task": t, "walls": [], "decode_seconds": []} for s in specs for t in TASKS}
  ar_tokens = {}

  def call(spec, task):
    t0 = time.perf_counter()
    res = lj.generate(model, prompts[task], max_new_tokens=max_new, method=built[spec], seed=0, **kw)
    return res, time.perf_counter() - t0

  for spec in specs:  # compile
    for task in TASKS:
      res, _ = call(spec, task)
      row = rows[(spec, task)]
      row.update(figures(spec, res.stats))
      if spec == "ar":
        ar_tokens[task] = res.tokens
      row["equals_ar"] = res.tokens == ar_tokens[task] if mode == "greedy" else None
  for r in range(repeats):
    order = specs[r % len(specs) :] + specs[: r % len(specs)]
    for spec in order:
      for task in TASKS:
        res, wall = call(spec, task)
        rows[(spec, task)]["walls"].append(wall)
        rows[(spec, task)]["decode_seconds"].append(res.stats["decode_seconds"])
    print(f"  {target} {mode}: round {r + 1}/{repeats} done", flush=True)
  out = list(rows.values())
  for row in out:
    row.update(target=target, mode=mode, median_wall=float(np.median(row["walls"])))
  for row in out:
    row["ar_median_wall"] = rows[("ar", row["task"])]["median_wall"]
    row["speed_vs_ar"] = row["ar_median_wall"] / row["median_wall"]
  timing.release_compiled()
  return out


def pick_best(rows: list) -> dict:
  """{(target, mode): {kind: spec}}: the highest geometric-mean speed over AR across the tasks."""
  best = {}
  for row in rows:
    key = (row["target"], row["mode"])
    spec = row["spec"]
    speeds = [r["speed_vs_ar"] for r in rows if (r["target"], r["mode"], r["spec"]) == key + (spec,)]
    score = float(np.exp(np.mean(np.log(speeds))))
    cur = best.setdefault(key, {}).get(kind(spec))
    if cur is None or score > cur[1]:
      best[key][kind(spec)] = (spec, score)
  return {k: {kk: vv[0] for kk, vv in v.items()} for k, v in best.items()}


def best_table(rows: list, best: dict) -> tuple:
  """(markdown, list of dict rows): per (target, mode, task) the best LoopSpec and DFlash beside AR."""
  by = {(r["target"], r["mode"], r["task"], r["spec"]): r for r in rows}
  head = (
      "| target | sampling | task | LoopSpec | gamma (LoopSpec) | DFlash | tau (DFlash) | AR s | LoopSpec vs AR "
      "| DFlash vs AR | LoopSpec / DFlash |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
  )
  lines, out = [], []
  for (target, mode), b in best.items():
    for task in TASKS:
      ls, df = by[(target, mode, task, b["loopspec"])], by[(target, mode, task, b["dflash"])]
      ratio = df["median_wall"] / ls["median_wall"]
      out.append(dict(target=target, mode=mode, task=task, loopspec=ls["spec"], dflash=df["spec"], ratio=ratio))
      lines.append(
          f"| {target} | {mode} | {task} | `{ls['spec']}` | {ls['tau']:.2f} | `{df['spec'].split(',')[-1]}` | "
          f"{df['tau']:.2f} | {ls['ar_median_wall']:.2f} | {ls['speed_vs_ar']:.2f}x | {df['speed_vs_ar']:.2f}x | "
          f"{ratio:.2f}x |"
      )
  return head + "\n".join(lines) + "\n", out


def candidates_table(rows: list) -> str:
  """candidates.md: every (target, mode, task, candidate) row."""
  head = "| target | sampling | task | method | tau | skip-free | = AR | median s | speed vs AR |\n|---|---|---|---|---|---|---|---|---|\n"
  fmt = lambda v: "-" if v is None else ("yes" if v else "no")
  lines = [
      f"| {r['target']} | {r['mode']} | {r['task']} | `{r['spec']}` | {r['tau']:.2f} | {fmt(r.get('skip_free'))} | "
      f"{fmt(r['equals_ar'])} | {r['median_wall']:.2f} | {r['speed_vs_ar']:.2f}x |"
      for r in rows
  ]
  return head + "\n".join(lines) + "\n"


def plot(rows: list, best: dict, path: str) -> None:
  """figure4.png: per (target, mode) bars of AR, the best LoopSpec and the best DFlash's speed over AR."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = list(best)
  fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.2), sharey=True)
  by = {(r["target"], r["mode"], r["task"], r["spec"]): r for r in rows}
  for ax, (target, mode) in zip(np.atleast_1d(axes), keys):
    x = np.arange(len(TASKS))
    for i, (name, spec) in enumerate(
        (("AR", "ar"), ("LoopSpec", best[(target, mode)]["loopspec"]), ("DFlash", best[(target, mode)]["dflash"]))
    ):
      ax.bar(x + (i - 1) * 0.27, [by[(target, mode, t, spec)]["speed_vs_ar"] for t in TASKS], 0.27, label=name)
    ax.set_xticks(x, TASKS)
    ax.set_title(f"{target}, {mode}", fontsize=9)
    ax.axhline(1.0, color="gray", lw=0.5)
  np.atleast_1d(axes)[0].set_ylabel("speed vs AR (median wall clock)")
  np.atleast_1d(axes)[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
