"""SpecTr's K-SEQ verification (Sun et al., NeurIPS 2023, "SpecTr: Fast Speculative Decoding via Optimal
Transport", Algorithm K-SEQ) over a token tree whose children were drawn i.i.d. from the drafter.

At a node with target p and k >= 1 children X_1..X_k drawn i.i.d. (with replacement) from q:

  choose rho in [1, k]; m(x) = min(q(x), p(x) / rho), beta = sum_x m(x); test the children in slot order,
  accepting X_i with probability min(1, p(X_i) / (rho q(X_i))) = m(X_i) / q(X_i); the first accepted is
  the emitted token (move to that child, whose own children are verified the same way against its own p, q
  and child count); if all k are rejected emit a draw from p_res = norm(p - m f(beta)), f(b) = (1 - (1 -
  b)^k) / b = sum_{j<k} (1 - b)^j, and stop. A node without children draws from p (the bonus token).

Exactness. One slot accepts token x with probability q(x) m(x) / q(x) = m(x) and rejects with 1 - beta,
independently of the other slots (i.i.d. draws, fresh uniforms), so
  P(emit x through slot i) = (1 - beta)^(i - 1) m(x),   P(emit x by acceptance) = m(x) f(beta),
the total acceptance is beta f(beta) = 1 - (1 - beta)^k, and the residual's mass is (1 - beta)^k. Hence
P(emit x) = m(x) f(beta) + (1 - beta)^k p_res(x) = p(x) exactly, PROVIDED p_res >= 0, i.e.
p(x) >= m(x) f(beta) for every x. Where m(x) = p(x) / rho this reads rho >= f(beta); where m(x) = q(x) <
p(x) / rho it follows from it (q(x) f(beta) <= q(x) rho < p(x)). So rho is valid iff rho >= f(beta(rho))
(sufficient always; necessary when some x has q(x) >= p(x) / rho > 0). f decreases from k (b = 0) to 1
(b = 1), so rho = k is always valid, and at k = 1 f = 1: rho = 1 is ordinary speculative sampling. beta
decreases with rho and the acceptance 1 - (1 - beta)^k with it, so the best valid rho is the smallest; the
bisection below keeps `hi` valid throughout (it returns a valid rho even where the valid set is not an
interval). Trees: which child is accepted depends only on the siblings' tokens and the uniforms, never on
their subtrees; given the accepted child and its token x, its subtree is a fresh i.i.d. sample from q_x of a
count fixed by the static shape, so the next emission is again exactly p_x-distributed. The shape (children
per node) must therefore not depend on the drawn tokens, and duplicate siblings stay (each is a separate
draw, tried separately).

Against SpecInfer's rule (`specinfer.py`, the residual p <- norm(max(p - q, 0)) after each rejection, which
the next i.i.d. draw from q rarely hits): with p close to q (1 - TV = 0.894) K-SEQ accepts one of k = 2
children with about 0.96 and of k = 4 with 0.99, SpecInfer 0.933 / 0.961. Pure single-request functions
over static shapes (vmap over a batch); `variant` names deliberately wrong rules for negative-control tests.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from loopspec_jax.decoding.sampling import sample_with_uniform

ITERS = 30  # bisection steps for rho in [1, k] (width (k - 1) / 2^30)
VARIANTS = (None, "no_factor", "rho_one")  # exact / residual without f(beta) / rho = 1 whatever k


def tree_uniforms(key, max_depth: int, k: int):
  """-> (ua [max_depth, K] one uniform per (depth, node) for the acceptance tests, uf [1] for the final draw)."""
  ua, uf = jnp.split(jax.random.uniform(key, (max_depth * k + 1,), jnp.float32), [max_depth * k])
  return ua.reshape(max_depth, k), uf


def scale(beta, k):
  """f(beta) = (1 - (1 - beta)^k) / beta = sum_{j<k} (1 - beta)^j (k at beta = 0; 0 at k = 0)."""
  k = jnp.asarray(k, jnp.float32)
  b = jnp.clip(beta, 0.0, 1.0)
  closed = -jnp.expm1(k * jnp.log1p(-jnp.minimum(b, 1.0 - 1e-12))) / jnp.where(b > 0, b, 1.0)
  return jnp.where(b >= 1.0, jnp.minimum(k, 1.0), jnp.where(b > 0, closed, k))


def beta_of(p, q, rho):
  return jnp.sum(jnp.minimum(q, p / rho))


def kseq_rho(p, q, k, iters: int = ITERS):
  """The smallest valid rho in [1, max(k, 1)] (module docstring): rho = 1 if valid, else bisection keeping
  the upper end valid (rho = k always is)."""
  p = jnp.asarray(p, jnp.float32)
  q = jnp.asarray(q, jnp.float32)
  kf = jnp.maximum(jnp.asarray(k, jnp.float32), 1.0)
  ok = lambda rho: rho >= scale(beta_of(p, q, rho), k)

  def step(_, lohi):
    lo, hi = lohi
    mid = 0.5 * (lo + hi)
    good = ok(mid)
    return jnp.where(good, lo, mid), jnp.where(good, mid, hi)

  _, hi = jax.lax.fori_loop(0, iters, step, (jnp.float32(1.0), kf))
  return jnp.where(ok(jnp.float32(1.0)), jnp.float32(1.0), hi)


def node_rule(p, q, k, variant=None):
  """(rho, m = min(q, p / rho) [V], residual [V] unnormalised, acceptance 1 - (1 - beta)^k) at a node with
  target p, drafter q and k children. variant: `VARIANTS` (the wrong ones for negative controls only)."""
  p = jnp.asarray(p, jnp.float32)
  q = jnp.asarray(q, jnp.float32)
  rho = jnp.float32(1.0) if variant == "rho_one" else kseq_rho(p, q, k)
  m = jnp.minimum(q, p / rho)
  beta = jnp.sum(m)
  f = jnp.float32(1.0) if variant == "no_factor" else scale(beta, k)
  f = jnp.where(k > 0, f, 0.0)
  res = jnp.maximum(p - m * f, 0.0)  # >= 0 up to rounding for a valid rho
  res = jnp.where(jnp.sum(res) > 0, res, p)  # all-rejected has probability ~0 here: any fallback is exact
  acc = 1.0 - (1.0 - jnp.minimum(beta, 1.0)) ** jnp.asarray(k, jnp.float32)
  return rho, m, res, acc


def verify_kseq(key, tokens, parent, valid, p, q, max_depth: int, variant=None):
  """-> (n_accepted int32, path [max_depth + 1] node index per depth (0 past n), next token int32).

  The signature and outputs of `specinfer.verify_multistep`: tokens / parent / valid [K] a topological tree
  (node 0 the root; siblings in index order = slot order), p [K, V] the target at every node, q [K, V] the
  drafter's distribution at every node, from which that node's children were drawn i.i.d. One uniform per
  (depth, node) for the slot tests and one for the final draw."""
  k = tokens.shape[0]
  ua, uf = tree_uniforms(key, max_depth, k)
  p = jnp.asarray(p, jnp.float32)
  q = jnp.asarray(q, jnp.float32)
  idx = jnp.arange(k)
  kids_of = (parent[None, :] == idx[:, None]) & valid[None, :] & (idx[None, :] > 0)  # [node, child]

  def level(d, carry):
    u, stopped, final, n, path = carry
    child = kids_of[u] & ~stopped
    rho, m, res, _ = node_rule(p[u], q[u], jnp.sum(child), variant)
    qx = q[u][tokens]
    ratio = jnp.where(qx > 0, jnp.minimum(1.0, m[tokens] / jnp.where(qx > 0, qx, 1.0)), p[u][tokens] > 0)
    acc = child & (ua[d] < ratio)
    adv = jnp.any(acc)
    moved = jnp.argmax(acc).astype(jnp.int32)  # the first accepted slot
    final = jnp.where(~stopped & ~adv, res, final)
    path = path.at[d + 1].set(jnp.where(adv, moved, 0))
    return jnp.where(adv, moved, u), stopped | ~adv, final, n + adv, path

  init = (jnp.int32(0), jnp.bool_(False), p[0], jnp.int32(0), jnp.zeros((max_depth + 1,), jnp.int32))
  u, stopped, final, n, path = jax.lax.fori_loop(0, max_depth, level, init)
  final = jnp.where(stopped, final, p[u])  # every level accepted: the bonus from the last node's target
  return n.astype(jnp.int32), path, sample_with_uniform(uf[0], final)


def slot_accept(p, q, k: int):
  """[..., k]: P(slot i is the accepted child) = beta (1 - beta)^i for a node with k children (leading axes
  of p, q [..., V] are contexts), for Sequoia's count-dependent acceptance tables."""
  rho = jnp.vectorize(lambda a, b: kseq_rho(a, b, k), signature="(v),(v)->()")(p, q)
  beta = jnp.sum(jnp.minimum(q, p / rho[..., None]), -1)
  return beta[..., None] * (1.0 - beta[..., None]) ** jnp.arange(k)
