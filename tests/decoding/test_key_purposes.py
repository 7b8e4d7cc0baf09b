"""Exactness at the call sites: every random draw of a decode step has its own key purpose, and the tick's
composition of kernels (x1 ~ q1, the gated x2 ~ q2, cascade verification) returns exactly p_R only because
x1 and x2 use independent keys.

1. Key purposes (traced): `sampling.request_key` is patched with a recording wrapper while ONE decode loop of
   each method is traced (`helpers.traced_key_purposes`), relying only on the contract that every random draw
   goes through `sampling.request_key(base_key, request, position, purpose)`. A LoopSpec tick requests each of
   PURPOSE_X1 (first proposal), PURPOSE_X2 (second proposal), PURPOSE_VERIFY and, with a random initial state,
   PURPOSE_INIT exactly once: a draw reusing another draw's purpose or key shows up as a repeated or missing
   purpose.
2. The tick's composition, integrated exactly: a key is one uniform (`sample_token(key, q)` ==
   `sample_with_uniform(uniform(key), q)`, checked), so the output distribution is an integral over the
   uniforms of x1 and x2, piecewise constant on the cells cut by the CDFs of q1 and of every q2(x1). With
   independent uniforms it equals p exactly; with x2 drawn from x1's key (one shared uniform) it does not.
3. (slow) End to end in the gate-often-open regime: one LoopSpec `generate` over B identical prompts against
   p_R by chi-square, with B large enough to detect ANY total variation of 0.05 at the 1% level (power
   computed), and the x1-key-for-x2 mutation injected through `request_key`, whose samples fit the exact
   distribution of part 2 for the shared key and reject p_R.
"""

import collections
import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
import loopspec_jax
from loopspec_jax.decoding import sampling
from loopspec_jax.decoding import verify
from loopspec_jax.decoding.loopspec import decoder as loopspec_decoder

X1, X2, VERIFY, INIT, AR = (
    sampling.PURPOSE_X1,
    sampling.PURPOSE_X2,
    sampling.PURPOSE_VERIFY,
    sampling.PURPOSE_INIT,
    sampling.PURPOSE_AR,
)
KEY0 = jax.random.PRNGKey(0)


# ---------------------------------------------------------------------------------------------------
# 1. Key purposes of the traced decode loops
# ---------------------------------------------------------------------------------------------------
def purposes(calls):
  return collections.Counter(c.purpose for c in calls)


@pytest.mark.parametrize("d2,random_init", [(4, False), (4, True), (None, False)])
def test_loopspec_tick_draws_each_use_their_own_purpose(d2, random_init):
  """One tick: x1 (X1), the gated x2 (X2, only with a second proposal), verification (VERIFY) and the
  initial-state noise of fresh lanes (INIT, only with init_state='random'), each requested exactly once."""
  model = helpers.tiny_model("raven_llama:tiny")
  calls = helpers.traced_key_purposes(
      "loopspec", model, helpers.PROMPTS, helpers.MAX_NEW, random_init=random_init, d1=2, d2=d2
  )
  want = collections.Counter({X1: 1, VERIFY: 1})
  if d2 is not None:
    want[X2] = 1
  if random_init:
    want[INIT] = 1
  assert purposes(calls) == want, f"key requests of one tick: {calls}"


def test_chain_and_ar_draw_purposes():
  """Chain: gamma draft draws (X1, at positions p0+1..p0+gamma), one verification (VERIFY), and INIT noise for
  each of the gamma + 1 drafted positions; AR: one draw (AR) and its INIT noise. Nothing else."""
  model = helpers.tiny_model("raven_llama:tiny")
  gamma = 3
  chain = helpers.traced_key_purposes(
      "chain", model, helpers.PROMPTS, helpers.MAX_NEW, random_init=True, d1=2, gamma=gamma
  )
  assert purposes(chain) == collections.Counter({X1: gamma, VERIFY: 1, INIT: gamma + 1}), chain
  ar = helpers.traced_key_purposes("ar", model, helpers.PROMPTS, helpers.MAX_NEW, random_init=True)
  assert purposes(ar) == collections.Counter({AR: 1, INIT: 1}), ar


def x2_uses_x1_key():
  """A mutation of the engine: every PURPOSE_X2 key request returns the PURPOSE_X1 key (patched request_key)."""
  real = sampling.request_key

  def mutated(base_key, request_id, position, purpose):
    return real(base_key, request_id, position, X1 if int(purpose) == X2 else purpose)

  return mock.patch.object(sampling, "request_key", mutated)


