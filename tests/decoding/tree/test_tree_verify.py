"""The token-tree verifier on hand-made trees, no model (loopspec_jax/decoding/tree/verify.py): the ancestor
mask against a brute-force walk, duplicate siblings merged, the accepted path and emitted tokens for target
draws whose answer is known, and the KV rows the path write moves (and those it leaves alone)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.models import kvcache

# A hand-made tree (node: token, parent):
#            0:(7)
#        /     |     \
#     1:(3)  2:(5)   3:(9)
#     /  \     |
#  4:(4) 5:(6) 6:(8)
#    |
#  7:(2)
TOKENS = [7, 3, 5, 9, 4, 6, 8, 2]
PARENT = [0, 0, 0, 0, 1, 1, 2, 4]
DEPTH = [0, 1, 1, 1, 2, 2, 2, 3]


def brute_ancestors(parent):
  k = len(parent)
  anc = np.zeros((k, k), bool)
  for i in range(k):
    j = i
    while True:
      anc[i, j] = True
      if j == 0:
        break
      j = parent[j]
  return anc


def tree(tokens=TOKENS, parent=PARENT, depth=DEPTH, valid=None):
  b = lambda x, dt: jnp.asarray([x], dt)
  valid = [True] * len(tokens) if valid is None else valid
  return tv.Tree(
      tokens=b(tokens, jnp.int32), parent=b(parent, jnp.int32), depth=b(depth, jnp.int32), valid=b(valid, bool)
  )


@pytest.mark.parametrize("seed", range(4))
def test_ancestor_mask_matches_a_brute_force_walk(seed):
  """Random topological trees up to depth 9: log2 doublings reach every ancestor and nothing else."""
  rng = np.random.default_rng(seed)
  k = 24
  parent = [0] + [int(rng.integers(max(0, i - 3), i)) for i in range(1, k)]
  anc = brute_ancestors(parent)
  depth = anc.sum(1) - 1
  got = np.asarray(tv.ancestor_mask(jnp.asarray(parent), int(depth.max())))
  np.testing.assert_array_equal(got, anc)
  assert tv.doublings(int(depth.max())) == int(np.ceil(np.log2(depth.max() + 1)))


def test_duplicate_siblings_are_merged_and_their_children_move():
  """Node 3 repeats node 1 (same parent and token): it becomes invalid and its child 4 moves under node 1,
  where node 5 (token 6, like node 4) is then a later duplicate of node 4 and is merged into it; invalid
  node 6's child 7 is invalid."""
  tokens = [7, 3, 5, 3, 6, 6, 1, 2]
  parent = [0, 0, 0, 0, 3, 1, 2, 6]
  valid = [True, True, True, True, True, True, False, True]
  p, v = tv.merge_duplicates(jnp.asarray(tokens), jnp.asarray(parent), jnp.asarray(valid), 3)
  assert np.asarray(v).tolist() == [True, True, True, False, True, False, False, False]
  assert np.asarray(p).tolist()[4] == 1


