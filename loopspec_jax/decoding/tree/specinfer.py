"""SpecInfer's multi-step speculative sampling over a token tree whose children were SAMPLED from a drafter.

For trees of deterministic drafts (top-k, n-grams, head argmaxes) `tree/verify.py` draws AR's own tokens and
follows them. When a drafter instead samples each node's children i.i.d. from its distribution q_u (a draft
model's sampled tree), the exact rule is SpecInfer's (Miao et al., ASPLOS 2024, Algorithm 2):

  at node u with target p (p_u at first): for the children x_1, x_2, ... of u in order, accept x_i with
  probability min(1, p(x_i) / q_u(x_i)) and move to it (its own target p_{x_i}); on rejection set
  p <- norm(max(p - q_u, 0)) and try the next child; if every child is rejected, emit a draw from the current
  p and stop. At a node without children the draw is from its target (the bonus token).

The emitted tokens are distributed exactly as the target's own sequential draws, for any q and any number of
children (duplicates allowed: a token drawn twice is simply tried twice). Pure single-request functions over
static shapes (vmap over a batch); `renormalize=False` is a deliberately biased variant for negative-control
tests (the unnormalised residual shrinks later siblings' acceptance ratios).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from loopspec_jax.decoding import common
from loopspec_jax.decoding import sampling
from loopspec_jax.decoding.sampling import sample_with_uniform
from loopspec_jax.decoding.tree import spectr
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.decoding.verify import acceptance_prob


def _residual(p, q, renormalize: bool):
  r = jnp.maximum(0.0, p - q)
  s = jnp.sum(r)
  if not renormalize:
    return jnp.where(s > 0, r, p)
  return jnp.where(s > 0, r / jnp.where(s > 0, s, 1.0), p / jnp.sum(p))


def verify_multistep(
    key, tokens, parent, valid, p, q, max_depth: int, renormalize: bool = True, replacement: bool = True
):
  """-> (n_accepted int32, path [max_depth + 1] node index per depth (0 past n), next token int32).

  tokens / parent / valid [K] a topological tree (node 0 the root; siblings in index order); p [K, V] the
  target at every node; q [K, V] the drafter's distribution at every node, from which that node's children
  were drawn. One uniform per (depth, node) for the acceptance tests and one for the final draw.

  replacement=False: the children were drawn WITHOUT replacement (sibling i from q with siblings 1..i-1
  removed, renormalised): sibling i is then tested against that q_i and the residual is taken against q_i
  (recursive rejection sampling; exact for the same reason, each step being one speculative-sampling step of
  a fresh proposal given the history). A sibling whose q_i has no mass left is skipped.
  """
  k = tokens.shape[0]
  ua, uf = spectr.tree_uniforms(key, max_depth, k)
  p = jnp.asarray(p, jnp.float32)
  q = jnp.asarray(q, jnp.float32)
  idx = jnp.arange(k)

  def level(d, carry):
    u, cur, stopped, final, n, path = carry

    def sibling(j, c):
      cur_p, moved, left = c
      mass = jnp.sum(left)
      q_j = left / jnp.where(mass > 0, mass, 1.0)
      is_child = (parent[j] == u) & valid[j] & (idx[j] > 0) & (moved < 0) & ~stopped & (mass > 0)
      acc = is_child & (ua[d, j] < acceptance_prob(cur_p, q_j, tokens[j]))
      cur_p = jnp.where(is_child & ~acc, _residual(cur_p, q_j, renormalize), cur_p)
      if not replacement:  # the next sibling was drawn with this one removed
        left = jnp.where(is_child, left.at[tokens[j]].set(0.0), left)
      return cur_p, jnp.where(acc, j, moved), left

    res_p, moved, _ = jax.lax.fori_loop(0, k, sibling, (cur, jnp.int32(-1), q[u]))
    adv = moved >= 0
    final = jnp.where(~stopped & ~adv, res_p, final)
    stopped = stopped | ~adv
    u = jnp.where(adv, moved, u)
    path = path.at[d + 1].set(jnp.where(adv, moved, 0))
    return u, jnp.where(adv, p[jnp.maximum(moved, 0)], cur), stopped, final, n + adv, path

  init = (jnp.int32(0), p[0], jnp.bool_(False), p[0], jnp.int32(0), jnp.zeros((max_depth + 1,), jnp.int32))
  u, cur, stopped, final, n, path = jax.lax.fori_loop(0, max_depth, level, init)
  final = jnp.where(stopped, final, cur)  # every level accepted: the bonus from the last node's target
  return n.astype(jnp.int32), path, sample_with_uniform(uf[0], final)


def verify_round(
    params,
    st,
    sp,
    tree,
    q,
    *,
    cfg,
    layout,
    readouts,
    max_depth: int,
    random_init: bool,
    replacement: bool = True,
    rule: str = "specinfer",
):
  """`verify.verify_round` for a tree of SAMPLED drafts (q [B, K, V]: the drafter's distribution at every
  node, from which that node's children were drawn i.i.d.): one full-depth pass of every node, the target's
  processed p at every node, the rule per request (key: request, p0 + 1, PURPOSE_VERIFY; p0 names the round),
  the accepted path written, commit and count. Duplicate siblings are kept (tried again). rule: "specinfer"
  (`verify_multistep`, with or without replacement) or "kseq" (SpecTr's K-SEQ, `spectr.verify_kseq`, i.i.d.
  children only)."""
  p0 = st.length - 1
  k = tree.tokens.shape[1]
  anc = jax.vmap(lambda par, val: (tv.ancestor_mask(par, max_depth) & val[None, :]) | jnp.eye(k, dtype=bool))(
      tree.parent, tree.valid
  )
  noise = common.state_noise(sp, p0[:, None] + tree.depth, cfg) if random_init else None
  logits, entries, after = tv.tree_pass(params, st.cache, layout, tree, anc, p0, readouts, cfg, noise)
  p = common.row_distributions(logits, sp)
  keys = jax.vmap(lambda rid, pos: sampling.request_key(sp.base_key, rid, pos, sampling.PURPOSE_VERIFY))(
      sp.request_ids, p0 + 1
  )
  if rule == "kseq":
    if not replacement:
      raise ValueError("K-SEQ verifies children drawn i.i.d. (with replacement) only")
    fn = lambda *a: spectr.verify_kseq(*a, max_depth)
  else:
    fn = lambda *a: verify_multistep(*a, max_depth, replacement=replacement)
  n_acc, path, nxt = jax.vmap(fn)(keys, tree.tokens, tree.parent, tree.valid, p, q)
  cache = tv.write_path(st.cache, layout, entries, path, p0, n_acc, after)
  drafts = jnp.take_along_axis(tree.tokens, path[:, 1:], axis=1)
  live = ~st.done
  n_nodes = jnp.sum(tree.valid, axis=1) - 1
  upd = common.commit_round(st, drafts, n_acc, nxt, sp)
  return st.replace(cache=cache, **upd, nodes=st.nodes + jnp.where(live, n_nodes, 0))
