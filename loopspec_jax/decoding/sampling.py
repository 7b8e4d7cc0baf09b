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


def _exclusive_cumsum(x):
  return jnp.concatenate([jnp.zeros_like(x[..., :1]), jnp.cumsum(x, axis=-1)[..., :-1]], axis=-1)


def _scatter_last(values, index, v: int):
  """zeros [..., V] with values [..., C] placed at index [..., C] (per leading row)."""
  lead = values.shape[:-1]
  flat = jax.vmap(lambda val, idx: jnp.zeros((v,), values.dtype).at[idx].set(val))(
      values.reshape((-1, values.shape[-1])), index.reshape((-1, index.shape[-1]))
  )
  return flat.reshape(lead + (v,))


def _filtered_full(z, k, tp):
  """top-k / top-p after a full stable sort of the vocabulary (descending, ties in index order)."""
  v = z.shape[-1]
  order = jnp.argsort(-z, axis=-1, stable=True).astype(jnp.int32)
  zs = jnp.take_along_axis(z, order, axis=-1)
  rank = jnp.arange(v, dtype=jnp.int32)
  in_k = (k <= 0) | (rank < k)
  e = jnp.where(in_k, jnp.exp(zs - zs[..., :1]), 0.0)  # softmax's own arithmetic over the top-k set
  ps = e / jnp.sum(e, axis=-1, keepdims=True)
  # Token i is kept iff the mass strictly before it (descending order) is still below top_p.
  keep = in_k & ((tp >= 1.0) | (_exclusive_cumsum(ps) < tp) | (rank == 0))
  kept = jnp.where(keep, ps, 0.0)
  return _scatter_last(kept / jnp.sum(kept, axis=-1, keepdims=True), order, v)


def _nucleus(z, tp):
  """top-p without sorting (top_k = 0): bisection on the float32 bit pattern for the smallest probability value
  tau whose mass strictly above it is below top_p; tokens above tau are kept, tokens equal to tau in index
  order while the mass before them stays below top_p (the stable-sort rule), the rest dropped. 31 passes of
  one compare-and-sum over the vocabulary instead of a sort (a full sort on CPU)."""
  p = jax.nn.softmax(z, axis=-1)
  above = lambda x: jnp.sum(jnp.where(p > x, p, 0.0), axis=-1, keepdims=True)  # mass strictly above x

  def halve(_, lohi):
    lo, hi = lohi
    mid = lo + (hi - lo) // 2
    below = above(jax.lax.bitcast_convert_type(mid, jnp.float32)) < tp
    return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

  hi0 = jax.lax.bitcast_convert_type(jnp.max(p, axis=-1, keepdims=True), jnp.int32)
  _, hi = jax.lax.fori_loop(0, 31, halve, (jnp.zeros_like(hi0), hi0))
  tau = jax.lax.bitcast_convert_type(hi, jnp.float32)
  tied = jnp.where(p == tau, p, 0.0)
  keep = (p > tau) | ((p == tau) & (above(tau) + cumsum_last(tied) - tied < tp)) | (first_max_onehot(z) > 0)
  kept = jnp.where(keep, p, 0.0)
  return kept / jnp.sum(kept, axis=-1, keepdims=True)


def _filtered(z, k, tp):
  """top-k (any k > 0: a full stable sort) or top-p alone (`_nucleus`: no sort)."""
  return jax.lax.cond(jnp.any(k > 0), lambda: _filtered_full(z, k, tp), lambda: _nucleus(z, tp))


def process_logits(logits, *, greedy: bool, temperature=1.0, top_k=0, top_p=1.0):
  """Turn logits [..., V] into float32 probabilities over the last axis.

  greedy (a static Python bool) gives one-hot(argmax), first maximum on ties. Otherwise: divide by the
  temperature, keep the top_k largest (top_k <= 0: all; ties broken towards the lower index), softmax, keep
  the smallest descending-sorted prefix whose cumulative probability reaches top_p (the top token always;
  top_p >= 1: all), renormalise. temperature, top_k and top_p may be traced scalars or arrays of the leading
  shape (per-row settings). Without top-k / top-p nothing is sorted (a plain softmax); top-p alone is decided by
  a bisection on the probability threshold (no sort); top-k uses a full stable sort (`lax.cond` picks).
  A traced temperature <= 0 also gives one-hot(argmax), so it cannot produce NaNs.
  """
  logits = jnp.asarray(logits, jnp.float32)
  onehot = first_max_onehot(logits)
  if greedy:
    return onehot
  t = jnp.asarray(temperature, jnp.float32)[..., None]
  k = jnp.asarray(top_k, jnp.int32)[..., None]
  tp = jnp.asarray(top_p, jnp.float32)[..., None]
  z = logits / jnp.where(t > 0, t, 1.0)
  needs_filter = jnp.any((k > 0) | (tp < 1.0))
  probs = jax.lax.cond(needs_filter, lambda: _filtered(z, k, tp), lambda: jax.nn.softmax(z, axis=-1))
  return jnp.where(t > 0, probs, onehot)


def sample_token(key, probs):
  """Draw an int32 token from probs [V] by inverting the CDF with one uniform; one-hot returns its index.

  The token is the first index whose cumulative mass exceeds u * total, so a zero-probability token (whose
  cumulative mass equals its predecessor's) is never drawn. One uniform per draw instead of V Gumbels keeps
  the per-lane drafting of speculative decoders cheap.
  """
  p = jnp.asarray(probs, jnp.float32)
  return sample_with_uniform(jax.random.uniform(key, p.shape[:-1], jnp.float32), p)


def cumsum_last(p, block: int = 32):
  """Inclusive cumulative sum over the last axis as two small triangular matmuls (within blocks of `block`,
  then block offsets): a few ops, where XLA CPU lowers jnp.cumsum to a quadratic reduce-window."""
  v = p.shape[-1]
  if v % block or v <= block:
    return jax.lax.associative_scan(jnp.add, p, axis=-1)
  blocks = p.reshape(p.shape[:-1] + (v // block, block))
  tri = jnp.triu(jnp.ones((block, block), p.dtype))
  within = jnp.einsum("...nb,bc->...nc", blocks, tri, precision=jax.lax.Precision.HIGHEST)
  nb = v // block
  offsets = jnp.einsum(
      "...n,nm->...m", within[..., -1], jnp.triu(jnp.ones((nb, nb), p.dtype), 1), precision=jax.lax.Precision.HIGHEST
  )
  return (within + offsets[..., None]).reshape(p.shape)


def sample_with_uniform(u, probs):
  """The inverse-CDF draw of `sample_token` for a given uniform u in [0, 1) (shape: probs' leading dims)."""
  p = jnp.asarray(probs, jnp.float32)
  c = cumsum_last(p)
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
