"""Tests of logits processing, token sampling and request keys against direct numpy computations."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import chi2_pvalue
from loopspec_jax.decoding import sampling


def np_process(logits, temperature, top_k, top_p):
  """Reference: temperature, top-k, softmax, top-p nucleus, renormalise (float64, one row)."""
  z = np.asarray(logits, np.float64) / temperature
  v = z.shape[-1]
  order = np.argsort(-z, kind="stable")
  keep = np.ones(v, bool)
  if 0 < top_k < v:
    keep[:] = False
    keep[order[:top_k]] = True
  e = np.where(keep, np.exp(z - z.max()), 0.0)
  pr = e / e.sum()
  if top_p < 1:
    cum = 0.0
    nucleus = np.zeros(v, bool)
    for i in order:
      if pr[i] == 0:
        break
      nucleus[i] = True
      cum += pr[i]
      if cum >= top_p:
        break
    pr = np.where(nucleus, pr, 0.0)
    pr = pr / pr.sum()
  return pr


SETTINGS = [
    (1.0, 0, 1.0),
    (0.7, 0, 1.0),
    (1.5, 3, 1.0),
    (1.0, 1, 1.0),
    (1.0, 50, 1.0),  # top_k > V keeps everything
    (0.8, 0, 0.7),
    (1.0, 0, 0.3),
    (1.0, 0, 0.0),  # only the top token
    (1.2, 5, 0.9),
    (0.5, 4, 0.5),
]


# One compile for every setting: temperature, top_k and top_p are traced.
_process = jax.jit(lambda l, t, k, p: sampling.process_logits(l, greedy=False, temperature=t, top_k=k, top_p=p))
LOGITS = np.random.default_rng(3).normal(size=(4, 12)).astype(np.float32) * 2.0


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_process_logits_matches_numpy(temperature, top_k, top_p):
  logits = LOGITS
  got = np.asarray(_process(logits, np.float32(temperature), np.int32(top_k), np.float32(top_p)))
  assert got.dtype == np.float32
  for row in range(logits.shape[0]):
    want = np_process(np.asarray(logits[row]), temperature, top_k, top_p)
    np.testing.assert_allclose(got[row], want, atol=1e-6)
    np.testing.assert_array_equal(got[row] > 0, want > 0)
  np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)


# Rows with exact ties at, inside and across the top-k / top-p cut: the documented rule keeps the lower index.
TIED = np.array(
    [
        [1.0, 2.0, 2.0, 2.0, 0.0, 2.0, -1.0, 2.0],  # five-way tie at the top
        [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5],  # all equal
        [3.0, 1.0, 1.0, 3.0, 1.0, 1.0, 0.0, 1.0],  # tie of two above a tie of four
        [0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # one clear top, the rest tied
    ],
    np.float32,
)
TIED_SETTINGS = [
    (1.0, 2, 1.0),
    (1.0, 3, 1.0),
    (0.7, 1, 1.0),
    (1.0, 0, 0.3),
    (1.0, 0, 0.5),
    (1.3, 4, 0.45),
    (1.0, 5, 0.6),
]


@pytest.mark.parametrize("temperature,top_k,top_p", TIED_SETTINGS)
def test_tied_logits_match_numpy_lower_index_wins(temperature, top_k, top_p):
  got = np.asarray(_process(TIED, np.float32(temperature), np.int32(top_k), np.float32(top_p)))
  for row in range(TIED.shape[0]):
    want = np_process(TIED[row], temperature, top_k, top_p)
    np.testing.assert_array_equal(got[row] > 0, want > 0, err_msg=f"row {row}: support differs on a tie")
    np.testing.assert_allclose(got[row], want, atol=1e-6)


def test_tied_logits_keep_the_lowest_indices():
  """Spelled out: among equal logits the kept ones are the lowest indices, for top-k and for top-p."""
  keep = lambda k, p: np.flatnonzero(np.asarray(_process(TIED[:2], np.float32(1.0), np.int32(k), np.float32(p))) > 0)
  np.testing.assert_array_equal(keep(2, 1.0), [1, 2, 8 + 0, 8 + 1])  # row 0: indices 1, 2; row 1: 0, 1
  np.testing.assert_array_equal(keep(0, 0.3), [1, 2, 8 + 0, 8 + 1, 8 + 2])  # 0.2 each / 0.125 each


def test_process_logits_per_row_settings_and_leading_shape():
  logits = np.random.default_rng(5).normal(size=(2, 3, 10)).astype(np.float32) * 3.0
  t = jnp.array([[1.0, 0.5, 2.0], [0.9, 1.1, 1.0]])
  k = jnp.array([[0, 2, 5], [3, 0, 1]])
  p = jnp.array([[1.0, 0.9, 0.6], [1.0, 0.4, 1.0]])
  got = np.asarray(_process(logits, t, k, p))
  chex.assert_shape(got, (2, 3, 10))
  for i in range(2):
    for j in range(3):
      want = np_process(np.asarray(logits[i, j]), float(t[i, j]), int(k[i, j]), float(p[i, j]))
      np.testing.assert_allclose(got[i, j], want, atol=1e-6)


def test_process_logits_greedy_is_one_hot():
  logits = jnp.array([[0.1, 2.0, -1.0, 2.0], [5.0, 1.0, 1.0, 0.0]], jnp.bfloat16)
  got = sampling.process_logits(logits, greedy=True, temperature=0.7, top_k=2, top_p=0.5)
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, [[0, 1, 0, 0], [1, 0, 0, 0]])  # first maximum on ties
  # A traced temperature of 0 on the sampling path is greedy too.
  got0 = jax.jit(lambda l, t: sampling.process_logits(l, greedy=False, temperature=t))(logits, 0.0)
  np.testing.assert_array_equal(got0, got)


def test_sample_token_one_hot_exact():
  v = 7
  probs = jax.nn.one_hot(jnp.arange(v), v)
  keys = jax.random.split(jax.random.PRNGKey(0), 200)
  draws = jax.jit(jax.vmap(lambda k: sampling.sample_token(k, probs)))(keys)
  assert draws.dtype == jnp.int32
  np.testing.assert_array_equal(draws, np.broadcast_to(np.arange(v), (200, v)))


def test_sample_token_frequencies():
  probs = jnp.array([0.05, 0.0, 0.3, 0.15, 0.0, 0.5], jnp.float32)
  n = 40000
  keys = jax.random.split(jax.random.PRNGKey(1), n)
  draws = np.asarray(jax.jit(jax.vmap(lambda k: sampling.sample_token(k, probs)))(keys))
  counts = np.bincount(draws, minlength=6)
  assert chi2_pvalue(counts, probs) > 1e-3
  np.testing.assert_allclose(counts / n, probs, atol=0.01)


def test_request_key_layout_independent():
  base = jax.random.PRNGKey(42)
  ids = jnp.array([3, 0, 7, 3])
  pos = jnp.array([5, 5, 1, 6])
  batched = jax.jit(jax.vmap(sampling.request_key, in_axes=(None, 0, 0, None)))(base, ids, pos, sampling.PURPOSE_X1)
  for i in range(4):
    single = sampling.request_key(base, int(ids[i]), int(pos[i]), sampling.PURPOSE_X1)
    np.testing.assert_array_equal(batched[i], single)
  # Different request, position or purpose gives a different key.
  data = lambda k: tuple(
      np.asarray(jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) else k).tolist()
  )
  ks = {
      data(sampling.request_key(base, r, t, u))
      for r in range(3)
      for t in range(3)
      for u in (
          sampling.PURPOSE_X1,
          sampling.PURPOSE_X2,
          sampling.PURPOSE_VERIFY,
          sampling.PURPOSE_INIT,
          sampling.PURPOSE_AR,
      )
  }
  assert len(ks) == 45
  assert (
      len(
          {
              sampling.PURPOSE_X1,
              sampling.PURPOSE_X2,
              sampling.PURPOSE_VERIFY,
              sampling.PURPOSE_INIT,
              sampling.PURPOSE_AR,
          }
      )
      == 5
  )
