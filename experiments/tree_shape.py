"""Sequoia static tree shapes for tree self-speculation, from measured per-rank acceptance (greedy replay).

  python -P -m loopspec_jax.experiments.tree_shape --out results/trees_shape/<run> [--d1 1,2]

1. Calibration (prompts 8..15 of each task, never the benchmark's first 8): AR's greedy continuation is
   replayed as `tree_bound` does (the drafter's whole candidate pool at every offset); at every on-path pool
   node of depth d - 1 that was expanded, the rank (0..branch-1) of AR's token among its top-`branch`
   children, or none: p[d][k] = P(rank k | the parent accepted), per task and pooled over the tasks.
2. Shapes: `sequoia.sequoia_shape` of the pooled flat vector (the mean over depths), the pooled per-depth
   matrix, each task's own flat vector; beside them draft_tree's ACCEPT_GUESS shape.
3. Evaluation (the benchmark's prompts 0..7): every shape drafted at every offset of AR's continuation with
   `draft_tree.expand(sample=False)` (exactly what the decoder drafts), its accepted depth, rounds simulated
   along AR's text (`tree_bound.simulate`): tau. Writes out/shape.json and out/shape.md.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

import loopspec_jax
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import draft_tree as dt
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.decoding.tree import sequoia
from loopspec_jax.experiments import bench
from loopspec_jax.experiments import tree_bound
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M


def rank_counts(pool, gamma: int, branch: int, new: int):
  """(hits [gamma, branch], trials [gamma]) over the offsets whose whole tree lies inside AR's text."""
  keep = slice(0, new - gamma)
  tok, par, dep, truth = (pool[k][keep] for k in ("tokens", "parent", "depth", "truth"))
  ok = tree_bound.on_path(tok.copy(), par, truth)
  parent_ok = np.take_along_axis(ok, par, axis=-1)
  rank = (np.arange(tok.shape[-1]) - 1) % branch
  hits, trials = np.zeros((gamma, branch)), np.zeros(gamma)
  for i in range(1, tok.shape[-1]):
    d = dep[..., i]
    sel = parent_ok[..., i]
    if rank[i] == 0:
      np.add.at(trials, d[sel] - 1, 1)
    np.add.at(hits, (d[ok[..., i]] - 1, rank[i]), 1)
  return hits, trials


def shape_depths(model, seqs, plens, d1: int, shape, branch: int, new: int) -> np.ndarray:
  """Accepted depth [O, B] of the static shape drafted (top-k) at every offset of AR's continuation."""
  cfg = model.config
  gamma = max(shape.depth)
  b, t = len(seqs), max(len(s) for s in seqs) + gamma + 2
  tokens = np.zeros((b, t), np.int32)
  for i, s in enumerate(seqs):
    tokens[i, : len(s)] = s
  sp = common.make_sampling_params(b, new, 0.0, 0, 1.0, 0, None)
  cache, _ = common.prefill_state(
      model.params,
      jnp.asarray(tokens),
      jnp.asarray([len(s) for s in seqs], jnp.int32),
      sp,
      cfg=cfg,
      readout_depths=(d1, cfg.recurrence),
      total_len=t,
      random_init=False,
  )
  layout = kvcache.CacheLayout.of(cfg, 2)

  @jax.jit
  def draft(params, cache, toks, p0):
    params = M.prepare_params(params, cfg)
    root = toks[jnp.arange(b), p0]
    logits0, past = self_spec.run_level(params, cache, layout, root[:, None], p0, 0, None, None, d1, cfg, None)
    run = lambda lvl, tk, past, pm: self_spec.run_level(params, cache, layout, tk, p0, lvl, past, pm, d1, cfg, None)
    return dt.expand(shape, root, logits0, run, past, sp, dt.draft_keys(sp, p0), branch=branch, sample=False)[0]

  depth = np.broadcast_to(np.asarray(shape.depth), (b, len(shape.depth)))
  par = np.broadcast_to(np.asarray(shape.parent), (b, len(shape.depth)))
  out = []
  for o in range(new):
    p0 = np.asarray(plens) - 1 + o
    tree = draft(model.params, cache, jnp.asarray(tokens), jnp.asarray(p0, jnp.int32))
    truth = np.take_along_axis(tokens, np.clip(p0[:, None] + depth, 0, t - 1), axis=1)
    out.append(tree_bound.depth_of(tree_bound.on_path(np.asarray(tree.tokens), par, truth), depth))
  return np.stack(out)


def continuation(model, task: str, lo: int, hi: int, new: int):
  prompts = bench.load_prompt_set(task, model, hi, 0, 0)[lo:hi]
  ar = loopspec_jax.generate(model, prompts, max_new_tokens=new, method="ar")
  return [p + t for p, t in zip(prompts, ar.tokens)], [len(p) for p in prompts]


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
  args = ap.parse_args()
  g, br, n = args.gamma, args.branch, args.nodes
  model = loopspec_jax.load("tiny-raven")
  tasks = args.tasks.split(",")
  calib = {t: continuation(model, t, 8, 16, args.new) for t in tasks}
  evals = {t: continuation(model, t, 0, 8, args.new) for t in tasks}
  results, lines = {}, ["| d1 | shape | accept (per rank) | model E[accepted] | " + " | ".join(tasks) + " |"]
  lines.append("|---" * (4 + len(tasks)) + "|")
  for d1 in (int(x) for x in args.d1.split(",")):
    counts = {}
    for t in tasks:
      pool = tree_bound.pools(model, *calib[t], d1, g, br, args.new)
      counts[t] = rank_counts(pool, g, br, args.new)
    hits = sum(c[0] for c in counts.values())
    trials = sum(c[1] for c in counts.values())
    per_depth = hits / np.maximum(trials, 1)[:, None]
    flat = hits.sum(0) / max(trials.sum(), 1)
    cand = {"sequoia pooled flat": tuple(flat), "sequoia pooled per-depth": tuple(map(tuple, per_depth))}
    for t in tasks:
      cand[f"sequoia {t} flat"] = tuple(counts[t][0].sum(0) / max(counts[t][1].sum(), 1))
    shapes = {k: sequoia.sequoia_shape(sequoia.parse_accept(v, g, br), g, br, n) for k, v in cand.items()}
    shapes["ACCEPT_GUESS static"] = dt.static_shape(g, br, n)
    res = {"calibration": {t: {"hits": c[0].tolist(), "trials": c[1].tolist()} for t, c in counts.items()}}
    res["accept"] = {k: np.asarray(v).tolist() for k, v in cand.items()}
    res["tau"] = {}
    for name, shape in shapes.items():
      res["tau"][name] = {}
      for t in tasks:
        k = shape_depths(model, *evals[t], d1, shape, br, args.new)
        res["tau"][name][t] = tree_bound.simulate(k, args.new)["tau"]
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
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "shape.json"), "w") as f:
    json.dump({"args": vars(args), "results": results}, f, indent=1)
  head = (
      f"Replayed greedy tau (tokens per verify pass) of static tree shapes, tiny-raven, gamma {g}, branch {br}, "
      f"{n} nodes; acceptance measured on prompts 8..15 of each task, tau on prompts 0..7, {args.new} new tokens. "
      "'model E[accepted]' is the Sequoia model's expected accepted drafts under the pooled vector "
      "(per-depth row: its own).\n\n"
  )
  with open(os.path.join(args.out, "shape.md"), "w") as f:
    f.write(head + "\n".join(lines) + "\n")
  print(head + "\n".join(lines))


if __name__ == "__main__":
  main()
