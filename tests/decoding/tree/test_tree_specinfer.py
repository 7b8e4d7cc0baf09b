"""SpecInfer's multi-step speculative sampling on sampled trees (decoding/tree/specinfer.py), chi-square tested
against the exact target distribution enumerated in closed form.

A depth-2 tree over a 4-token vocabulary: the root's 2 children drawn i.i.d. from q0, each child's 2 children
from q1[its token] (duplicates allowed). The first two emitted tokens (t1, t2) must follow p0(t1) p1[t1](t2):
when a round emits one token, t2 is the next round's first draw, taken from p1[t1] itself. The sample size
gives power >= 0.99 against any alternative at total variation 0.05 (`helpers.chi2_power`); the biased rule
(residual not renormalised) fails the same test.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from loopspec_jax.decoding.tree import specinfer

V = 4
PARENT = jnp.asarray([0, 0, 0, 1, 1, 2, 2])
N = 40_000


def dists(seed):
  rng = np.random.default_rng(seed)
  p0 = helpers.rand_dist(rng, V, "sparse")
  p1 = np.stack([helpers.rand_dist(rng, V, "dense" if a % 2 else "sparse") for a in range(V)])
  q0 = helpers.rand_dist(rng, V)
  q1 = np.stack([helpers.rand_dist(rng, V) for _ in range(V)])
  p2 = helpers.rand_dist(rng, V)  # the bonus after two accepted levels (does not affect (t1, t2))
  return p0, p1, q0, q1, p2


@functools.partial(jax.jit, static_argnames=("renormalize",))
def trials(key, p0, p1, q0, q1, p2, renormalize=True):
  def one(k):
    k1, k2, k3, k4 = jax.random.split(k, 4)
    c1 = jax.random.categorical(k1, jnp.log(q0), shape=(2,))
    c2 = jax.vmap(lambda kk, a: jax.random.categorical(kk, jnp.log(q1[a]), shape=(2,)))(jax.random.split(k2, 2), c1)
    tokens = jnp.concatenate([jnp.zeros((1,), jnp.int32), c1, c2.reshape(-1)]).astype(jnp.int32)
    p = jnp.stack([p0, p1[c1[0]], p1[c1[1]], p2, p2, p2, p2])
    q = jnp.stack([q0, q1[c1[0]], q1[c1[1]], q0, q0, q0, q0])  # leaves' q is never used
    n, path, y = specinfer.verify_multistep(k3, tokens, PARENT, jnp.ones((7,), bool), p, q, 2, renormalize)
    nxt = jax.random.categorical(k4, jnp.log(p1[y]))  # next round's draw after y
    return (*helpers.first_two_emitted(n, path, y, nxt, tokens), n)

  return jax.vmap(one)(jax.random.split(key, N))


def counts(t1, t2):
  return helpers.pair_counts(t1, t2, V)


@pytest.mark.parametrize("seed", [0, 1])
def test_multistep_sampling_matches_exact_enumeration(seed):
  p0, p1, q0, q1, p2 = dists(seed)
  exact = p0[:, None] * p1
  assert helpers.chi2_power(N, exact, tv=0.05, alpha=0.01) >= 0.99
  t1, t2, n = trials(jax.random.PRNGKey(seed), *map(jnp.asarray, (p0, p1, q0, q1, p2)))
  pval = helpers.chi2_pvalue(counts(t1, t2), exact)
  assert pval > 0.01, pval
  n = np.asarray(n)
  assert (n == 0).any() and (n == 1).any() and (n == 2).any()  # every outcome of the walk occurs


def test_unnormalised_residual_fails_the_same_test():
  """p0 = (.1, .2, .3, .4), q0 reversed: the unnormalised rule emits t1 with (.1, .2, .24, .46) (TV 0.06)."""
  _, p1, _, q1, p2 = dists(0)
  p0 = np.asarray([0.1, 0.2, 0.3, 0.4], np.float32)
  q0 = p0[::-1].copy()
  exact = p0[:, None] * p1
  t1, t2, _ = trials(jax.random.PRNGKey(0), *map(jnp.asarray, (p0, p1, q0, q1, p2)), renormalize=False)
  assert helpers.chi2_pvalue(counts(t1, t2), exact, check_support=False) < 1e-6
