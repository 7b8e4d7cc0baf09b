"""Tests of logits processing, token sampling and request keys against direct numpy computations."""
import os
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

# Let `.venv/bin/pytest` import the package from a bare checkout (no install / conftest needed).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from loopspec_jax import sampling  # noqa: E402


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


def chi2_pvalue(counts, probs):
  """Chi-square p-value of counts vs probs; zero-probability cells must be empty, small cells are pooled."""
  counts = np.asarray(counts, np.float64).ravel()
  probs = np.asarray(probs, np.float64).ravel()
  assert counts[probs <= 0].sum() == 0, "a zero-probability outcome was drawn"
  n = counts.sum()
  exp = probs * n
  big = exp >= 5
  obs = list(counts[big])
  ex = list(exp[big])
  if (~big).any() and exp[~big].sum() > 0:
    obs.append(counts[~big].sum())
    ex.append(exp[~big].sum())
  obs, ex = np.array(obs), np.array(ex)
  if len(obs) < 2:
    return 1.0
  return stats.chisquare(obs, ex * obs.sum() / ex.sum()).pvalue


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
  batched = jax.jit(jax.vmap(sampling.request_key, in_axes=(None, 0, 0, None)))(base, ids, pos,
                                                                                 sampling.PURPOSE_X1)
  for i in range(4):
    single = sampling.request_key(base, int(ids[i]), int(pos[i]), sampling.PURPOSE_X1)
    np.testing.assert_array_equal(batched[i], single)
  # Different request, position or purpose gives a different key.
  data = lambda k: tuple(np.asarray(jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key)
                                    else k).tolist())
  ks = {data(sampling.request_key(base, r, t, u)) for r in range(3) for t in range(3)
        for u in (sampling.PURPOSE_X1, sampling.PURPOSE_X2, sampling.PURPOSE_VERIFY, sampling.PURPOSE_INIT,
                  sampling.PURPOSE_AR)}
  assert len(ks) == 45
  assert len({sampling.PURPOSE_X1, sampling.PURPOSE_X2, sampling.PURPOSE_VERIFY, sampling.PURPOSE_INIT,
              sampling.PURPOSE_AR}) == 5
