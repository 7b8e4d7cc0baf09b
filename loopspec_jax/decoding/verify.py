"""Lossless verification kernels: LoopSpec's gated second proposal and cascade, and chain verification.

Pure single-request functions over float32 vectors [V] (vmap them over a batch axis). Distributions come
from `sampling.process_logits`, so greedy decoding passes one-hot vectors and every rule below reduces to
argmax matching with no special case. The building blocks (`acceptance_prob`, `residual`) are public so
tests can compose the exact output distribution of each rule.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from loopspec_jax.decoding.sampling import sample_token, sample_with_uniform


def acceptance_prob(p, q, x):
  """min(1, p[x] / q[x]): the probability of accepting proposal x ~ q for target p.

  Guard q[x] == 0 (x could not have been drawn; only float mishaps reach it): accept iff p[x] > 0, which
  keeps every accepted token inside the target's support and never divides by zero.
  """
  p = jnp.asarray(p, jnp.float32)
  q = jnp.asarray(q, jnp.float32)
  px, qx = p[x], q[x]
  ratio = jnp.minimum(1.0, px / jnp.where(qx > 0, qx, 1.0))
  return jnp.where(qx > 0, ratio, jnp.where(px > 0, 1.0, 0.0)).astype(jnp.float32)


def residual(p, q, fallback=None):
  """norm(max(0, p - q)), the target after rejecting a draw from q; `fallback` when it has no mass.

  fallback=None means norm(p). It only matters when p <= q everywhere (p == q up to float error), where a
  rejection has (near) zero probability, so any valid distribution over p's support keeps decoding exact.
  """
  p = jnp.asarray(p, jnp.float32)
  q = jnp.asarray(q, jnp.float32)
  r = jnp.maximum(0.0, p - q)
  s = jnp.sum(r)
  if fallback is None:
    fallback = p / jnp.sum(p)
  fallback = jnp.asarray(fallback, jnp.float32)
  return jnp.where(s > 0, r / jnp.where(s > 0, s, 1.0), fallback)


def second_proposal(key, q1, x1, p_d2, min_mass=0.0):
  """The gated residual second proposal at depth d2 -> (gate_open bool, x2 int32, q2 [V]).

  r = max(0, p_d2 - q1) with r[x1] = 0; the gate opens iff sum(r) > 0 and p_d2[x1] < q1[x1] (x1 looks likely
  to be rejected) and sum(r) >= min_mass. Open: q2 = r / sum(r), x2 ~ q2. Closed: q2 = 0 and x2 = -1.
  min_mass = 0 is the paper's gate; a larger one keeps the second proposal for the draws where depth d2
  moved real mass away from q1 (a branch lane costs rows on every tick of its life). The gate never looks
  at the verification uniforms, so it keeps decoding lossless for any min_mass. One-hot inputs: x2 = argmax
  p_d2, open iff x2 != x1 (the residual then has mass 1, so min_mass <= 1 changes nothing).
  """
  q1 = jnp.asarray(q1, jnp.float32)
  p_d2 = jnp.asarray(p_d2, jnp.float32)
  r = jnp.maximum(0.0, p_d2 - q1).at[x1].set(0.0)
  s = jnp.sum(r)
  gate = (s > 0) & (s >= min_mass) & (p_d2[x1] < q1[x1])
  q2 = jnp.where(gate, r / jnp.where(s > 0, s, 1.0), 0.0)
  x2 = jnp.where(gate, sample_token(key, q2), -1).astype(jnp.int32)
  return gate, x2, q2


def verify_cascade(key, p, x1, q1, gate_open, x2, q2):
  """LoopSpec's cascade verification at depth R -> (y int32, stage int32).

  Accept x1 iff u1 < min(1, p[x1]/q1[x1]) (stage 1). Else F = norm(max(0, p - q1)) (no mass: norm(p)); if the
  gate was open accept x2 iff u2 < min(1, F[x2]/q2[x2]) (stage 2); else sample y (stage 0) from
  norm(max(0, F - q2)) (no mass: F) when the gate was open, or from F when it was not. gate_open False is the
  single-proposal speculative sampling rule. y ~ p exactly for any q1 and any q2 (x2 ~ q2).
  """
  p = jnp.asarray(p, jnp.float32)
  q1 = jnp.asarray(q1, jnp.float32)
  q2 = jnp.asarray(q2, jnp.float32)
  # Three independent uniforms from one draw (u1, u2, and the residual draw): one PRNG call per verification.
  u1, u2, u3 = jax.random.uniform(key, (3,), jnp.float32)
  acc1 = u1 < acceptance_prob(p, q1, x1)
  f = residual(p, q1)
  x2c = jnp.where(gate_open, x2, 0)
  acc2 = jnp.logical_not(acc1) & gate_open & (u2 < acceptance_prob(f, q2, x2c))
  final = jnp.where(gate_open, residual(f, q2, fallback=f), f)
  y0 = sample_with_uniform(u3, final)
  y = jnp.where(acc1, x1, jnp.where(acc2, x2, y0)).astype(jnp.int32)
  stage = jnp.where(acc1, 1, jnp.where(acc2, 2, 0)).astype(jnp.int32)
  return y, stage


def verify_chain(key, p, drafts, q):
  """Standard left-to-right verification of G chained drafts -> (n_accepted int32 in 0..G, next_token int32).

  p [G+1, V]: target at each drafted position plus the bonus one; drafts [G]; q [G, V] their draft
  distributions. Accept draft i with min(1, p_i[x_i]/q_i[x_i]) while all earlier ones were accepted; at the
  first rejection sample from norm(max(0, p_i - q_i)) (no mass: p_i); if all are accepted sample the bonus
  token from p[G]. Static shapes: the accepted count is the sum of a cumulative product.
  """
  return verify_chain_upto(key, p, drafts, q, jnp.shape(drafts)[0])


def verify_chain_upto(key, p, drafts, q, n_max):
  """`verify_chain` that examines only the first n_max (traced int, 0..G) of the G drafts -> (n, next_token).

  For draft lengths chosen per request at run time (`gamma="auto"`, prompt lookup without a match) under
  static shapes [G]: drafts i >= n_max are never accepted and, when the first n_max are all accepted, the next
  token is the bonus draw from p[n_max] itself (not a residual). This is standard verification of n_max
  drafts, so it is exact whenever n_max does not depend on this round's uniforms or drafts. q may be one-hot
  (prompt lookup: acceptance is then p_i(x_i) and the residual is p_i without x_i, renormalised).
  """
  p = jnp.asarray(p, jnp.float32)
  q = jnp.asarray(q, jnp.float32)
  drafts = jnp.asarray(drafts, jnp.int32)
  g = drafts.shape[0]
  uu = jax.random.uniform(key, (g + 1,), jnp.float32)
  u, us = uu[:g], uu[g]
  a = jax.vmap(acceptance_prob)(p[:g], q, drafts)
  ok = (u < a) & (jnp.arange(g) < n_max)
  n = jnp.sum(jnp.cumprod(ok.astype(jnp.int32))).astype(jnp.int32)
  q_pad = jnp.concatenate([q, jnp.zeros_like(p[:1])], axis=0)
  q_n = jnp.where(n < n_max, q_pad[n], 0.0)  # rejected draft n: residual; all n_max accepted: p[n_max] itself
  nxt = sample_with_uniform(us, residual(p[n], q_n))
  return n, nxt
