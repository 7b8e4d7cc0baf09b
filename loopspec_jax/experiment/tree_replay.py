"""Greedy replay of tree self-speculation along AR's own text: the drafted pool at every offset, which nodes
lie on AR's path, the accepted depth of any selection rule or static shape, and rounds simulated from it.

Greedy output is AR's, and a round's tree depends only on the committed text, so the tree at every position
of AR's continuation can be drafted once, offline: the continuation is prefilled (readouts at d1 and R,
exactly the caches the tree decoder keeps), and for every offset o the drafter drafts from the root at
p0 = prompt length - 1 + o, attending only to positions < p0. A pool node is on AR's path iff its token and
its ancestors' equal AR's tokens at their positions. The entry points `loopspec_experiments.tree_bound` and
`tree_shape` are these functions plus their tables.
"""

from __future__ import annotations

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

import loopspec_jax
from loopspec_jax.decoding import common
from loopspec_jax.decoding import passes
from loopspec_jax.decoding.tree import draft_tree as dt
from loopspec_jax.decoding.tree import select as select_lib
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.decoding.tree import sequoia
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
  """[...]: the deepest on-path node's depth (ok, dep [..., P]; 0 when only the root is on the path)."""
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
  """tree_bound's figures from a pool (`pools`): tau of every rule (chain, by_score, by_level quotas, the
  pool and top-`branch` oracles), the decoder's rule's per-depth acceptance, how often a rejected level's
  AR token was in the d1 top-`branch`, and the per-level top-1 / top-`branch` hit rates."""
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


def rank_counts(pool, gamma: int, branch: int, new: int):
  """(hits [gamma, branch], trials [gamma]) over the offsets whose whole tree lies inside AR's text."""
  keep = slice(0, new - gamma)
  tok, par, dep, truth = (pool[k][keep] for k in ("tokens", "parent", "depth", "truth"))
  ok = on_path(tok.copy(), par, truth)
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
  tokens, cache, layout = prefilled_text(model, seqs, d1, gamma, sp)
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
    out.append(depth_of(on_path(np.asarray(tree.tokens), par, truth), depth))
  return np.stack(out)


def continuation(model, task: str, lo: int, hi: int, new: int, **sampling):
  """AR's continuation (`new` tokens; `sampling`: generate's temperature / seed, greedy by default) of
  prompts lo..hi-1 of a task: (prompt + continuation token lists, prompt lengths)."""
  prompts = load_prompt_set(task, model, hi, 0, 0)[lo:hi]
  ar = loopspec_jax.generate(model, prompts, max_new_tokens=new, method="ar", **sampling)
  return [p + t for p, t in zip(prompts, ar.tokens)], [len(p) for p in prompts]


def pooled_accept(counts: dict) -> tuple:
  """(flat [branch], per_depth [gamma, branch]) acceptance per rank from `rank_counts` of every task
  ({task: (hits, trials)}), pooled over the tasks: flat over every depth, per_depth per depth."""
  hits = sum(c[0] for c in counts.values())
  trials = sum(c[1] for c in counts.values())
  return hits.sum(0) / max(trials.sum(), 1), hits / np.maximum(trials, 1)[:, None]


def sequoia_shapes(vectors: dict, gamma: int, branch: int, nodes: int) -> dict:
  """{name: Sequoia shape} of each named acceptance vector (or per-depth matrix), plus draft_tree's
  ACCEPT_GUESS static shape: the candidates a shape experiment evaluates."""
  shapes = {
      k: sequoia.sequoia_shape(sequoia.parse_accept(v, gamma, branch), gamma, branch, nodes) for k, v in vectors.items()
  }
  shapes["ACCEPT_GUESS static"] = dt.static_shape(gamma, branch, nodes)
  return shapes
