"""EAGLE heads (both feature choices) beside chain and tree self-speculation on the bundled tiny-raven, greedy.

  python -P results/heads_eagle/bench_eagle.py --out results/heads_eagle/<host>-<date> \
      --final <head dir> --fused <head dir> [--repeats 1] [--new 96]

Per task (8 held-out GSM8K and 8 Shakespeare prompts, each one batch of 8, picked as results/trees/
bench_trees.py does: `bench.load_prompt_set(task, model, 8, 0, 0)`), every method runs once to compile and
then `repeats` more times, interleaved. Reported: tau (tokens per full-depth verify pass), accepted drafts
and nodes per pass, drafting's share of the row layer calls, the median decode seconds, the speed against AR,
whether the tokens equal AR's, and for EAGLE the per-level acceptance (rounds accepting a depth-k draft among
those that accepted depth k - 1). The issue's target: EAGLE tau >= 3.0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import loopspec_jax as lj
from loopspec_jax.experiments import bench


def methods(args) -> dict:
  out = {"ar": ("ar", {})}
  if not args.no_baselines:
    out["chain:d1=2,gamma=6"] = ("chain:d1=2,gamma=6", {})
    out["tree:d1=2,gamma=6,branch=4,tree_nodes=32"] = ("tree:d1=2,gamma=6,branch=4,tree_nodes=32", {})
  for feature in ("final", "fused"):
    path = getattr(args, feature)
    if path:
      out[f"eagle[{feature}]:gamma=6,branch=4,tree_nodes=32"] = (
          "eagle",
          dict(heads=lj.load_heads(path), gamma=6, branch=4, tree_nodes=32),
      )
  return out


def run_task(model, task, prompts, new, repeats, specs, log):
  names = list(specs)
  secs = {m: [] for m in names}
  res = {}
  for rep in range(repeats + 1):  # rep 0 compiles
    for m in names[rep % len(names) :] + names[: rep % len(names)]:
      method, kw = specs[m]
      r = lj.generate(model, prompts, max_new_tokens=new, method=method, seed=0, **kw)
      if rep:
        secs[m].append(r.stats["decode_seconds"])
      res[m] = r
      log(f"{task} rep {rep} {m}: {r.stats['decode_seconds']:.2f}s tau {r.stats.get('tokens_per_pass', 1):.2f}")
  ar_med = statistics.median(secs["ar"])
  rows = []
  for m in names:
    st = res[m].stats
    rows.append(
        {
            "task": task,
            "method": m,
            "tau": st.get("tokens_per_pass", 1.0),
            "accepted_per_pass": st.get("accepted", 0) / max(st.get("rounds", 1), 1),
            "nodes_per_pass": st.get("nodes_per_pass", 0),
            "draft_cost_share": st.get("draft_cost_share", 0.0),
            "level_acceptance": st.get("level_acceptance"),
            "decode_seconds": secs[m],
            "decode_seconds_median": statistics.median(secs[m]),
            "speed_vs_ar_median": ar_med / statistics.median(secs[m]),
            "tokens": st["tokens_generated"],
            "identical_to_ar": res[m].tokens == res["ar"].tokens,
        }
    )
  return rows


def table(rows) -> str:
  head = "| task | run | method | tau | accepted/pass | nodes/pass | draft share | decode s (median) | speed vs AR | = AR |"
  lines = [head, "|" + "---|" * 10]
  for r in rows:
    lines.append(
        f"| {r['task']} | {r.get('run', '')} | {r['method']} | {r['tau']:.2f} | {r['accepted_per_pass']:.2f} | {r['nodes_per_pass']:.1f} | "
        f"{r['draft_cost_share']:.3f} | {r['decode_seconds_median']:.2f} | {r['speed_vs_ar_median']:.2f}x | "
        f"{'yes' if r['identical_to_ar'] else 'no'} |"
    )
  levels = [r for r in rows if r["level_acceptance"]]
  if levels:
    g = len(levels[0]["level_acceptance"])
    lines += ["", "Per-level acceptance (rounds accepting depth k among those that accepted depth k - 1):", ""]
    lines += ["| task | method | " + " | ".join(f"k={k}" for k in range(1, g + 1)) + " |", "|" + "---|" * (g + 2)]
    for r in levels:
      lines.append(f"| {r['task']} | {r['method']} | " + " | ".join(f"{a:.3f}" for a in r["level_acceptance"]) + " |")
  lines.append("")
  for r in rows:
    if r["method"].startswith("eagle"):
      lines.append(
          f"- {r['task']} {r['method']}: tau {r['tau']:.2f}; target 3.0: {'met' if r['tau'] >= 3.0 else 'NOT met'}"
      )
  return "\n".join(lines) + "\n"


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--final", default=None, help="head directory or bundled name, feature 'final'")
  ap.add_argument("--fused", default=None, help="head directory or bundled name, feature 'fused'")
  ap.add_argument("--repeats", type=int, default=1)
  ap.add_argument("--new", type=int, default=96)
  ap.add_argument("--num", type=int, default=8)
  ap.add_argument("--no_baselines", action="store_true", help="only AR and the given heads")
  ap.add_argument("--tag", default="all", help="this invocation's results file: results_<tag>.json")
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  logf = open(os.path.join(args.out, "log.txt"), "a")

  def log(msg):
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    print(line, flush=True)
    logf.write(line + "\n")
    logf.flush()

  model = lj.load("tiny-raven")
  specs = methods(args)
  rows = []
  for task in ("gsm8k", "shakespeare"):
    prompts = bench.load_prompt_set(task, model, args.num, 0, 0)
    rows += run_task(model, task, prompts, args.new, args.repeats, specs, log)
    with open(os.path.join(args.out, f"results_{args.tag}.json"), "w") as f:
      json.dump(rows, f, indent=1)
  rows = []  # the table: every invocation's rows in this directory (each with its own AR for the speed ratio)
  for name in sorted(os.listdir(args.out)):
    if name.startswith("results_") and name.endswith(".json"):
      with open(os.path.join(args.out, name)) as f:
        rows += [dict(r, run=name[8:-5]) for r in json.load(f)]
  rows.sort(key=lambda r: (r["task"], r["method"] != "ar", r["run"]))
  text = table(rows)
  with open(os.path.join(args.out, "table.md"), "w") as f:
    f.write(text)
  print(text)
  print(subprocess.run(["lscpu"], capture_output=True, text=True).stdout)


if __name__ == "__main__":
  main()
