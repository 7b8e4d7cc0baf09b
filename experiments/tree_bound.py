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
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

import loopspec_jax
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import select as select_lib
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.experiment.prompts import load_prompt_set
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M

QUOTAS = {"even": None, "front": (4, 8, 7, 6, 4, 3), "back": (4, 4, 5, 6, 6, 7), "mid": (4, 7, 7, 6, 5, 3)}


def prefilled_text(model, seqs, d1: int, gamma: int, sp):
  """AR's texts `seqs` padded into tokens [B, T] (T = longest + gamma + 2, room for a tree past any offset),
  their prefilled cache at readout depths (d1, R) and its layout: what every replay here drafts from."""
  cfg = model.config
  b, t = len(seqs), max(len(s) for s in seqs) + gamma + 2
  tokens = np.zeros((b, t), np.int32)
  for i, s in enumerate(seqs):
    tokens[i, : len(s)] = s
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
  return tokens, cache, kvcache.CacheLayout.of(cfg, 2)


def pools(model, seqs, plens, d1: int, gamma: int, branch: int, new: int) -> dict:
  """The drafted pool at every offset 0..new-1 of every request: arrays [O, B, P] (tokens, score, parent,
  depth) and truth [O, B, P] (AR's token at each node's position)."""
  cfg = model.config
  b = len(seqs)
  sp = common.make_sampling_params(b, new, 0.0, 0, 1.0, 0, None)
  tokens, cache, layout = prefilled_text(model, seqs, d1, gamma, sp)
  t = tokens.shape[1]
  env = dict(cfg=cfg, d1=d1, gamma=gamma, branch=branch, tree_nodes=1, random_init=False)

  @jax.jit
  def draft(params, cache, toks, p0):
    with mock.patch.object(self_spec, "select", lambda tok, score, par, dep, n: (tok, score, par, dep)):
      return self_spec.draft_tree(M.prepare_params(params, cfg), cache, layout, toks, p0, sp, **env)

  out = {k: [] for k in ("tokens", "score", "parent", "depth", "truth")}
  for o in range(new):
    p0 = jnp.asarray(plens, jnp.int32) - 1 + o
    tok, score, par, dep = (np.asarray(x) for x in draft(model.params, cache, jnp.asarray(tokens), p0))
    pos = np.clip(np.asarray(p0)[:, None] + dep, 0, t - 1)
    truth = np.take_along_axis(tokens, pos, axis=1)
    for k, v in zip(out, (tok, score, par, dep, truth)):
      out[k].append(v)
  return {k: np.stack(v) for k, v in out.items()}


def on_path(tok, par, truth, valid=None):
  """[..., P] bool: the node and all its ancestors are valid and carry AR's tokens (the root always does)."""
  ok = tok == truth
  if valid is not None:
    ok &= valid
  ok[..., 0] = True
  for i in range(1, tok.shape[-1]):  # parents come first
    ok[..., i] &= np.take_along_axis(ok, par[..., i : i + 1], axis=-1)[..., 0]
  return ok


def depth_of(ok, dep):
  return np.max(np.where(ok, dep, 0), axis=-1)


def rule_depths(pool, tree_fn) -> np.ndarray:
  """Accepted depth [O, B] of the tree a rule `tree_fn(tokens, score, parent, depth) -> verify.Tree` builds."""
  o, b, p = pool["tokens"].shape
  flat = [jnp.asarray(pool[k].reshape(o * b, p)) for k in ("tokens", "score", "parent", "depth")]
  tree = tree_fn(*flat)
  tr = {k: np.asarray(getattr(tree, k)).reshape(o, b, -1) for k in ("tokens", "parent", "depth", "valid")}
  by_depth = np.zeros((o, b, int(pool["depth"].max()) + 1), pool["truth"].dtype)  # AR's token at each depth
  np.put_along_axis(by_depth, pool["depth"], pool["truth"], axis=-1)
  truth = np.take_along_axis(by_depth, tr["depth"], axis=-1)
  return depth_of(on_path(tr["tokens"], tr["parent"], truth, tr["valid"]), tr["depth"])


def runs(ok, gamma: int) -> np.ndarray:
  """[O, B]: consecutive True of ok [O, B] from each offset on, at most gamma (past the end: False)."""
  k = np.zeros(ok.shape, np.int64)
  alive = np.ones(ok.shape, bool)
  for j in range(gamma):
    alive &= np.concatenate([ok[j:], np.zeros((j,) + ok.shape[1:], bool)])
    k += alive
  return k


def simulate(k, new: int) -> dict:
  """Rounds along AR's text with accepted depth k [O, B] at each offset: tau and the round starts' k."""
  tokens = rounds = 0
  starts = []
  for b in range(k.shape[1]):
    n = 0
    while n < new:
      kk = min(int(k[n, b]), new - n - 1)
      starts.append((n, b, kk, kk < int(k[n, b])))
      n += kk + 1
      rounds += 1
    tokens += n
  return {"tau": tokens / rounds, "rounds": rounds, "starts": starts}


def analyse(pool, gamma: int, branch: int, nodes: int, new: int) -> dict:
  first = pool["tokens"][:, :, 1 : 1 + branch]  # depth-1 candidates, argmax first
  truth1 = pool["truth"][:, :, 1]
  top1, topb = first[..., 0] == truth1, np.any(first == truth1[..., None], axis=-1)
  rules = {
      "chain (rank 0)": runs(top1, gamma),
      f"by_score, {nodes} nodes (the decoder's rule)": rule_depths(pool, lambda *a: select_lib.by_score(*a, nodes)),
  }
  for name, q in QUOTAS.items():
    q = select_lib.even_quotas(branch, gamma, nodes) if q is None else q
    rules[f"by_level {name} {tuple(q)}"] = rule_depths(pool, lambda *a, q=q: select_lib.by_level(*a, q))
  rules["pool oracle (perfect ranking of this pool)"] = depth_of(
      on_path(pool["tokens"], pool["parent"], pool["truth"]), pool["depth"]
  )
  rules[f"top-{branch} oracle (AR's token in the d1 top-{branch} at every level)"] = runs(topb, gamma)
  out = {"tau": {name: simulate(k, new)["tau"] for name, k in rules.items()}}
  sim = simulate(rules[f"by_score, {nodes} nodes (the decoder's rule)"], new)
  ks = np.array([s[2] for s in sim["starts"] if not s[3]])
  out["per_depth_acceptance"] = [
      float(np.mean(ks[ks >= d - 1] >= d)) if np.any(ks >= d - 1) else None for d in range(1, gamma + 1)
  ]
  miss = [bool(topb[n + kk, b]) for n, b, kk, clipped in sim["starts"] if not clipped and kk < gamma and n + kk < new]
  out["rejected_in_top_branch"] = float(np.mean(miss)) if miss else None
  out["rejections"] = len(miss)
  out["per_level_top1_top_branch"] = [float(np.mean(top1)), float(np.mean(topb))]
  return out


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
    prompts = load_prompt_set(task, model, args.num, 0, 0)
    ar = loopspec_jax.generate(model, prompts, max_new_tokens=args.new, method="ar")
    seqs = [p + t for p, t in zip(prompts, ar.tokens)]
    for d1 in (int(x) for x in args.d1.split(",")):
      pool = pools(model, seqs, [len(p) for p in prompts], d1, args.gamma, args.branch, args.new)
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
