"""Side-by-side benchmark of token trees against chain self-speculation and AR on the bundled tiny-raven.

  python -P results/trees/bench_trees.py --out results/trees/<host>-<date> [--repeats 3] [--new 96]

Per task (8 held-out GSM8K and 8 Shakespeare prompts, each one batch of 8, prompts cut to their last
max_len // 2 tokens as loopspec-bench does) and sampling mode (greedy; T = 1 with top-p 0.9), every method
runs once to compile and then `repeats` more times, interleaved (method order rotates each repeat). Reported:
tau (tokens per full-depth verify pass), accepted drafts and nodes per pass, the median decode seconds,
the median ratio of AR's decode seconds to the method's, and whether the tokens equal AR's. The issue's
target line: tau_tree >= tau_chain + 0.4 (gamma + 1 - tau_chain) at the same d1 and gamma.
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

METHODS = (
    "ar",
    "chain:d1=1,gamma=6",
    "tree:d1=1,gamma=6,branch=4,tree_nodes=32",
    "chain:d1=2,gamma=6",
    "tree:d1=2,gamma=6,branch=4,tree_nodes=32",
    "lookahead:window=5,ngram=4,guesses=5",
)
SAMPLING = {"greedy": {}, "T1-top_p0.9": {"temperature": 1.0, "top_p": 0.9}}


def run_task(model, task, prompts, new, repeats, log):
  rows = []
  for mode, kw in SAMPLING.items():
    secs = {m: [] for m in METHODS}
    res = {}
    for rep in range(repeats + 1):  # rep 0 compiles
      order = METHODS[rep % len(METHODS) :] + METHODS[: rep % len(METHODS)]
      for m in order:
        r = lj.generate(model, prompts, max_new_tokens=new, method=m, seed=0, **kw)
        if rep:
          secs[m].append(r.stats["decode_seconds"])
        res[m] = r
        log(
            f"{task} {mode} rep {rep} {m}: {r.stats['decode_seconds']:.2f}s tau {r.stats.get('tokens_per_pass', 1):.2f}"
        )
    ar_med = statistics.median(secs["ar"])
    for m in METHODS:
      st = res[m].stats
      rows.append(
          {
              "task": task,
              "sampling": mode,
              "method": m,
              "tau": st.get("tokens_per_pass", 1.0),
              "accepted_per_pass": st.get("accepted", 0) / max(st.get("rounds", 1), 1),
              "nodes_per_pass": st.get("nodes_per_pass", st.get("gamma_max", 0)),
              "draft_cost_share": st.get("draft_cost_share", 0.0),
              "decode_seconds": secs[m],
              "decode_seconds_median": statistics.median(secs[m]),
              "speed_vs_ar_median": ar_med / statistics.median(secs[m]),
              "tokens": st["tokens_generated"],
              "identical_to_ar": res[m].tokens == res["ar"].tokens,
          }
      )
  return rows


def table(rows) -> str:
  head = "| task | sampling | method | tau | accepted/pass | nodes/pass | draft share | decode s (median) | speed vs AR | = AR |"
  lines = [head, "|" + "---|" * 10]
  for r in rows:
    lines.append(
        f"| {r['task']} | {r['sampling']} | {r['method']} | {r['tau']:.2f} | {r['accepted_per_pass']:.2f} | "
        f"{r['nodes_per_pass']:.1f} | {r['draft_cost_share']:.2f} | {r['decode_seconds_median']:.2f} | "
        f"{r['speed_vs_ar_median']:.2f}x | {'yes' if r['identical_to_ar'] else 'no'} |"
    )
  return "\n".join(lines)


def target_lines(rows) -> str:
  out = []
  for r in rows:
    if not r["method"].startswith("tree:"):
      continue
    want = r["method"].split(",branch=")[0].replace("tree:", "chain:")
    chain = next(c for c in rows if (c["task"], c["sampling"], c["method"]) == (r["task"], r["sampling"], want))
    need = chain["tau"] + 0.4 * (6 + 1 - chain["tau"])
    out.append(
        f"- {r['task']} {r['sampling']} {r['method']}: tau {r['tau']:.2f} vs chain {chain['tau']:.2f}; "
        f"target {need:.2f}: {'met' if r['tau'] >= need else 'NOT met'}"
    )
  return "\n".join(out)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--new", type=int, default=96)
  ap.add_argument("--num", type=int, default=8)
  ap.add_argument("--table_only", action="store_true", help="rewrite table.md from an earlier results.json")
  args = ap.parse_args()
  if args.table_only:
    with open(os.path.join(args.out, "results.json")) as f:
      rows = json.load(f)
    text = table(rows) + "\n\n" + target_lines(rows) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
      f.write(text)
    print(text)
    return
  os.makedirs(args.out, exist_ok=True)
  logf = open(os.path.join(args.out, "log.txt"), "a")

  def log(msg):
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    print(line, flush=True)
    logf.write(line + "\n")
    logf.flush()

  model = lj.load("tiny-raven")
  rows = []
  for task in ("gsm8k", "shakespeare"):
    prompts = bench.load_prompt_set(task, model, args.num, 0, 0)
    rows += run_task(model, task, prompts, args.new, args.repeats, log)
    with open(os.path.join(args.out, "results.json"), "w") as f:
      json.dump(rows, f, indent=1)
  text = table(rows) + "\n\n" + target_lines(rows) + "\n"
  with open(os.path.join(args.out, "table.md"), "w") as f:
    f.write(text)
  print(text)
  print(subprocess.run(["lscpu"], capture_output=True, text=True).stdout)


if __name__ == "__main__":
  main()
