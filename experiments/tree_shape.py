"""Sequoia static tree shapes for tree self-speculation, from measured per-rank acceptance (greedy replay).

  python -m loopspec_experiments.tree_shape --out results/trees_shape/<run> [--d1 1,2]

1. Calibration (prompts 8..15 of each task, never the benchmark's first 8): AR's greedy continuation is
   replayed as `tree_bound` does (the drafter's whole candidate pool at every offset); at every on-path pool
   node of depth d - 1 that was expanded, the rank (0..branch-1) of AR's token among its top-`branch`
   children, or none: p[d][k] = P(rank k | the parent accepted), per task and pooled over the tasks.
2. Shapes: `sequoia.sequoia_shape` of the pooled flat vector (the mean over depths), the pooled per-depth
   matrix, each task's own flat vector; beside them draft_tree's ACCEPT_GUESS shape.
3. Evaluation (the benchmark's prompts 0..7): every shape drafted at every offset of AR's continuation with
   `draft_tree.expand(sample=False)` (exactly what the decoder drafts), its accepted depth, rounds simulated
   along AR's text (`tree_replay.simulate`): tau. Writes out/shape.json and out/shape.md.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

import loopspec_jax
from loopspec_jax.decoding.tree import draft_tree as dt
from loopspec_jax.decoding.tree import sequoia
from loopspec_jax.experiment.tree_accept import accept_stats
from loopspec_jax.experiment.tree_accept import value_and_tau
from loopspec_jax.experiment.tree_replay import continuation
from loopspec_jax.experiment.tree_replay import pooled_accept
from loopspec_jax.experiment.tree_replay import pools
from loopspec_jax.experiment.tree_replay import rank_counts
from loopspec_jax.experiment.tree_replay import sequoia_shapes
from loopspec_jax.experiment.tree_replay import shape_depths
from loopspec_jax.experiment.tree_replay import simulate


def sampled_main(args, model, tasks):
  """--sampled: vectors per drafts mode and d1 from AR's T = 1 text on prompts 8..15; shapes evaluated
  (exact expected accepted per offset, rounds simulated with depths drawn given the text) on prompts 0..7.
  drafts="kseq" (`kseq_accept`, `kseq_rows`): a count table per d1 instead of a vector."""
  g, br, n, new = args.gamma, args.branch, args.nodes, args.new
  t1 = lambda tk, lo, hi: continuation(model, tk, lo, hi, new + g, temperature=1.0, seed=args.seed)
  calib = {tk: t1(tk, 8, 16) for tk in tasks}
  evals = {tk: t1(tk, 0, 8) for tk in tasks}
  rng = np.random.default_rng(0)
  results, lines = {}, ["| d1 | drafts | shape | accept (per rank, pooled flat) | " + " | ".join(tasks) + " |"]
  lines.append("|---" * (4 + len(tasks)) + "|")
  for d1 in (int(v) for v in args.d1.split(",")):
    res = {"accept": {}, "accept_depth": {}, "tau": {}, "value": {}}
    stats = {}
    for split, data in (("calib", calib), ("eval", evals)):
      for tk in tasks:
        seqs, plens = data[tk]
        stats[split, tk] = accept_stats(model, seqs, plens, d1, g, br, new, args.draws)
        print(d1, split, tk, "done", flush=True)
    for mode in ("sample", "distinct", "topk", "ot bound", "topk of p bound"):
      a = np.concatenate([stats["calib", tk][mode][0] for tk in tasks], axis=1)  # [O, B, gamma, branch]
      flat = a.reshape(-1, br).mean(0)
      per_depth = a.reshape(-1, g, br).mean(0)
      res["accept"][mode], res["accept_depth"][mode] = flat.tolist(), per_depth.tolist()
      cand = {
          "sequoia flat": tuple(flat),
          "sequoia per-depth": tuple(map(tuple, per_depth)),
          "sequoia greedy vector": sequoia.default_accept(d1, "greedy", br),
      }
      shapes = sequoia_shapes(cand, g, br, n)
      shapes["chain (gamma nodes, rank 0)"] = dt.ordered_shape(list(range(-1, g)), list(range(g + 1)), [0] * (g + 1), g)
      if "bound" in mode:  # the Sequoia model's value of the best shape under the bound's vector (per depth)
        acc = sequoia.parse_accept(cand["sequoia per-depth"], g, br)
        e = sequoia.expected_accepted(sequoia.sequoia_shape(acc, g, br, n), acc)
        res["value"][mode] = e
        lines.append(
            f"| {d1} | {mode} | model E[accepted] {e:.2f} (tau ~ {1 + e:.2f}) | {_vec(flat)} |" + " |" * len(tasks)
        )
        continue
      for name, shape in shapes.items():
        key = f"{mode} / {name}"
        res["tau"][key], res["value"][key] = {}, {}
        for tk in tasks:
          w = stats["eval", tk][mode][1]
          res["value"][key][tk], res["tau"][key][tk] = value_and_tau(shape, w, new, args.reps, rng)
        cols = " | ".join(f"{res['tau'][key][tk]:.2f} ({res['value'][key][tk]:.2f})" for tk in tasks)
        lines.append(f"| {d1} | {mode} | {name} | {_vec(flat)} | {cols} |")
        print(d1, key, res["tau"][key], shape.depth, shape.rank, flush=True)
    lines += kseq_rows(args, d1, stats, tasks, res, rng)
    results[str(d1)] = res
  head = (
      f"Replayed T = 1 tau of static tree shapes (sampled drafts, SpecInfer's rule; topk: deterministic drafts "
      f"verified with AR's draws), tiny-raven, gamma {g}, branch {br}, {n} nodes; acceptance measured along AR's "
      f"T = 1 text (seed {args.seed}) of prompts 8..15, tau on prompts 0..7, {new} new tokens. Per cell: tau "
      f"(mean of {args.reps} simulations of rounds with depths drawn given the text) and, in brackets, the exact "
      "expected accepted drafts per round from an offset.\n\n"
  )
  write_results(args, "shape_t1", results, head + "\n".join(lines))


def kseq_rows(args, d1: int, stats, tasks, res, rng) -> list:
  """drafts="kseq": the count-dependent table (pooled over calibration contexts and depths), its Sequoia
  shape (`sequoia.kseq_shape`) and the sample vector's, evaluated (count-aware w) on the eval prompts."""
  g, br, n, new = args.gamma, args.branch, args.nodes, args.new
  a = np.concatenate([stats["calib", tk]["kseq"][0] for tk in tasks], axis=1)  # [O, B, gamma, c, i]
  mean = a.reshape((-1, br, br)).mean(0)
  table = tuple(tuple(round(float(v), 3) for v in mean[c, : c + 1]) for c in range(br))
  res["accept"]["kseq"] = [list(r) for r in table]
  shapes = {"sequoia kseq table": sequoia.kseq_shape(table, g, br, n)}
  sample_acc = sequoia.parse_accept(tuple(res["accept"]["sample"]), g, br)
  shapes["sequoia sample vector"] = sequoia.sequoia_shape(sample_acc, g, br, n)
  shapes["ACCEPT_GUESS static"] = dt.static_shape(g, br, n)
  shown = ";".join(_vec(r) for r in table)
  lines = []
  for name, shape in shapes.items():
    key = f"kseq / {name}"
    res["tau"][key], res["value"][key] = {}, {}
    for tk in tasks:
      w = stats["eval", tk]["kseq"][1]
      res["value"][key][tk], res["tau"][key][tk] = value_and_tau(shape, w, new, args.reps, rng, counts=True)
    res.setdefault("model", {})[key] = sequoia.expected_accepted_counts(shape, table)
    cols = " | ".join(f"{res['tau'][key][tk]:.2f} ({res['value'][key][tk]:.2f})" for tk in tasks)
    lines.append(f"| {d1} | kseq | {name} | {shown} | {cols} |")
    print(d1, key, res["tau"][key], shape.depth, shape.rank, flush=True)
  return lines


