"""Logits processing, token sampling and per-(request, position) PRNG keys.

`process_logits` is the ONE logits-to-distribution path of every decoder (AR, chain, LoopSpec), so
q1 = p_d1, p_d2 and p_R are all filtered identically; greedy decoding is the temperature-0 case: it yields
one-hot distributions and every verification kernel reduces to argmax matching on them.

Randomness is keyed by (seed, request, position, purpose) only (`request_key`): a request's tokens do not
depend on which other requests share its batch, on its slot, or on how many ticks a decoder needed.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# What a key is used for; folded into the key so that different uses never share randomness.
PURPOSE_X1 = 1  # first proposal draw x1 ~ q1 (depth d1)
PURPOSE_X2 = 2  # second proposal draw x2 ~ q2 (depth d2)
PURPOSE_VERIFY = 3  # verification uniforms and the residual draw (depth R)
PURPOSE_INIT = 4  # random initial recurrent state (Raven family)
PURPOSE_AR = 5  # plain autoregressive draw from p_R


def first_max_onehot(x):
  """one_hot(argmax(x)) (first maximum on ties) via two plain reductions, which vectorise on CPU where a
  variadic (value, index) argmax reduction does not."""
  v = x.shape[-1]
  iota = jnp.arange(v, dtype=jnp.int32)
  m = jnp.max(x, axis=-1, keepdims=True)
  first = jnp.min(jnp.where(x == m, iota, v), axis=-1, keepdims=True)
  return (iota == first).astype(jnp.float32)


def greedy_token(logits):
  """argmax over the last axis (first maximum on ties) as int32, via two plain reductions (see above)."""
  x = jnp.asarray(logits, jnp.float32)
  v = x.shape[-1]
  m = jnp.max(x, axis=-1, keepdims=True)
  return jnp.min(jnp.where(x == m, jnp.arange(v, dtype=jnp.int32), v), axis=-1).astype(jnp.int32)


def process_logits(logits, *, greedy: bool, temperature=1.0, top_k=0, top_p=1.0):
  """Turn logits [..., V] into float32 probabilities over the last axis.

  greedy (a static Python bool) gives one-hot(argmax), first maximum on ties. Otherwise: divide by the
  temperature, keep the top_k largest (top_k <= 0: all; ties broken towards the lower index), softmax, keep
  the smallest descending-sorted prefix whose cumulative probability reaches top_p (the top token always;
  top_p >= 1: all), renormalise. temperature, top_k and top_p may be traced scalars or arrays of the leading
  shape (per-row settings); they are applied with a sort and masks, never Python branches. A traced
  temperature <= 0 also gives one-hot(argmax), so it cannot produce NaNs.
  """
  logits = jnp.asarray(logits, jnp.float32)
  v = logits.shape[-1]
  onehot = first_max_onehot(logits)
  if greedy:
    return onehot
  t = jnp.asarray(temperature, jnp.float32)[..., None]
  k = jnp.asarray(top_k, jnp.int32)[..., None]
  tp = jnp.asarray(top_p, jnp.float32)[..., None]
  z = logits / jnp.where(t > 0, t, 1.0)
  # Descending order, equal values in index order (stable sort of the negation).
  order = jnp.argsort(-z, axis=-1, stable=True)
  zs = jnp.take_along_axis(z, order, axis=-1)
  rank = jnp.arange(v, dtype=jnp.int32)
  zs = jnp.where((k <= 0) | (rank < k), zs, -jnp.inf)
  ps = jax.nn.softmax(zs, axis=-1)
  # Exclusive cumulative sum: token i is kept iff the mass strictly before it is still below top_p.
  before = jnp.concatenate([jnp.zeros_like(ps[..., :1]), jnp.cumsum(ps, axis=-1)[..., :-1]], axis=-1)
  keep = (tp >= 1.0) | (before < tp) | (rank == 0)
  ps = jnp.where(keep, ps, 0.0)
  ps = ps / jnp.sum(ps, axis=-1, keepdims=True)
  probs = jnp.take_along_axis(ps, jnp.argsort(order, axis=-1), axis=-1)
  return jnp.where(t > 0, probs, onehot)


def sample_token(key, probs):
  """Draw an int32 token from probs [V] by inverting the CDF with one uniform; one-hot returns its index.

  The token is the first index whose cumulative mass exceeds u * total, so a zero-probability token (whose
  cumulative mass equals its predecessor's) is never drawn. One uniform per draw instead of V Gumbels keeps
  the per-lane drafting of speculative decoders cheap.
  """
  p = jnp.asarray(probs, jnp.float32)
  return sample_with_uniform(jax.random.uniform(key, p.shape[:-1], jnp.float32), p)


def sample_with_uniform(u, probs):
  """The inverse-CDF draw of `sample_token` for a given uniform u in [0, 1) (shape: probs' leading dims)."""
  p = jnp.asarray(probs, jnp.float32)
  c = jnp.cumsum(p, axis=-1)
  u = u * c[..., -1]
  idx = jnp.sum(c <= u[..., None], axis=-1)
  # Rounding can make u * total reach the total: fall back to the last token with positive mass.
  last = jnp.max(jnp.where(p > 0, jnp.arange(p.shape[-1], dtype=jnp.int32), 0), axis=-1)
  return jnp.minimum(idx, last).astype(jnp.int32)


def request_key(base_key, request_id, position, purpose):
  """The key for one (request, position, purpose): a fold_in chain on the run's base key.

  Because it depends only on (seed, request, position, purpose), sampled outputs do not depend on batch
  layout, slot assignment or scheduling. Scalar arguments; vmap over arrays of request ids / positions.
  """
  # Two hashes: the request, then (position, purpose) packed in one word (positions < 2^27).
  key = jax.random.fold_in(base_key, request_id)
  return jax.random.fold_in(key, jnp.asarray(position, jnp.uint32) * 16 + jnp.asarray(purpose, jnp.uint32))