# ---------------------------------------------------------------------------------------------------
# 2. The tick's composition, integrated exactly over the draws' uniforms
# ---------------------------------------------------------------------------------------------------
def test_a_key_is_one_uniform():
  """sample_token and second_proposal's x2 each consume exactly uniform(key): drawing from one key twice is
  drawing from one shared uniform, which is what the composition below integrates."""
  rng = np.random.default_rng(0)
  q1, p_d2 = helpers.rand_dist(rng, 8), helpers.rand_dist(rng, 8)
  keys = jax.random.split(KEY0, 64)
  u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
  x1 = jax.vmap(sampling.sample_token, in_axes=(0, None))(keys, q1)
  np.testing.assert_array_equal(x1, jax.vmap(sampling.sample_with_uniform, in_axes=(0, None))(u, q1))
  gate, x2, q2 = jax.vmap(verify.second_proposal, in_axes=(0, None, 0, None))(keys, q1, x1, p_d2)
  want = jnp.where(gate, jax.vmap(sampling.sample_with_uniform)(u, q2), -1)
  np.testing.assert_array_equal(x2, want)
  assert bool(jnp.any(gate))
  # Different purposes give different keys, hence different uniforms.
  k1 = sampling.request_key(KEY0, 3, 17, X1)
  k2 = sampling.request_key(KEY0, 3, 17, X2)
  assert float(jax.random.uniform(k1)) != float(jax.random.uniform(k2))


def _cells(q1, p_d2):
  """Midpoints and widths [C] of the cells of [0, 1) on which both x1 = F_q1^-1(u) and x2 = F_q2(x1)^-1(u) are
  constant, for every x1 (the union of the CDF breakpoints of q1 and of each gated q2(x1))."""
  v = q1.shape[0]
  _, _, q2s = jax.vmap(verify.second_proposal, in_axes=(None, None, 0, None))(KEY0, q1, jnp.arange(v), p_d2)
  cdfs = [np.cumsum(np.asarray(q1, np.float64)) / np.sum(np.asarray(q1, np.float64))]
  for q2 in np.asarray(q2s, np.float64):
    if q2.sum() > 0:
      cdfs.append(np.cumsum(q2) / q2.sum())
  edges = np.unique(np.clip(np.concatenate([[0.0, 1.0]] + cdfs), 0.0, 1.0))
  widths = np.diff(edges)
  keep = widths > 1e-9
  return ((edges[:-1] + edges[1:]) / 2)[keep], widths[keep]


@jax.jit
def _tick_terms(u1, u2, p, q1, p_d2):
  """For x1 drawn with uniform u1 and x2 with u2 (vmapped over cells): (x1, a1, gate, x2, a2, F, G)."""

  def one(a, b):
    x1 = sampling.sample_with_uniform(a, q1)
    gate, _, q2 = verify.second_proposal(KEY0, q1, x1, p_d2)
    x2 = jnp.where(gate, sampling.sample_with_uniform(b, q2), 0)
    f = verify.residual(p, q1)
    return (
        x1,
        verify.acceptance_prob(p, q1, x1),
        gate,
        x2,
        verify.acceptance_prob(f, q2, x2),
        f,
        verify.residual(f, q2, fallback=f),
    )

  return jax.vmap(one)(u1, u2)


def tick_distribution(p, q1, p_d2, same_key: bool) -> np.ndarray:
  """The exact distribution [V] of the token a tick commits: x1 ~ q1 with its key, the gated x2 ~ q2 from
  `verify.second_proposal` with its key (the SAME key, i.e. the same uniform, if same_key), then
  `verify.verify_cascade` (its uniforms are independent of both draws: purpose VERIFY)."""
  mid, width = _cells(q1, p_d2)
  if same_key:
    u1, u2, mass = mid, mid, width
  else:
    u1, u2 = (a.ravel() for a in np.meshgrid(mid, mid, indexing="ij"))
    mass = np.outer(width, width).ravel()
  x1, a1, gate, x2, a2, f, g = (np.asarray(t, np.float64) for t in _tick_terms(u1, u2, p, q1, p_d2))
  x1, x2, gate = x1.astype(int), x2.astype(int), gate.astype(bool)
  out = np.zeros(p.shape[0])
  np.add.at(out, x1, mass * a1)
  rej = mass * (1 - a1)
  np.add.at(out, x2[gate], (rej * a2)[gate])
  out += ((rej * (1 - a2))[gate, None] * g[gate]).sum(0) + (rej[~gate, None] * f[~gate]).sum(0)
  return out


