"""Sampled (T = 1) acceptance of tree drafts along AR's text: per context, the target's and the drafter's
distributions, the probability that each sibling rank is accepted under SpecInfer's rule (with and without
replacement, top-k drafts, the optimal-transport bound) and under K-SEQ, and the expected accepted drafts
and drawn accepted depths of a static shape given the emitted text (`tree_shape --sampled`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.decoding import common
from loopspec_jax.decoding import passes
from loopspec_jax.decoding.tree import spectr
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.experiment.tree_replay import prefilled_text
from loopspec_jax.experiment.tree_replay import simulate
from loopspec_jax.models import looped as M


def chain_dists(model, seqs, plens, d1: int, gamma: int, new: int, sp):
  """(p, q) [O, B, gamma, V] and x [O, B, gamma]: along AR's text from every offset o, the target's processed
  distribution p at the depth-l node (root + AR's next l tokens, one full-depth tree pass, i.e. the
  verifier's own p), the drafter's q there (the depth-d1 readout with AR's tokens as in-flight ancestors,
  exactly what the decoder drafts from when that path was accepted) and AR's token x at depth l + 1."""
  cfg = model.config
  b = len(seqs)
  tokens, cache, layout = prefilled_text(model, seqs, d1, gamma, sp)
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


def accept_stats(model, seqs, plens, d1: int, gamma: int, branch: int, new: int, draws: int) -> dict:
  """Along AR's T = 1 text: {mode: (a, w)} of `sibling_accept` (PRNG key 1) and "kseq": `kseq_accept`'s,
  as numpy arrays (w None for the bounds)."""
  sp = common.make_sampling_params(len(seqs), new, 1.0, 0, 1.0, 0, None)
  p, q, x = chain_dists(model, seqs, plens, d1, gamma, new, sp)
  stats = {
      m: tuple(None if v is None else np.asarray(v) for v in av)
      for m, av in sibling_accept(p, q, x, jax.random.PRNGKey(1), branch=branch, draws=draws).items()
  }
  stats["kseq"] = tuple(np.asarray(v) for v in kseq_accept(p, q, x, branch=branch))
  return stats


def value_and_tau(shape, w, new: int, reps: int, rng, counts: bool = False) -> tuple:
  """(the exact expected accepted drafts per round from an offset, mean over offsets; tau: the mean of `reps`
  simulations of rounds along the text with depths drawn given it) of a static shape under w."""
  value = float(shape_value(shape, w, counts).mean())
  return value, float(np.mean([simulate(sample_depths(shape, w, rng, counts), new)["tau"] for _ in range(reps)]))
