"""Tests of the verification kernels: exact (enumerated) and sampled output distributions, greedy, guards."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import chi2_pvalue, rand_dist
from loopspec_jax.decoding import sampling, verify

N_SAMPLES = 20000
KEY0 = jax.random.PRNGKey(0)


def make_case(seed, v, kind):
  """(p_R, q1, p_d2) for one test case."""
  rng = np.random.default_rng(seed)
  sub = "sparse" if kind == "sparse" else "dense"
  p, q1, p_d2 = rand_dist(rng, v, sub), rand_dist(rng, v, sub), rand_dist(rng, v, sub)
  if kind == "close":  # p_d2 between q1 and p_R, as in a real looped model
    p_d2 = (0.3 * q1 + 0.7 * p).astype(np.float32)
  elif kind == "d2_is_q1":  # gate always closed
    p_d2 = q1
  elif kind == "d2_is_p":
    p_d2 = p
  elif kind == "p_is_q1":  # float guard: nothing is ever rejected
    p = q1
  elif kind == "partly_sparse":
    p = rand_dist(rng, v, "sparse")
  return p, q1, p_d2


# ---- exact output distributions, composed from the public building blocks ----

_accept_all = jax.jit(jax.vmap(verify.acceptance_prob, in_axes=(None, None, 0)))
_second_all = jax.jit(jax.vmap(verify.second_proposal, in_axes=(None, None, 0, None, None)))
_accept_rows = jax.jit(jax.vmap(_accept_all, in_axes=(None, 0, None)))  # [proposal row, token]
_residual = jax.jit(verify.residual)
_residual_rows = jax.jit(jax.vmap(verify.residual, in_axes=(None, 0, None)))  # fallback shared
_cascade1 = jax.jit(verify.verify_cascade)
_second1 = jax.jit(verify.second_proposal)
_chain1 = jax.jit(verify.verify_chain)


def exact_cascade(p, q1, p_d2, q2_override=None, min_mass=0.0):
  """Enumerate x1 ~ q1, the (deterministic) gate/q2, x2 ~ q2 and both acceptances.

  Returns (P(y) [V], P(stage) [3], P(gate open)) in float64. q2_override: force the gate open with this q2.
  min_mass: the gate's least residual mass (`verify.second_proposal`).
  """
  v = p.shape[0]
  xs = jnp.arange(v)
  q1n = np.asarray(q1, np.float64)
  a1 = np.asarray(_accept_all(p, q1, xs), np.float64)
  f = _residual(p, q1)
  gates, _, q2s = _second_all(KEY0, q1, xs, p_d2, min_mass)
  gates = np.asarray(gates)
  if q2_override is not None:
    gates = np.ones(v, bool)
    q2s = jnp.broadcast_to(q2_override, (v, v))
  a2s = np.asarray(_accept_rows(f, q2s, xs), np.float64)  # [x1, x2]
  gs = np.asarray(_residual_rows(f, q2s, f), np.float64)  # [x1, V]
  q2s = np.asarray(q2s, np.float64)
  fn = np.asarray(f, np.float64)
  out, stage, gate_mass = np.zeros(v), np.zeros(3), 0.0
  for x1 in range(v):
    if q1n[x1] == 0:
      continue
    out[x1] += q1n[x1] * a1[x1]
    stage[1] += q1n[x1] * a1[x1]
    rej = q1n[x1] * (1 - a1[x1])
    if not gates[x1]:
      out += rej * fn
      stage[0] += rej
      continue
    gate_mass += q1n[x1]
    a2, g, q2n = a2s[x1], gs[x1], q2s[x1]
    for x2 in range(v):
      if q2n[x2] == 0:
        continue
      out[x2] += rej * q2n[x2] * a2[x2]
      stage[2] += rej * q2n[x2] * a2[x2]
      out += rej * q2n[x2] * (1 - a2[x2]) * g
      stage[0] += rej * q2n[x2] * (1 - a2[x2])
  return out, stage, gate_mass


def exact_single(p, q1):
  """Single-proposal rule: P(y) = min(q1, p)(y) + P(reject) * F(y)."""
  a1 = np.asarray(_accept_all(p, q1, jnp.arange(p.shape[0])), np.float64)
  acc = np.asarray(q1, np.float64) * a1
  return acc + (1 - acc.sum()) * np.asarray(_residual(p, q1), np.float64)


KINDS = ["dense", "sparse", "close", "d2_is_q1", "d2_is_p", "p_is_q1", "partly_sparse"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed,v", [(0, 5), (1, 6), (2, 8), (3, 8)])
def test_cascade_exact_distribution(seed, v, kind):
  p, q1, p_d2 = make_case(seed, v, kind)
  out, stage, gate_mass = exact_cascade(p, q1, p_d2)
  np.testing.assert_allclose(out, np.asarray(p, np.float64), atol=1e-6)
  np.testing.assert_allclose(stage.sum(), 1.0, atol=1e-6)
  # P(x1 accepted) = sum min(p, q1) = 1 - TV(p, q1).
  np.testing.assert_allclose(stage[1], np.minimum(np.asarray(p), np.asarray(q1)).sum(), atol=1e-6)
  if kind in ("d2_is_q1", "p_is_q1"):
    assert stage[2] == 0 and (kind == "p_is_q1" or gate_mass == 0)
  np.testing.assert_allclose(exact_single(p, q1), np.asarray(p, np.float64), atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cascade_exact_with_any_second_proposal(seed):
  """One more rejection step with ANY q2 (gate forced open) still returns exactly p."""
  p, q1, _ = make_case(seed, 6, "dense")
  q2 = rand_dist(np.random.default_rng(100 + seed), 6, "dense")
  out, stage, _ = exact_cascade(p, q1, p, q2_override=q2)
  np.testing.assert_allclose(out, np.asarray(p, np.float64), atol=1e-6)
  assert stage[2] > 0


@pytest.mark.parametrize("seed,kind", [(0, "dense"), (2, "dense"), (1, "close"), (3, "partly_sparse")])
def test_gate_mass_keeps_the_cascade_exact(seed, kind):
  """A stricter gate (least residual mass) opens for a subset of the draws the paper's gate opens for, only
  where the residual holds that mass, and the output is still exactly p."""
  p, q1, p_d2 = make_case(seed, 8, kind)
  xs = jnp.arange(8)
  base, _, _ = _second_all(KEY0, q1, xs, p_d2, 0.0)
  r = np.maximum(0.0, np.asarray(p_d2, np.float64)[None, :] - np.asarray(q1, np.float64)[None, :]).repeat(8, 0)
  r[np.arange(8), np.arange(8)] = 0.0
  mass = r.sum(1)  # residual mass for each x1
  for min_mass in (0.05, 0.2, 0.5, 1.0):
    gates, x2, _ = _second_all(KEY0, q1, xs, p_d2, min_mass)
    gates, clear = np.asarray(gates), np.abs(mass - min_mass) > 1e-6  # away from float ties at the threshold
    np.testing.assert_array_equal(gates[clear], (np.asarray(base) & (mass >= min_mass))[clear])
    np.testing.assert_array_equal(np.asarray(x2)[~gates], -1)
    out, stage, _ = exact_cascade(p, q1, p_d2, min_mass=min_mass)
    np.testing.assert_allclose(out, np.asarray(p, np.float64), atol=1e-6)
    np.testing.assert_allclose(stage.sum(), 1.0, atol=1e-6)


def test_gate_both_states_occur():
  """The dense cases exercise the gate both open and closed (depending on x1)."""
  p, q1, p_d2 = make_case(2, 8, "dense")
  gates, x2, q2 = _second_all(KEY0, q1, jnp.arange(8), p_d2, 0.0)
  gates = np.asarray(gates)
  assert gates.any() and not gates.all()
  np.testing.assert_array_equal(np.asarray(x2)[~gates], -1)
  np.testing.assert_array_equal(np.asarray(q2)[~gates], 0.0)
  np.testing.assert_allclose(np.asarray(q2)[gates].sum(-1), 1.0, atol=1e-6)
  for x1 in np.nonzero(gates)[0]:
    assert q2[x1, x1] == 0 and x2[x1] != x1 and q2[x1, x2[x1]] > 0
    assert p_d2[x1] < q1[x1]


# ---- sampled checks of the wired-up kernels ----


def _cascade_step(key, p, q1, p_d2):
  k1, k2, k3 = jax.random.split(key, 3)
  x1 = sampling.sample_token(k1, q1)
  gate, x2, q2 = verify.second_proposal(k2, q1, x1, p_d2)
  y, stage = verify.verify_cascade(k3, p, x1, q1, gate, x2, q2)
  return y, stage


def _single_step(key, p, q1):
  k1, k3 = jax.random.split(key)
  x1 = sampling.sample_token(k1, q1)
  return verify.verify_cascade(k3, p, x1, q1, jnp.bool_(False), jnp.int32(-1), jnp.zeros_like(q1))


_cascade_many = jax.jit(jax.vmap(_cascade_step, in_axes=(0, None, None, None)))
_single_many = jax.jit(jax.vmap(_single_step, in_axes=(0, None, None)))


@pytest.mark.parametrize("seed,kind", [(0, "dense"), (1, "sparse"), (2, "close"), (3, "d2_is_p")])
def test_cascade_sampled(seed, kind):
  p, q1, p_d2 = make_case(seed, 6, kind)
  keys = jax.random.split(jax.random.PRNGKey(1000 + seed), N_SAMPLES)
  y, stage = _cascade_many(keys, p, q1, p_d2)
  y, stage = np.asarray(y), np.asarray(stage)
  assert chi2_pvalue(np.bincount(y, minlength=6), p) > 1e-3
  _, stage_p, _ = exact_cascade(p, q1, p_d2)
  assert chi2_pvalue(np.bincount(stage, minlength=3), stage_p) > 1e-3


@pytest.mark.parametrize("seed,kind", [(4, "dense"), (5, "sparse")])
def test_single_proposal_sampled(seed, kind):
  p, q1, _ = make_case(seed, 6, kind)
  keys = jax.random.split(jax.random.PRNGKey(2000 + seed), N_SAMPLES)
  y, stage = _single_many(keys, p, q1)
  y, stage = np.asarray(y), np.asarray(stage)
  assert not (stage == 2).any()
  assert chi2_pvalue(np.bincount(y, minlength=6), p) > 1e-3
  acc = np.minimum(np.asarray(p), np.asarray(q1)).sum()
  assert chi2_pvalue(np.bincount(stage, minlength=3)[[0, 1]], [1 - acc, acc]) > 1e-3


# ---- greedy (one-hot) ----


def _onehot_logits(key, idx, v):
  return jax.random.normal(key, (v,)) + 10.0 * jax.nn.one_hot(idx, v)


def test_cascade_greedy_all_argmax_combinations():
  v = 4
  a, b, c = np.meshgrid(np.arange(v), np.arange(v), np.arange(v), indexing="ij")
  a, b, c = (jnp.asarray(t.ravel()) for t in (a, b, c))
  n = a.shape[0]

  def one(key, ia, ib, ic):
    ks = jax.random.split(key, 6)
    q1 = sampling.process_logits(_onehot_logits(ks[0], ia, v), greedy=True)
    p_d2 = sampling.process_logits(_onehot_logits(ks[1], ib, v), greedy=True)
    p = sampling.process_logits(_onehot_logits(ks[2], ic, v), greedy=True)
    x1 = sampling.sample_token(ks[3], q1)
    gate, x2, q2 = verify.second_proposal(ks[4], q1, x1, p_d2)
    y, stage = verify.verify_cascade(ks[5], p, x1, q1, gate, x2, q2)
    return x1, gate, x2, y, stage

  run = jax.jit(jax.vmap(one))
  for rep in range(3):
    keys = jax.random.split(jax.random.PRNGKey(rep), n)
    x1, gate, x2, y, stage = (np.asarray(t) for t in run(keys, a, b, c))
    a_, b_, c_ = np.asarray(a), np.asarray(b), np.asarray(c)
    np.testing.assert_array_equal(x1, a_)
    np.testing.assert_array_equal(gate, b_ != a_)
    np.testing.assert_array_equal(x2, np.where(b_ != a_, b_, -1))
    np.testing.assert_array_equal(y, c_)
    want_stage = np.where(c_ == a_, 1, np.where((b_ != a_) & (c_ == b_), 2, 0))
    np.testing.assert_array_equal(stage, want_stage)


# ---- float guards ----


def test_acceptance_prob_guards():
  p = jnp.array([0.5, 0.5, 0.0, 0.0])
  q = jnp.array([0.25, 0.0, 0.0, 0.75])
  np.testing.assert_array_equal(_accept_all(p, q, jnp.arange(4)), [1.0, 1.0, 0.0, 0.0])
  np.testing.assert_allclose(float(verify.acceptance_prob(q, p, 0)), 0.5)


def test_residual_guards():
  p = jnp.array([0.2, 0.3, 0.5])
  np.testing.assert_allclose(_residual(p, p), p)  # no mass: norm(p)
  np.testing.assert_allclose(_residual(p, p + 0.01, fallback=jnp.array([0.0, 1.0, 0.0])), [0, 1, 0])
  np.testing.assert_allclose(_residual(p, jnp.array([0.4, 0.3, 0.3])), [0, 0, 1])
  assert np.isfinite(np.asarray(_residual(p * 2, p * 2))).all()


def test_cascade_p_equals_q1_always_accepts():
  for kind in ("dense", "onehot"):
    q1 = rand_dist(np.random.default_rng(7), 6)
    if kind == "onehot":
      q1 = np.eye(6, dtype=np.float32)[np.argmax(q1)]
    keys = jax.random.split(jax.random.PRNGKey(8), N_SAMPLES)
    y, stage = _cascade_many(keys, q1, q1, q1)
    assert (np.asarray(stage) == 1).all()
    if kind == "onehot":
      assert (np.asarray(y) == int(jnp.argmax(q1))).all()


def test_cascade_no_mass_fallbacks():
  """Unnormalised float surplus in q1 / q2 leaves no residual mass: fall back, never NaN."""
  keys = jax.random.split(jax.random.PRNGKey(9), N_SAMPLES)
  run = jax.jit(jax.vmap(verify.verify_cascade, in_axes=(0,) + (None,) * 6))
  # F has no mass (p <= q1 everywhere): x1 = 2 is always rejected and y ~ norm(p).
  p = jnp.array([0.5, 0.5, 0.0, 0.0])
  q1 = jnp.array([0.5, 0.5, 0.1, 0.0])
  y, stage = run(keys, p, 2, q1, False, -1, jnp.zeros(4))
  assert (np.asarray(stage) == 0).all()
  assert chi2_pvalue(np.bincount(np.asarray(y), minlength=4), p) > 1e-3
  # F - q2 has no mass: x2 = 3 is always rejected and y ~ F = [0, 0, 1, 0].
  p = jnp.array([0.2, 0.3, 0.5, 0.0])
  q1 = jnp.array([0.4, 0.3, 0.3, 0.0])
  q2 = jnp.array([0.0, 0.0, 1.0, 0.1])
  y, stage = run(keys, p, 0, q1, True, 3, q2)
  y, stage = np.asarray(y), np.asarray(stage)
  assert not (stage == 2).any()
  np.testing.assert_array_equal(y[stage == 1], 0)
  np.testing.assert_array_equal(y[stage == 0], 2)
  assert abs((stage == 1).mean() - 0.5) < 0.05


# ---- chain verification ----


def exact_chain_n(a):
  """P(n accepted) of a G-chain whose draft i is accepted with probability a[i] (a list)."""
  g = len(a)
  probs = [np.prod(a[:k]) * (1 - a[k]) for k in range(g)] + [np.prod(a)]
  return np.array(probs)


@pytest.mark.parametrize("seed,v", [(0, 5), (1, 6), (2, 8), (3, 8)])
@pytest.mark.parametrize("kind", ["dense", "sparse", "p_is_q1"])
def test_chain_first_token_exact(seed, v, kind):
  """First committed token: accept x0 ~ q0 with min(1, p0/q0), else norm(max(0, p0 - q0)); equals p0."""
  p0, q0, _ = make_case(seed, v, kind)
  a = np.asarray(_accept_all(p0, q0, jnp.arange(v)), np.float64)
  acc = np.asarray(q0, np.float64) * a
  res = np.asarray(_residual(p0, q0), np.float64)
  np.testing.assert_allclose(acc + (1 - acc.sum()) * res, np.asarray(p0), atol=1e-6)


def make_chain_tables(seed, v, sub="dense"):
  """Prefix-dependent targets/drafts for G=2: p0 [V], p1 [V,V], p2 [V,V,V]; q0 [V], q1 [V,V]."""
  rng = np.random.default_rng(seed)
  d = lambda *shape: np.stack([rand_dist(rng, v, sub) for _ in range(int(np.prod(shape)))]).reshape(shape + (v,))
  return d(), d(v), d(v, v), d(), d(v)


_accept_tables = jax.jit(jax.vmap(_accept_all, in_axes=(0, 0, None)))  # [prefix, token]
_residual_tables = jax.jit(jax.vmap(verify.residual))


def exact_chain_joint(p0, p1, q0, q1):
  """Joint of the first two committed tokens of a G=2 chain; a second pass after an early rejection."""
  v = p0.shape[0]
  xs = jnp.arange(v)
  joint = np.zeros((v, v))
  a0 = np.asarray(_accept_all(p0, q0, xs), np.float64)
  res0 = np.asarray(_residual(p0, q0), np.float64)
  q0n = np.asarray(q0, np.float64)
  rej0 = 1 - (q0n * a0).sum()
  p1n = np.asarray(p1, np.float64)
  joint += rej0 * res0[:, None] * p1n  # n = 0: t0 ~ residual, t1 ~ p1[t0] from the next pass
  a1s = np.asarray(_accept_tables(p1, q1, xs), np.float64)
  res1s = np.asarray(_residual_tables(p1, q1), np.float64)
  q1s = np.asarray(q1, np.float64)
  for x0 in range(v):
    if q0n[x0] == 0:
      continue
    acc1 = q1s[x0] * a1s[x0]  # n = 2 (t1 = x1)
    joint[x0] += q0n[x0] * a0[x0] * (acc1 + (1 - acc1.sum()) * res1s[x0])
  return joint


@pytest.mark.parametrize("seed,v,sub", [(0, 5, "dense"), (1, 6, "sparse"), (2, 8, "dense")])
def test_chain_joint_two_tokens_exact(seed, v, sub):
  p0, p1, _, q0, q1 = make_chain_tables(seed, v, sub)
  joint = exact_chain_joint(p0, p1, q0, q1)
  np.testing.assert_allclose(joint, np.asarray(p0, np.float64)[:, None] * np.asarray(p1, np.float64), atol=1e-6)


def _chain_step(key, p0, p1, p2, q0, q1):
  k0, k1, kv, kn = jax.random.split(key, 4)
  x0 = sampling.sample_token(k0, q0)
  x1 = sampling.sample_token(k1, q1[x0])
  p = jnp.stack([p0, p1[x0], p2[x0, x1]])
  q = jnp.stack([q0, q1[x0]])
  n, nxt = verify.verify_chain(kv, p, jnp.stack([x0, x1]), q)
  t0 = jnp.where(n == 0, nxt, x0)
  t1 = jnp.where(n == 0, sampling.sample_token(kn, p1[nxt]), jnp.where(n == 1, nxt, x1))
  return n, t0, t1, nxt


_chain_many = jax.jit(jax.vmap(_chain_step, in_axes=(0,) + (None,) * 5))


@pytest.mark.parametrize("seed,sub", [(0, "dense"), (1, "sparse")])
def test_chain_sampled(seed, sub):
  v = 5
  p0, p1, p2, q0, q1 = make_chain_tables(seed, v, sub)
  keys = jax.random.split(jax.random.PRNGKey(3000 + seed), N_SAMPLES)
  n, t0, t1, nxt = (np.asarray(t) for t in _chain_many(keys, p0, p1, p2, q0, q1))
  assert chi2_pvalue(np.bincount(t0, minlength=v), p0) > 1e-3
  joint = np.asarray(p0, np.float64)[:, None] * np.asarray(p1, np.float64)
  assert chi2_pvalue(np.bincount(t0 * v + t1, minlength=v * v), joint) > 1e-3
  # Exact distribution of n by enumerating the drafts.
  a0 = np.asarray(_accept_all(p0, q0, jnp.arange(v)), np.float64)
  q0n = np.asarray(q0, np.float64)
  a1s = np.asarray(_accept_tables(p1, q1, jnp.arange(v)), np.float64)
  q1s = np.asarray(q1, np.float64)
  pn = np.zeros(3)
  for x0 in range(v):
    acc1 = (q1s[x0] * a1s[x0]).sum()
    pn += q0n[x0] * np.array([1 - a0[x0], a0[x0] * (1 - acc1), a0[x0] * acc1])
  assert chi2_pvalue(np.bincount(n, minlength=3), pn) > 1e-3


def test_chain_iid_accepted_length():
  """i.i.d. rows: P(n = k) = a^k (1 - a), P(n = G) = a^G; tokens per pass (1 - a^(G+1)) / (1 - a)."""
  v, g = 6, 4
  p_row, q_row, _ = make_case(11, v, "dense")
  p = jnp.broadcast_to(p_row, (g + 1, v))
  q = jnp.broadcast_to(q_row, (g, v))
  a = float(np.minimum(np.asarray(p_row), np.asarray(q_row)).sum())

  def step(key):
    kd, kv = jax.random.split(key)
    drafts = jax.vmap(sampling.sample_token, in_axes=(0, None))(jax.random.split(kd, g), q_row)
    return verify.verify_chain(kv, p, drafts, q)

  keys = jax.random.split(jax.random.PRNGKey(12), N_SAMPLES)
  n, nxt = (np.asarray(t) for t in jax.jit(jax.vmap(step))(keys))
  pn = exact_chain_n([a] * g)
  assert chi2_pvalue(np.bincount(n, minlength=g + 1), pn) > 1e-3
  np.testing.assert_allclose((pn * (np.arange(g + 1) + 1)).sum(), (1 - a ** (g + 1)) / (1 - a), rtol=1e-6)
  # The bonus token after a full acceptance is a draw from p[G].
  assert chi2_pvalue(np.bincount(nxt[n == g], minlength=v), p_row) > 1e-3


def test_chain_greedy():
  v, g, b = 5, 3, 64
  rng = np.random.default_rng(13)
  tgt = rng.integers(0, v, (b, g + 1))
  # Drafts agree with the target with probability 0.6 per position, so every n occurs.
  drafts = np.where(rng.random((b, g)) < 0.6, tgt[:, :g], (tgt[:, :g] + 1) % v).astype(np.int32)
  noise = rng.normal(size=(b, g + 1, v))
  p = sampling.process_logits(noise + 5.0 * np.eye(v)[tgt], greedy=True)
  q = sampling.process_logits(noise[:, :g] + 5.0 * np.eye(v)[drafts], greedy=True)
  n, nxt = jax.jit(jax.vmap(verify.verify_chain))(jax.random.split(jax.random.PRNGKey(13), b), p, drafts, q)
  match = tgt[:, :g] == drafts
  want_n = np.where(match.all(1), g, np.argmin(match, axis=1))
  np.testing.assert_array_equal(n, want_n)
  np.testing.assert_array_equal(nxt, tgt[np.arange(b), want_n])
  assert len(set(want_n.tolist())) == g + 1


def test_chain_guards_and_empty():
  v, g, b = 6, 3, 500
  rng = np.random.default_rng(14)
  q = np.stack([rand_dist(rng, v, "sparse") for _ in range(g + 1)])
  drafts = np.stack([[rng.choice(v, p=q[i] / q[i].sum()) for i in range(g)] for _ in range(b)]).astype(np.int32)
  keys = jax.random.split(jax.random.PRNGKey(15), b)
  n, _ = jax.jit(jax.vmap(verify.verify_chain, in_axes=(0, None, 0, None)))(keys, q, drafts, q[:g])
  assert (np.asarray(n) == g).all()  # p == q: everything accepted
  oh = jax.nn.one_hot(jnp.array([1, 4, 2, 0]), v)
  n, nxt = _chain1(KEY0, oh, jnp.array([1, 4, 2]), oh[:g])
  assert int(n) == g and int(nxt) == 0
  # G = 0: just a draw from p[0].
  n, nxt = _chain1(KEY0, oh[:1], jnp.zeros((0,), jnp.int32), jnp.zeros((0, v)))
  assert int(n) == 0 and int(nxt) == 1


# ---- vmap / jit ----


def test_kernels_vmap_and_jit_match_single_calls():
  v, b = 6, 5
  rng = np.random.default_rng(16)
  p, q1, p_d2 = (np.stack([rand_dist(rng, v, kind) for _ in range(b)]) for kind in ("dense", "sparse", "dense"))
  x1 = np.array([rng.choice(v, p=row / row.sum()) for row in q1], np.int32)
  keys = jax.random.split(jax.random.PRNGKey(16), b)
  gate, x2, q2 = jax.jit(jax.vmap(verify.second_proposal))(keys, q1, x1, p_d2)
  y, stage = jax.jit(jax.vmap(verify.verify_cascade))(keys, p, x1, q1, gate, x2, q2)
  a = jax.jit(jax.vmap(verify.acceptance_prob))(p, q1, x1)
  r = jax.jit(jax.vmap(verify.residual))(p, q1)
  chex.assert_shape([gate, x2, y, stage, a], (b,))
  chex.assert_shape([q2, r], (b, v))
  chex.assert_type([x2, y, stage], jnp.int32)
  for i in range(b):
    g1, x21, q21 = _second1(keys[i], q1[i], x1[i], p_d2[i])
    assert bool(g1) == bool(gate[i]) and int(x21) == int(x2[i])
    np.testing.assert_allclose(q21, q2[i], atol=1e-7)
    y1, s1 = _cascade1(keys[i], p[i], x1[i], q1[i], gate[i], x2[i], q2[i])
    assert int(y1) == int(y[i]) and int(s1) == int(stage[i])
  # Chain, batched over requests.
  g = 3
  pc = jnp.broadcast_to(p[:, None], (b, g + 1, v))
  qc = jnp.broadcast_to(q1[:, None], (b, g, v))
  dr = jnp.broadcast_to(x1[:, None], (b, g))
  n, nxt = jax.jit(jax.vmap(verify.verify_chain))(keys, pc, dr, qc)
  chex.assert_shape([n, nxt], (b,))
  for i in range(b):
    n1, nx1 = _chain1(keys[i], pc[i], dr[i], qc[i])
    assert int(n1) == int(n[i]) and int(nx1) == int(nxt[i])
