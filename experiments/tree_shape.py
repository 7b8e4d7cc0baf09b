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
   along AR's text (`tree_bound.simulate`): tau. Writes out/shape.json and out/shape.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

import loopspec_jax
from loopspec_jax.decoding import common
from loopspec_jax.decoding import passes
from loopspec_jax.decoding.tree import draft_tree as dt
from loopspec_jax.decoding.tree import sequoia
from loopspec_jax.decoding.tree import spectr
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.experiment.prompts import load_prompt_set
from loopspec_experiments import tree_bound
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
  b = len(seqs)
  sp = common.make_sampling_params(b, new, 0.0, 0, 1.0, 0, None)
  tokens, cache, layout = tree_bound.prefilled_text(model, seqs, d1, gamma, sp)
  t = tokens.shape[1]

  @jax.jit
  def draft(params, cache, toks, p0):
    params = M.prepare_params(params, cfg)
    root = toks[jnp.arange(b), p0]
    logits0, past = passes.run_level(params, cache, layout, root[:, None], p0, 0, None, None, d1, cfg, None)
    run = lambda lvl, tk, past, pm: passes.run_level(params, cache, layout, tk, p0, lvl, past, pm, d1, cfg, None)
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
  prompts = load_prompt_set(task, model, hi, 0, 0)[lo:hi]
  ar = loopspec_jax.generate(model, prompts, max_new_tokens=new, method="ar")
  return [p + t for p, t in zip(prompts, ar.tokens)], [len(p) for p in prompts]


# ---------------------------------------------------------------------------------------------------
# Sampled calibration (--sampled): per-rank acceptance of sampled-draft siblings at T = 1
# ---------------------------------------------------------------------------------------------------
def chain_dists(model, seqs, plens, d1: int, gamma: int, new: int, sp):
  """(p, q) [O, B, gamma, V] and x [O, B, gamma]: along AR's text from every offset o, the target's processed
  distribution p at the depth-l node (root + AR's next l tokens, one full-depth tree pass, i.e. the
  verifier's own p), the drafter's q there (the depth-d1 readout with AR's tokens as in-flight ancestors,
  exactly what the decoder drafts from when that path was accepted) and AR's token x at depth l + 1."""
  cfg = model.config
  b = len(seqs)
  tokens, cache, layout = tree_bound.prefilled_text(model, seqs, d1, gamma, sp)
  tri = np.tril(np.ones((gamma + 1, gamma + 1), bool))

  @jax.jit
  def one(params, cache, toks, p0):
    params = M.prepare_params(params, cfg)
    path = jnp.take_along_axis(toks, p0[:, None] + jnp.arange(gamma + 1)[None], axis=1)  # [B, gamma + 1]
    qs, past = [], None
    for lvl in range(gamma):
      pm = None if lvl == 0 else jnp.ones((b, 1, lvl), bool)
      lg, new_e = passes.run_level(params, cache, layout, path[:, lvl : lvl + 1], p0, lvl, past, pm, d1, cfg, None)
      past = passes.append_level(past, new_e)
      qs.append(lg[:, 0])
    depth = jnp.broadcast_to(jnp.arange(gamma + 1, dtype=jnp.int32), (b, gamma + 1))
    par = jnp.broadcast_to(jnp.maximum(jnp.arange(gamma + 1, dtype=jnp.int32) - 1, 0), (b, gamma + 1))
    tree = tv.Tree(tokens=path, parent=par, depth=depth, valid=jnp.ones((b, gamma + 1), bool))
    anc = jnp.broadcast_to(jnp.asarray(tri), (b, gamma + 1, gamma + 1))
    pl = tv.tree_pass(params, cache, layout, tree, anc, p0, ((d1, 0), (cfg.recurrence, 1)), cfg)[0]
    p = common.row_distributions(pl[:, :gamma], sp)
    q = common.row_distributions(jnp.stack(qs, axis=1), sp)
    return p, q, path[:, 1:]

  out = []
  for o in range(new):  # AR's text runs gamma tokens past the budget: every path lies inside it
    out.append(one(model.params, cache, jnp.asarray(tokens), jnp.asarray(np.asarray(plens) - 1 + o, jnp.int32)))
  return tuple(jnp.stack(z) for z in zip(*out))


def _norm(r):
  s = jnp.sum(r, -1, keepdims=True)
  return jnp.where(s > 0, r / jnp.where(s > 0, s, 1.0), r)