def triples(n, v=8):
  """(p_R, q1, p_d2) test cases: random dense and sparse triples, and p_d2 between q1 and p_R."""
  rng = np.random.default_rng(2024)
  out = []
  for i in range(n):
    kind = ("dense", "sparse")[i % 2]
    p, q1, p_d2 = (helpers.rand_dist(rng, v, kind) for _ in range(3))
    if i % 3 == 2:
      p_d2 = (0.3 * q1 + 0.7 * p).astype(np.float32)
    out.append((p, q1, p_d2))
  return out


def test_tick_composition_is_exact_with_independent_keys():
  for p, q1, p_d2 in triples(24):
    got = tick_distribution(p, q1, p_d2, same_key=False)
    np.testing.assert_allclose(got, np.asarray(p, np.float64), atol=2e-6)


def test_tick_composition_breaks_when_x2_reuses_the_x1_key():
  """Negative control: x2 drawn with x1's key (shared uniform) is not exact (issue 15 saw TV up to 0.13)."""
  tvs = [0.5 * np.abs(tick_distribution(p, q1, p_d2, same_key=True) - p).sum() for p, q1, p_d2 in triples(24)]
  assert max(tvs) > 0.05, tvs
  assert sum(tv > 1e-3 for tv in tvs) >= len(tvs) // 2, tvs


# ---------------------------------------------------------------------------------------------------
# 3. End to end, gate often open: chi-square with power for TV 0.05 at the 1% level (slow)
# ---------------------------------------------------------------------------------------------------
VOCAB = 8
PROMPT = [1, 2, 3, 4, 5]
BATCH = 4000
D1, D2 = 2, 4
ALPHA = 0.01


@functools.lru_cache(maxsize=None)
def gate_open_model():
  # Random weights: shallow readouts far from depth R, so x1 is often rejected and the gate often open; at
  # PROMPT the x1-key-for-x2 mutation moves the first token's distribution by TV ~0.10 (asserted below).
  return helpers.tiny_model("raven_llama:tiny", seed=1, vocab_size=VOCAB)


def first_token_distributions():
  """(p_R, q1 = p_d1, p_d2) of the token after PROMPT, processed at temperature 1."""
  model = gate_open_model()
  r = model.config.recurrence
  lg = loopspec_jax.readouts(model, PROMPT, depths=(D1, D2, r))[:, -1]
  q1, p_d2, p = (np.asarray(sampling.process_logits(x, greedy=False), np.float32) for x in lg)
  return p, q1, p_d2


def sample_first_tokens(seed):
  res = loopspec_jax.generate(
      gate_open_model(), [PROMPT] * BATCH, max_new_tokens=1, method="loopspec", d1=D1, d2=D2, temperature=1.0, seed=seed
  )
  return np.bincount(np.asarray(res.tokens).ravel(), minlength=VOCAB), res.stats


@pytest.mark.slow
def test_chi_square_gate_often_open_detects_shared_key():
  p, q1, p_d2 = first_token_distributions()
  power = helpers.chi2_power(BATCH, p, tv=0.05, alpha=ALPHA)
  assert power > 0.95, power
  counts, st = sample_first_tokens(seed=5)
  assert st["gate_open_rate"] > 0.4 and st["reject_first"] > 0.3 * BATCH, st
  pval = helpers.chi2_pvalue(counts, p)
  print(f"  exact: p={pval:.3g} gate_open_rate={st['gate_open_rate']:.2f} power(TV 0.05)={power:.4f}")
  assert pval > ALPHA, (pval, counts)
  # The mutation, injected through request_key in a fresh trace of the decode loop.
  buggy = tick_distribution(p, q1, p_d2, same_key=True)
  tv = 0.5 * np.abs(buggy - p).sum()
  fresh = helpers.fresh_jit(loopspec_decoder.decode_loop)
  with x2_uses_x1_key(), mock.patch.object(loopspec_decoder, "decode_loop", fresh):
    bad_counts, _ = sample_first_tokens(seed=5)
  p_bad_vs_p = helpers.chi2_pvalue(bad_counts, p, check_support=False)
  p_bad_vs_exact_bug = helpers.chi2_pvalue(bad_counts, buggy)
  print(
      f"  x2 with the x1 key: TV to p_R = {tv:.3f}, p vs p_R = {p_bad_vs_p:.3g}, "
      f"p vs its own exact distribution = {p_bad_vs_exact_bug:.3g}"
  )
  assert p_bad_vs_exact_bug > 1e-3  # the integral of part 2 is the distribution the mutated engine samples
  assert tv >= 0.05, tv
  assert p_bad_vs_p < ALPHA, (tv, p_bad_vs_p)
