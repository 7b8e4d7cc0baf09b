"""Static rules for choosing a tree's nodes from a drafted candidate pool (pure functions, per request batch).

A pool (as `tree/self_spec.py` drafts it): arrays [B, P] of tokens, scores (cumulative draft log-probability;
+inf on the always-kept top-1 path), parent pool indices (< own index; entry 0 is the root) and depths. The
rules return a `verify.Tree` of 1 + tree_nodes entries in pool order (topological), parents re-indexed:

- `by_score` (EAGLE-2's rule, what self_spec.select does): the tree_nodes best scores over the whole pool;
- `by_level`: a quota per depth, quotas[d - 1] best scores among the depth-d candidates. Deep levels are not
  starved by the many shallow alternatives whose cumulative scores are higher. A node whose parent was not
  kept is invalid (the verifier's `normalize` then drops its subtree), so any quotas are safe; quotas[d - 1]
  >= branch for d < gamma keep every expanded frontier node (the frontier is the top-`branch` of its level
  by the same score and tie rule), so no node is lost that way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from loopspec_jax.decoding.tree import verify as tv


def _gather(tokens, parent, depth, keep, ok):
  """The tree of pool entries keep [N] (sorted, keep[0] = 0) with validity ok [N] and its parent kept."""
  at = jnp.where(ok, keep, tokens.shape[0])  # invalid picks (possibly repeats of valid ones) are not indexed
  new_index = jnp.full(tokens.shape, -1, jnp.int32).at[at].set(jnp.arange(keep.shape[0], dtype=jnp.int32), mode="drop")
  par = new_index[parent[keep]].at[0].set(0)
  valid = ok & (par >= 0)
  return tokens[keep], jnp.where(valid, par, 0), depth[keep], valid.at[0].set(True)


def by_level(tokens, score, parent, depth, quotas: tuple) -> tv.Tree:
  """The root plus, per depth d = 1..len(quotas), the quotas[d - 1] best-scored depth-d pool entries (ties:
  lower pool index), in pool order. Entries picked past a level's candidates (score -inf) are invalid."""
  quotas = tuple(int(q) for q in quotas)

  def one(tokens, score, parent, depth):
    picks, oks = [jnp.zeros((1,), jnp.int32)], [jnp.ones((1,), bool)]
    for d, q in enumerate(quotas, start=1):
      if q <= 0:
        continue
      s, idx = jax.lax.top_k(jnp.where(depth == d, score, -jnp.inf), q)
      picks.append(idx.astype(jnp.int32))
      oks.append(s > -jnp.inf)
    pick, ok = jnp.concatenate(picks), jnp.concatenate(oks)
    order = jnp.argsort(jnp.where(ok, pick, tokens.shape[0] + jnp.arange(pick.shape[0])))
    return _gather(tokens, parent, depth, pick[order], ok[order])

  tok, par, dep, valid = jax.vmap(one)(tokens, score, parent, depth)
  return tv.Tree(tokens=tok.astype(jnp.int32), parent=par, depth=dep, valid=valid)


def by_score(tokens, score, parent, depth, tree_nodes: int) -> tv.Tree:
  """The root plus the tree_nodes best-scored pool entries (EAGLE-2's rule; self_spec.select's result)."""

  def one(tokens, score, parent, depth):
    best = jax.lax.top_k(score[1:], tree_nodes)[1] + 1
    keep = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.sort(best).astype(jnp.int32)])
    return _gather(tokens, parent, depth, keep, jnp.ones(keep.shape, bool))

  tok, par, dep, valid = jax.vmap(one)(tokens, score, parent, depth)
  return tv.Tree(tokens=tok.astype(jnp.int32), parent=par, depth=dep, valid=valid)


def even_quotas(branch: int, gamma: int, tree_nodes: int) -> tuple:
  """Quotas per depth summing to tree_nodes: depth 1 all of its `branch` candidates (at most tree_nodes), the
  rest spread evenly over depths 2..gamma (earlier depths get the remainder), each within its branch^2."""
  first = min(branch, tree_nodes)
  if gamma == 1:
    return (first,)
  rest, n = tree_nodes - first, gamma - 1
  q = [rest // n + (1 if i < rest % n else 0) for i in range(n)]
  if max(q) > branch * branch:
    raise ValueError(f"{tree_nodes} nodes do not fit {gamma} levels of at most {branch * branch}")
  return (first, *q)