def test_accepted_path_and_emitted_tokens():
  """Target draws y (the target's token after each node) chosen so the answers are known."""
  t = tree()
  t, anc = tv.normalize(t, 3)
  # y[0] = 3 accepts node 1; y[1] = 4 accepts node 4; y[4] = 2 accepts node 7; y[7] = 11 is the bonus.
  y = jnp.asarray([[3, 4, 0, 0, 2, 0, 0, 11]])
  n, path, nxt = tv.accept(t, anc, y, 3)
  assert int(n[0]) == 3 and path[0].tolist() == [0, 1, 4, 7] and int(nxt[0]) == 11
  # y[1] = 6 accepts node 5 (a leaf): two drafts, then y[5].
  y = jnp.asarray([[3, 6, 0, 0, 0, 13, 0, 0]])
  n, path, nxt = tv.accept(t, anc, y, 3)
  assert int(n[0]) == 2 and path[0].tolist() == [0, 1, 5, 0] and int(nxt[0]) == 13
  # y[0] = 5 accepts node 2; y[2] = 1 matches no child: one draft, then 1.
  y = jnp.asarray([[5, 4, 1, 0, 2, 0, 0, 0]])
  n, path, nxt = tv.accept(t, anc, y, 3)
  assert int(n[0]) == 1 and path[0].tolist()[:2] == [0, 2] and int(nxt[0]) == 1
  # No child of the root matches: nothing accepted, the root's draw is the next token (AR's token).
  y = jnp.asarray([[42, 4, 8, 0, 2, 0, 0, 0]])
  n, path, nxt = tv.accept(t, anc, y, 3)
  assert int(n[0]) == 0 and int(nxt[0]) == 42
  # An invalid node is never accepted, nor is anything below it.
  t2, anc2 = tv.normalize(tree(valid=[True, True, True, True, False, True, True, True]), 3)
  n, path, nxt = tv.accept(t2, anc2, jnp.asarray([[3, 4, 0, 0, 2, 0, 0, 11]]), 3)
  assert int(n[0]) == 1 and int(nxt[0]) == 4


def test_path_write_moves_exactly_the_accepted_rows():
  """Entries tagged with (slot, node) go to positions p0 + depth for the accepted path only; every other row
  of every buffer keeps its old value."""
  from loopspec_configs.models import model_config

  cfg = model_config("huginn:tiny")
  layout = kvcache.CacheLayout.of(cfg, 2)
  t_len, k = 20, len(TOKENS)
  cache = kvcache.empty_cache(cfg, layout, 1, t_len)
  cache = jax.tree.map(lambda x: x - 1.0, cache)  # old rows: -1
  kv, d = cfg.num_kv_heads, cfg.head_dim
  node = jnp.arange(k, dtype=jnp.float32)[None, :, None, None]  # [B, K, 1, 1]
  mk = lambda lead, tag: tag + jnp.broadcast_to(node, lead + (1, k, kv, d)) + jnp.zeros(lead + (1, k, kv, d))
  r = cfg.recurrence
  entries = {
      "pre": (mk((cfg.n_prelude,), 100.0), mk((cfg.n_prelude,), 200.0)),
      "core": [
          (0, mk((3, cfg.n_core), 1000.0), mk((3, cfg.n_core), 2000.0)),
          (3, mk((r - 3, cfg.n_core), 3000.0), mk((r - 3, cfg.n_core), 4000.0)),
      ],
      "coda": {1: (mk((cfg.n_coda,), 300.0), mk((cfg.n_coda,), 400.0))},
  }
  p0 = jnp.asarray([9])
  path, n_acc = jnp.asarray([[0, 1, 4, 0]]), jnp.asarray([2])  # nodes 0, 1, 4 at positions 9, 10, 11
  out = tv.write_path(cache, layout, entries, path, p0, n_acc, jnp.zeros(()))
  expect_pos = {9: 0, 10: 1, 11: 4}
  k0 = np.asarray(out.prelude[0][0])[0]  # [KV, T, D]
  c0 = np.asarray(out.core[0][0])  # [R, B, KV, T, D]
  coda_r = np.asarray(out.coda[0][1])  # [n_readouts, B, KV, T, D]
  for pos in range(t_len):
    if pos in expect_pos:
      assert np.all(k0[:, pos] == 100.0 + expect_pos[pos])
      assert np.all(c0[1, 0, :, pos] == 1000.0 + expect_pos[pos]) and np.all(
          c0[5, 0, :, pos] == 3000.0 + expect_pos[pos]
      )
      assert np.all(coda_r[1, 0, :, pos] == 400.0 + expect_pos[pos])
    else:
      assert np.all(k0[:, pos] == -1.0) and np.all(c0[:, 0, :, pos] == -1.0) and np.all(coda_r[1, 0, :, pos] == -1.0)
  assert np.all(np.asarray(out.coda[0][0])[0] == -1.0)  # the d1 readout's coda buffer was not in `entries`