@functools.partial(jax.jit, static_argnames=("branch", "draws"))
def sibling_accept(p, q, x, key, *, branch: int, draws: int):
  """Per context (leading axes of p, q [..., V], x [...] the target's emitted token there), per sibling rank
  k < branch: a[k] = P(sibling k is the accepted child) and w[k] = P(sibling k accepted | the emitted token is
  x) under SpecInfer's rule, for children drawn from q with replacement ("sample": exact, the residual does
  not depend on the rejected token), without ("distinct": the rejected tokens drawn `draws` times, Monte
  Carlo), and deterministic top-k drafts ("topk": rank k = the k-th best of q, accepted iff the target's
  draw is it). Returns {mode: (a, w)} each [..., branch]."""
  px = jnp.take_along_axis(p, x[..., None], -1)[..., 0]
  safe = jnp.where(px > 0, px, 1.0)
  out = {}
  r, surv, a, w = p, jnp.ones(p.shape[:-1]), [], []
  for _ in range(branch):
    m = jnp.minimum(r, q)
    a.append(surv * jnp.sum(m, -1))
    w.append(surv * jnp.take_along_axis(m, x[..., None], -1)[..., 0] / safe)
    surv = surv * (1.0 - jnp.sum(m, -1))
    r = _norm(jnp.maximum(r - q, 0.0))
  out["sample"] = (jnp.stack(a, -1), jnp.stack(w, -1))

  def distinct(k):
    r, left, surv, a, w = p, q, jnp.ones(p.shape[:-1]), [], []
    for j in range(branch):
      qj = _norm(left)
      m = jnp.minimum(r, qj)
      a.append(surv * jnp.sum(m, -1))
      w.append(surv * jnp.take_along_axis(m, x[..., None], -1)[..., 0] / safe)
      surv = surv * (1.0 - jnp.sum(m, -1))
      rej = _norm(jnp.maximum(qj - r, 0.0))  # the drawn sibling's token given it was rejected
      tok = jax.random.categorical(jax.random.fold_in(k, j), jnp.log(jnp.maximum(rej, 1e-30)))
      r = _norm(jnp.maximum(r - qj, 0.0))
      left = left * (1.0 - jax.nn.one_hot(tok, left.shape[-1], dtype=left.dtype))
    return jnp.stack(a, -1), jnp.stack(w, -1)

  da, dw = jax.vmap(distinct)(jax.random.split(key, draws))
  out["distinct"] = (da.mean(0), dw.mean(0))
  top = jax.lax.top_k(q, branch)[1]
  out["topk"] = (jnp.take_along_axis(p, top, -1), (top == x[..., None]).astype(p.dtype))
  # the bound of ANY verification of k i.i.d. drafts from q (optimal coupling, SpecTr): P(accepted among the
  # first k) <= sum_x min(p(x), 1 - (1 - q(x))^k); entry k: the gain of the k-th draw (no w: no tau replay)
  c = [jnp.sum(jnp.minimum(p, 1.0 - (1.0 - q) ** (k + 1)), -1) for k in range(branch)]
  out["ot bound"] = (jnp.stack([c[0]] + [c[k] - c[k - 1] for k in range(1, branch)], -1), None)
  top_p = jax.lax.top_k(p, branch)[0]  # deterministic drafts, even chosen knowing p: the target's top-k mass
  out["topk of p bound"] = (top_p, None)
  return out


@functools.partial(jax.jit, static_argnames=("branch",))
def kseq_accept(p, q, x, *, branch: int):
  """K-SEQ (`spectr.py`) per context and child count c = 1..branch: a [..., c - 1, i] = P(slot i is the
  accepted child | c children) = beta_c (1 - beta_c)^i and w [..., c - 1, i] = the same given the emitted
  token x, (1 - beta_c)^i min(q(x), p(x) / rho_c) / p(x) (exact: no Monte Carlo); zero past slot c - 1."""
  px = jnp.take_along_axis(p, x[..., None], -1)[..., 0]
  qx = jnp.take_along_axis(q, x[..., None], -1)[..., 0]
  lead = p.shape[:-1]
  flat = lambda z: z.reshape((-1,) + z.shape[len(lead) :])
  a, w = [], []
  for c in range(1, branch + 1):
    rho = jax.lax.map(lambda pq: spectr.kseq_rho(pq[0], pq[1], c), (flat(p), flat(q))).reshape(lead)
    beta = jnp.sum(jnp.minimum(q, p / rho[..., None]), -1)
    mx = jnp.minimum(qx, px / rho) / jnp.where(px > 0, px, 1.0)
    i = jnp.arange(branch)
    tail = (1.0 - beta[..., None]) ** i * (i < c)
    a.append(beta[..., None] * tail), w.append(mx[..., None] * tail)
  return jnp.stack(a, -2), jnp.stack(w, -2)


