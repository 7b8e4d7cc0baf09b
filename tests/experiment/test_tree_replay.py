"""loopspec_jax/experiment/tree_replay.py and tree_accept.py (the replay behind `tree_bound` / `tree_shape`):
which pool nodes lie on AR's path, accepted depths, simulated rounds, per-rank counts and the sampled
acceptance of sibling ranks. Small hand-made pools and distributions, no model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loopspec_jax.decoding.tree import draft_tree as dt
from loopspec_jax.experiment import tree_accept
from loopspec_jax.experiment import tree_replay

# root 0; depth 1: nodes 1 (rank 0), 2 (rank 1); depth 2: node 3 under 1, node 4 under 2
PAR = np.array([0, 0, 0, 1, 2])
DEP = np.array([0, 1, 1, 2, 2])


def test_on_path_needs_every_ancestor_and_depth_of_takes_the_deepest():
  tok = np.array([[9, 5, 6, 7, 7], [9, 6, 5, 7, 7]])
  truth = np.array([[0, 5, 5, 7, 7], [0, 5, 5, 7, 7]])  # AR's token at each node's position
  ok = tree_replay.on_path(tok.copy(), np.broadcast_to(PAR, tok.shape), truth)
  np.testing.assert_array_equal(ok, [[1, 1, 0, 1, 0], [1, 0, 1, 0, 1]])
  np.testing.assert_array_equal(tree_replay.depth_of(ok, DEP), [2, 2])
  valid = np.array([[1, 1, 1, 0, 1], [1, 1, 1, 1, 1]], bool)
  ok = tree_replay.on_path(tok.copy(), np.broadcast_to(PAR, tok.shape), truth, valid)
  np.testing.assert_array_equal(tree_replay.depth_of(ok, DEP), [1, 2])


def test_runs_and_simulate_commit_k_plus_one_tokens_per_round():
  ok = np.array([[True], [True], [False], [True], [True], [True]])
  np.testing.assert_array_equal(tree_replay.runs(ok, 2)[:, 0], [2, 1, 0, 2, 2, 1])
  k = np.array([[2], [0], [0], [1], [0], [0]])
  sim = tree_replay.simulate(k, 6)  # rounds at 0 (3 tokens), 3 (2 tokens), 5 (clipped to 0: 1 token)
  assert sim["rounds"] == 3 and sim["tau"] == 2.0
  assert sim["starts"] == [(0, 0, 2, False), (3, 0, 1, False), (5, 0, 0, False)]
  assert tree_replay.simulate(np.full((4, 1), 3), 4)["starts"] == [(0, 0, 3, False)]
  assert tree_replay.simulate(np.full((4, 1), 5), 4)["starts"] == [(0, 0, 3, True)]


def test_rank_counts_counts_a_rank_zero_trial_per_accepted_parent():
  # one offset kept (new - gamma = 1), branch 2: the root's children 1, 2 and node 2's children 3, 4
  pool = {
      "tokens": np.array([[[9, 5, 6, 7, 8]], [[0] * 5], [[0] * 5]]),
      "parent": np.broadcast_to([0, 0, 0, 2, 2], (3, 1, 5)),
      "depth": np.broadcast_to(DEP, (3, 1, 5)),
      "truth": np.array([[[0, 6, 6, 8, 8]]] * 3),
  }
  hits, trials = tree_replay.rank_counts(pool, gamma=2, branch=2, new=3)
  np.testing.assert_array_equal(hits, [[0, 1], [0, 1]])  # AR's token was rank 1 at both depths
  np.testing.assert_array_equal(trials, [1, 1])


def _dists(key, shape=(3,), v=6):
  kp, kq, kx = jax.random.split(key, 3)
  p = jax.nn.softmax(2 * jax.random.normal(kp, shape + (v,)))
  q = jax.nn.softmax(2 * jax.random.normal(kq, shape + (v,)))
  return p, q, jax.random.categorical(kx, jnp.log(p))


def test_sibling_accept_rank_zero_is_the_overlap_and_ranks_sum_below_one():
  p, q, x = _dists(jax.random.PRNGKey(0))
  out = tree_accept.sibling_accept(p, q, x, jax.random.PRNGKey(1), branch=2, draws=2)  # compiled once here
  overlap = np.sum(np.minimum(p, q), -1)
  for mode in ("sample", "distinct"):
    a, w = out[mode]
    np.testing.assert_allclose(a[..., 0], overlap, rtol=1e-5)
    assert np.all(np.sum(a, -1) <= 1 + 1e-5) and np.all(np.asarray(w) >= 0)
  # the same draws give the same sampled acceptance whether weighted by p (a) or given x, averaged over x ~ p
  a, w = out["topk"]
  np.testing.assert_allclose(a[..., 0], np.take_along_axis(p, np.argmax(q, -1)[:, None], -1)[:, 0], rtol=1e-6)
  bound = out["ot bound"][0]
  assert np.all(np.cumsum(bound, -1) + 1e-5 >= np.cumsum(out["sample"][0], -1))
  ka, kw = tree_accept.kseq_accept(p, q, x, branch=2)
  assert ka.shape == kw.shape == (3, 2, 2) and np.all(np.asarray(ka)[:, 0, 1] == 0)  # one child: slot 0 only
  assert np.all(np.sum(ka, -1) <= 1 + 1e-5)


def test_shape_value_and_sample_depths_of_a_chain():
  g = 3
  chain = dt.ordered_shape(list(range(-1, g)), list(range(g + 1)), [0] * (g + 1), g)
  ones, zeros = np.ones((5, 2, g, 2)), np.zeros((5, 2, g, 2))
  np.testing.assert_allclose(tree_accept.shape_value(chain, ones), 3.0)
  np.testing.assert_allclose(tree_accept.shape_value(chain, zeros), 0.0)
  half = np.full((5, 2, g, 2), 0.5)
  np.testing.assert_allclose(tree_accept.shape_value(chain, half), 0.5 + 0.25 + 0.125)
  rng = np.random.default_rng(0)
  np.testing.assert_array_equal(tree_accept.sample_depths(chain, ones, rng), 3)
  np.testing.assert_array_equal(tree_accept.sample_depths(chain, zeros, rng), 0)
  counts = np.ones((5, 2, g, 2, 2))  # K-SEQ's w [..., gamma, children - 1, rank]
  np.testing.assert_allclose(tree_accept.shape_value(chain, counts, counts=True), 3.0)


@pytest.mark.parametrize("mode", ["sample", "distinct"])
def test_identical_distributions_accept_rank_zero_always(mode):
  p, _, x = _dists(jax.random.PRNGKey(2))
  a, w = tree_accept.sibling_accept(p, p, x, jax.random.PRNGKey(3), branch=2, draws=2)[mode]
  np.testing.assert_allclose(a, np.stack([np.ones(3), np.zeros(3)], -1), atol=1e-5)
  np.testing.assert_allclose(w[..., 0], 1.0, atol=1e-5)


def test_pooled_accept_and_the_candidate_shapes():
  counts = {
      "a": (np.array([[3.0, 1.0], [1.0, 0.0]]), np.array([4.0, 2.0])),
      "b": (np.zeros((2, 2)), np.array([0.0, 2.0])),
  }
  flat, per_depth = tree_replay.pooled_accept(counts)
  np.testing.assert_allclose(flat, [0.5, 0.125])
  np.testing.assert_allclose(per_depth, [[0.75, 0.25], [0.25, 0.0]])
  shapes = tree_replay.sequoia_shapes({"flat": tuple(flat), "per depth": tuple(map(tuple, per_depth))}, 2, 2, 4)
  assert list(shapes) == ["flat", "per depth", "ACCEPT_GUESS static"]
  assert all(len(s.parent) == 5 and max(s.depth) <= 2 for s in shapes.values())


def test_value_and_tau_of_a_chain_that_always_accepts():
  g = 2
  chain = dt.ordered_shape(list(range(-1, g)), list(range(g + 1)), [0] * (g + 1), g)
  value, tau = tree_accept.value_and_tau(chain, np.ones((6, 1, g, 2)), 6, reps=2, rng=np.random.default_rng(0))
  assert value == 2.0 and tau == 3.0  # rounds of 3 tokens along the 6-token text
