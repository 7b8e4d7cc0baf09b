"""Token trees at every depth (decoding/tree/verify.py, decoding/tree/self_spec.py).

- The ancestor mask, duplicate merging and the accepted path of trees whose deepest node is at each depth 1..9,
  with the verifier told exactly that depth (`max_depth`): a pointer-jumping count one short loses the deepest
  nodes' link to the root at power-of-two depths (2, 4, 8), which only such trees show.
- EAGLE-2's expansion (`self_spec.expand_tree`, shared by tree self-speculation and EAGLE) with a stand-in
  drafter whose readout names the query token: every child's parent is the node whose logits proposed it,
  every frontier row's past mask is exactly its ancestors' run slots, and the top-1 path is kept.
- Greedy tree self-speculation equals AR at gamma 2 and 4 (contractive Huginn: deep nodes are accepted).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.decoding.tree import verify as tv


def brute_ancestors(parent):
  """anc[i, j]: j is i or an ancestor of i, by walking the parent links."""
  k = len(parent)
  anc = np.eye(k, dtype=bool)
  for i in range(k):
    j = i
    while j:
      j = parent[j]
      anc[i, j] = True
  return anc


def tree_of_depth(depth: int, seed: int = 0):
  """(tokens, parent) of a topological tree: a chain of `depth` nodes below the root and random side
  branches that never go deeper; tokens distinct among siblings."""
  rng = np.random.default_rng(seed + 100 * depth)
  parent, dep = [0] + list(range(depth)), list(range(depth + 1))
  for _ in range(depth + 3):
    u = int(rng.integers(0, len(parent)))
    if dep[u] < depth:
      parent.append(u), dep.append(dep[u] + 1)
  tokens = [10 + i for i in range(len(parent))]
  return np.asarray(tokens, np.int32), np.asarray(parent, np.int32), np.asarray(dep, np.int32)


@functools.partial(jax.jit, static_argnames=("depth",))
def verify_structure(tokens, parent, dep, dup_tok, dup_par, y, depth: int):
  """(ancestor mask, merged (parent, valid) of the tree with a duplicate appended, accepted (n, path, next))
  of one tree [K] told its depth: one compile per depth."""
  anc = tv.ancestor_mask(parent, depth)
  merged = tv.merge_duplicates(dup_tok, dup_par, jnp.ones(dup_tok.shape, bool), depth)
  tree = tv.Tree(tokens[None], parent[None], dep[None], jnp.ones((1,) + tokens.shape, bool))
  tree, anc_mask = tv.normalize(tree, depth)
  return anc, merged, tv.accept(tree, anc_mask, y[None], depth)


@pytest.mark.parametrize("depth", range(1, 10))
def test_ancestor_mask_duplicates_and_path_at_every_depth(depth):
  tokens, parent, dep = tree_of_depth(depth)
  anc = brute_ancestors(parent)
  assert anc.sum(1).max() == depth + 1
  # a duplicate of the deepest chain node (same parent, same token) is merged into it at any depth
  dup_tok, dup_par = np.append(tokens, tokens[depth]), np.append(parent, parent[depth])
  # target draws that accept the whole chain: the path runs from the root to the deepest node
  y = np.full(len(tokens), 999, np.int32)
  y[:depth] = tokens[1 : depth + 1]
  y[depth] = 7
  got, (par, valid), (n_acc, path, nxt) = verify_structure(tokens, parent, dep, dup_tok, dup_par, y, depth)
  np.testing.assert_array_equal(np.asarray(got), anc)
  assert not bool(valid[-1]) and bool(jnp.all(valid[:-1])) and np.array_equal(np.asarray(par[:-1]), parent)
  assert int(n_acc[0]) == depth and int(nxt[0]) == 7
  np.testing.assert_array_equal(np.asarray(path[0]), np.arange(depth + 1))


# ---------------------------------------------------------------------------------------------------
# EAGLE-2's expansion with a stand-in drafter
# ---------------------------------------------------------------------------------------------------
V = 512


def child_token(tok, rank):
  """The stand-in drafter's rank-th proposal after query token `tok` (distinct for every (tok, rank))."""
  return (tok * 5 + rank + 1) % V


def fake_level(carry, lvl, toks, order, past_mask):
  """`expand_tree`'s level function of a drafter whose readout after token t ranks child_token(t, r) r-th
  (log-probabilities that depend on t, so the frontier ranking is not the pool order). The carry collects
  each level's (toks, past_mask)."""
  b, s = toks.shape
  r = jnp.arange(6)
  bump = 3.0 - r[None, None, :] * (1.0 + 0.37 * (toks[:, :, None] % 3))
  at = (jnp.arange(b)[:, None, None], jnp.arange(s)[None, :, None], child_token(toks[:, :, None], r))
  logits = jnp.full((b, s, V), -30.0).at[at].set(bump)
  return logits, carry + ((toks, past_mask),)


@functools.partial(jax.jit, static_argnames=("gamma", "branch", "nodes"))
def expand_fake(root, gamma, branch, nodes):
  return self_spec.expand_tree(fake_level, (), root, gamma=gamma, branch=branch, tree_nodes=nodes)


@pytest.mark.parametrize("gamma,branch,nodes", [(4, 2, 10), (5, 3, 14)])
def test_expand_tree_children_hang_under_the_node_that_proposed_them(gamma, branch, nodes):
  root = jnp.asarray([3, 77], jnp.int32)
  tree, record = expand_fake(root, gamma, branch, nodes)
  tok, par, dep = (np.asarray(x) for x in (tree.tokens, tree.parent, tree.depth))
  for b in range(2):
    for i in range(1, nodes + 1):
      assert par[b, i] < i and dep[b, i] == dep[b, par[b, i]] + 1, (b, i)
      assert tok[b, i] in [child_token(int(tok[b, par[b, i]]), r) for r in range(branch)], (b, i)
    # the top-1 path (argmax child of argmax child ...) is kept to full depth
    u = 0
    for d in range(1, gamma + 1):
      kids = [i for i in range(1, nodes + 1) if par[b, i] == u and tok[b, i] == child_token(int(tok[b, u]), 0)]
      assert len(kids) == 1, (b, d)
      u = kids[0]
  # run slots: slot 0 the root, then `branch` per level in query order; each frontier row's past mask holds
  # exactly its ancestors' slots (found by inverting child_token level by level)
  inv = pow(5, -1, V)
  for b in range(2):
    slots = [(0, int(root[b]))]  # (level, token) per run slot
    for lvl, (toks, pm) in enumerate(record[1:], start=1):
      for j in range(branch):
        want, t = set(), int(toks[b, j])
        for up in range(lvl - 1, -1, -1):
          parents = {((t - r - 1) * inv) % V for r in range(branch)}
          hits = [s for s, (l, pt) in enumerate(slots) if l == up and pt in parents]
          assert len(hits) == 1, (lvl, b, j, hits)
          want.add(hits[0])
          t = slots[hits[0]][1]
        assert set(np.flatnonzero(np.asarray(pm)[b, j])) == want, (lvl, b, j)
      slots += [(lvl, int(x)) for x in np.asarray(toks)[b]]


@pytest.mark.parametrize("gamma", [2, 4])
def test_greedy_tree_equals_ar_at_gamma(gamma):
  spec = f"tree:d1=1,gamma={gamma},branch=2,tree_nodes={2 * gamma}"
  want = helpers.generate_cached("huginn:tiny", 0.05, "ar")
  got = helpers.generate_cached("huginn:tiny", 0.05, spec)
  assert got.tokens == want.tokens, got.stats
  assert got.stats["accepted_per_pass"] > 1.0, got.stats  # deep nodes are accepted