def node_w(shape, w, counts: bool = False):
  """[K] per node (entry 0 unused) the slices of w: w[..., depth - 1, rank], or with counts (K-SEQ's
  w [..., gamma, c - 1, i]) w[..., depth - 1, children of the parent - 1, rank]."""
  kids = [sum(1 for j in range(1, len(shape.parent)) if shape.parent[j] == u) for u in range(len(shape.parent))]
  out = [None]
  for i in range(1, len(shape.parent)):
    d, r = shape.depth[i] - 1, shape.rank[i]
    out.append(w[..., d, kids[shape.parent[i]] - 1, r] if counts else w[..., d, r])
  return out


def shape_value(shape, w, counts: bool = False) -> np.ndarray:
  """[...]: the expected accepted drafts of a static shape given the emitted path (w [..., gamma, branch]:
  P(rank k accepted at depth l + 1 | emitted tokens); counts: `node_w`): the sum over nodes of the product
  along their path."""
  nw = node_w(shape, w, counts)
  reach = [np.ones(nw[1].shape)]
  for i in range(1, len(shape.parent)):
    reach.append(reach[shape.parent[i]] * nw[i])
  return np.sum(reach[1:], axis=0)


def sample_depths(shape, w, rng, counts: bool = False) -> np.ndarray:
  """[O, B] accepted depths drawn given the emitted text: P(depth >= d) = sum over depth-d nodes of reach."""
  nw = node_w(shape, w, counts)
  reach = [np.ones(nw[1].shape)]
  at = np.zeros(nw[1].shape + (max(shape.depth) + 1,))
  for i in range(1, len(shape.parent)):
    reach.append(reach[shape.parent[i]] * nw[i])
    at[..., shape.depth[i]] += reach[-1]
  at[..., 0] = 1.0
  u = rng.random(nw[1].shape)
  return np.sum(at[..., 1:] > u[..., None], axis=-1)


def sampled_main(args, model, tasks):
  """--sampled: vectors per drafts mode and d1 from AR's T = 1 text on prompts 8..15; shapes evaluated
  (exact expected accepted per offset, rounds simulated with depths drawn given the text) on prompts 0..7.
  drafts="kseq" (`kseq_accept`, `kseq_rows`): a count table per d1 instead of a vector."""
  g, br, n, new = args.gamma, args.branch, args.nodes, args.new
  t1 = lambda tk, lo, hi: sampled_continuation(model, tk, lo, hi, new + g, args.seed)
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
        sp = common.make_sampling_params(len(seqs), new, 1.0, 0, 1.0, 0, None)
        p, q, x = chain_dists(model, seqs, plens, d1, g, new, sp)
        stats[split, tk] = {
            m: tuple(None if v is None else np.asarray(v) for v in av)
            for m, av in sibling_accept(p, q, x, jax.random.PRNGKey(1), branch=br, draws=args.draws).items()
        }
        stats[split, tk]["kseq"] = tuple(np.asarray(v) for v in kseq_accept(p, q, x, branch=br))
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
      shapes = {k: sequoia.sequoia_shape(sequoia.parse_accept(v, g, br), g, br, n) for k, v in cand.items()}
      shapes["ACCEPT_GUESS static"] = dt.static_shape(g, br, n)
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
          res["value"][key][tk] = float(shape_value(shape, w).mean())
          res["tau"][key][tk] = float(
              np.mean([tree_bound.simulate(sample_depths(shape, w, rng), new)["tau"] for _ in range(args.reps)])
          )
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
      res["value"][key][tk] = float(shape_value(shape, w, counts=True).mean())
      sims = [tree_bound.simulate(sample_depths(shape, w, rng, counts=True), new)["tau"] for _ in range(args.reps)]
      res["tau"][key][tk] = float(np.mean(sims))
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


def sampled_continuation(model, task: str, lo: int, hi: int, new: int, seed: int):
  prompts = load_prompt_set(task, model, hi, 0, 0)[lo:hi]
  ar = loopspec_jax.generate(model, prompts, max_new_tokens=new, method="ar", temperature=1.0, seed=seed)
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
  head = (
      f"Replayed greedy tau (tokens per verify pass) of static tree shapes, tiny-raven, gamma {g}, branch {br}, "
      f"{n} nodes; acceptance measured on prompts 8..15 of each task, tau on prompts 0..7, {args.new} new tokens. "
      "'model E[accepted]' is the Sequoia model's expected accepted drafts under the pooled vector "
      "(per-depth row: its own).\n\n"
  )
  write_results(args, "shape", results, head + "\n".join(lines))


if __name__ == "__main__":
  main()