def write_results(args, stem: str, results: dict, text: str) -> None:
  """args.out/<stem>.json (the arguments and results) and <stem>.md (the table text), which is also printed."""
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"{stem}.json"), "w") as f:
    json.dump({"args": vars(args), "results": results}, f, indent=1)
  with open(os.path.join(args.out, f"{stem}.md"), "w") as f:
    f.write(text + "\n")
  print(text)


def _vec(x):
  return "/".join(f"{v:.3f}" for v in x)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--d1", default="1,2")
  ap.add_argument("--new", type=int, default=96)
  ap.add_argument("--gamma", type=int, default=6)
  ap.add_argument("--branch", type=int, default=4)
  ap.add_argument("--nodes", type=int, default=32)
  ap.add_argument("--tasks", default="gsm8k,shakespeare")
  ap.add_argument("--sampled", action="store_true", help="T = 1 calibration of sampled drafts (shape_t1.*)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--draws", type=int, default=16)
  ap.add_argument("--reps", type=int, default=20)
  args = ap.parse_args()
  g, br, n = args.gamma, args.branch, args.nodes
  model = loopspec_jax.load("tiny-raven")
  tasks = args.tasks.split(",")
  if args.sampled:
    return sampled_main(args, model, tasks)
  calib = {t: continuation(model, t, 8, 16, args.new) for t in tasks}
  evals = {t: continuation(model, t, 0, 8, args.new) for t in tasks}
  results, lines = {}, ["| d1 | shape | accept (per rank) | model E[accepted] | " + " | ".join(tasks) + " |"]
  lines.append("|---" * (4 + len(tasks)) + "|")
  for d1 in (int(x) for x in args.d1.split(",")):
    counts = {}
    for t in tasks:
      pool = pools(model, *calib[t], d1, g, br, args.new)
      counts[t] = rank_counts(pool, g, br, args.new)
    flat, per_depth = pooled_accept(counts)
    cand = {"sequoia pooled flat": tuple(flat), "sequoia pooled per-depth": tuple(map(tuple, per_depth))}
    for t in tasks:
      cand[f"sequoia {t} flat"] = tuple(counts[t][0].sum(0) / max(counts[t][1].sum(), 1))
    shapes = sequoia_shapes(cand, g, br, n)
    res = {"calibration": {t: {"hits": c[0].tolist(), "trials": c[1].tolist()} for t, c in counts.items()}}
    res["accept"] = {k: np.asarray(v).tolist() for k, v in cand.items()}
    res["tau"] = {}
    for name, shape in shapes.items():
      res["tau"][name] = {}
      for t in tasks:
        k = shape_depths(model, *evals[t], d1, shape, br, args.new)
        res["tau"][name][t] = simulate(k, args.new)["tau"]
      acc = cand.get(name, cand["sequoia pooled flat"])
      acc_t = sequoia.parse_accept(acc, g, br)
      shown = _vec(flat) if name == "sequoia pooled per-depth" or name not in cand else _vec(np.asarray(acc))
      if name == "sequoia pooled per-depth":
        shown = "per depth: " + "; ".join(_vec(r) for r in per_depth)
      e = sequoia.expected_accepted(shape, acc_t)
      cols = " | ".join(f"{res['tau'][name][t]:.2f}" for t in tasks)
      lines.append(f"| {d1} | {name} | {shown} | {e:.2f} | {cols} |")
      print(d1, name, res["tau"][name], shape.depth, shape.rank, flush=True)
    results[str(d1)] = res
  head = (
      f"Replayed greedy tau (tokens per verify pass) of static tree shapes, tiny-raven, gamma {g}, branch {br}, "
      f"{n} nodes; acceptance measured on prompts 8..15 of each task, tau on prompts 0..7, {args.new} new tokens. "
      "'model E[accepted]' is the Sequoia model's expected accepted drafts under the pooled vector "
      "(per-depth row: its own).\n\n"
  )
  write_results(args, "shape", results, head + "\n".join(lines))


if __name__ == "__main__":
  main()
