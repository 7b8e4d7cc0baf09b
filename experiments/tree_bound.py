"""What bounds the greedy tau of tree self-speculation (`method="tree"`): replayed rounds on AR's own text.

  python -m loopspec_experiments.tree_bound --out results/trees/<run> [--d1 1,2] [--num 8] [--new 96]

Greedy output is AR's, and a round's tree depends only on the committed text, so the tree at every position
of AR's continuation can be drafted once, offline: the AR continuation (prompt + 96 greedy tokens) is
prefilled (readouts at d1 and R, exactly the caches the tree decoder keeps), and for every offset o the
drafter (`self_spec.draft_tree`, with its final `select` replaced by the identity to get the whole pool)
drafts from the root at p0 = prompt length - 1 + o, attending only to positions < p0. A pool node is on
AR's path iff its token and its ancestors' equal AR's tokens at their positions. Per offset that gives the
accepted depth k(p0) of any rule choosing nodes from the pool, and rounds are then simulated along AR's
text (each commits k + 1 tokens within the 96-token budget), which is what the decoder does:
- chain: the depth-d1 argmax at every level (rank 0); `by_score`: EAGLE-2's rule with the forced top-1 path
  (`select.by_score` on self_spec's scores, what the decoder runs); `by_level`: per-depth quotas;
- pool oracle: the deepest on-path pool node (a perfect ranking of 32 nodes from this pool: the path needs
  at most gamma of them);
- top-4 oracle: AR's token within the depth-d1 top-`branch` at every level of its own path (expansion and
  ranking perfect: the best any branch-4 depth-gamma tree from this readout can do).
Also per depth d: P(accepted depth >= d | >= d - 1) under the decoder's rule, and at each rejected level,
how often AR's token was in the top-`branch` of the d1 readout at the rejecting node (the tree missed it by
expansion or selection, not because the readout ranks it low). Writes out/bound.json and out/bound.md.
"""

from __future__ import annotations

import argparse
import json
import os

import loopspec_jax
from loopspec_jax.experiment.tree_replay import analyse
from loopspec_jax.experiment.tree_replay import continuation
from loopspec_jax.experiment.tree_replay import pools


def _f(x):
  return "-" if x is None else f"{x:.2f}"


def markdown(results: dict, args) -> str:
  lines = [
      f"Replayed greedy rounds of tree self-speculation on tiny-raven (gamma {args.gamma}, branch {args.branch}, "
      f"{args.nodes} nodes; {args.num} prompts per task, {args.new} new tokens). tau = tokens per verify pass.",
      "",
      "| task | d1 | rule | tau |",
      "|---|---|---|---|",
  ]
  for key, r in results.items():
    task, d1 = key.split("/")
    for name, tau in r["tau"].items():
      lines.append(f"| {task} | {d1} | {name} | {tau:.2f} |")
  lines += [
      "",
      "| task | d1 | target (0.4 of chain's shortfall) | P(accept depth d, d = 1..gamma, decoder's rule) "
      "| rejected token in d1 top-branch | top-1 / top-branch hit per level |",
      "|---|---|---|---|---|---|",
  ]
  for key, r in results.items():
    task, d1 = key.split("/")
    chain = r["tau"]["chain (rank 0)"]
    need = chain + 0.4 * (args.gamma + 1 - chain)
    acc = " ".join(_f(a) for a in r["per_depth_acceptance"])
    t1, tb = r["per_level_top1_top_branch"]
    lines.append(
        f"| {task} | {d1} | {need:.2f} | {acc} | {_f(r['rejected_in_top_branch'])} ({r['rejections']} rejections) "
        f"| {t1:.2f} / {tb:.2f} |"
    )
  return "\n".join(lines) + "\n"


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--d1", default="1,2")
  ap.add_argument("--num", type=int, default=8)
  ap.add_argument("--new", type=int, default=96)
  ap.add_argument("--gamma", type=int, default=6)
  ap.add_argument("--branch", type=int, default=4)
  ap.add_argument("--nodes", type=int, default=32)
  ap.add_argument("--tasks", default="gsm8k,shakespeare")
  args = ap.parse_args()
  model = loopspec_jax.load("tiny-raven")
  results = {}
  for task in args.tasks.split(","):
    seqs, plens = continuation(model, task, 0, args.num, args.new)
    for d1 in (int(x) for x in args.d1.split(",")):
      pool = pools(model, seqs, plens, d1, args.gamma, args.branch, args.new)
      results[f"{task}/{d1}"] = analyse(pool, args.gamma, args.branch, args.nodes, args.new)
      print(task, d1, json.dumps(results[f"{task}/{d1}"]), flush=True)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bound.json"), "w") as f:
    json.dump({"args": vars(args), "results": results}, f, indent=1)
  text = markdown(results, args)
  with open(os.path.join(args.out, "bound.md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
