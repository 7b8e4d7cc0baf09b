"""Sampled token trees end to end at kernel level: the drafter's own expansion (`draft_tree.expand`, the code
every sampled tree drafter runs: the static shape, the per-(request, round) draft keys, sibling draws with or
without replacement) feeding the verification rule of each sampled draft mode, chi-square tested against the
exact target distribution. Small enough for the default suite (no model: a Markov stand-in drafter and
target over 6 tokens, one compile per rule).

- drafts "sample" (i.i.d. siblings, SpecInfer's rule), "distinct" (without replacement, the matching rule) and
  "kseq" (i.i.d. siblings, SpecTr's K-SEQ) each emit (t1, t2) distributed as p0(t1) p1[t1](t2).
- q is PEAKED (0.8 on one token) and p is not, so the root's three siblings repeat often: siblings drawn with
  replacement but verified by the without-replacement rule, the reverse, and siblings sharing one key, all
  bias the output by a lot. Each known-wrong variant is run: its distribution (estimated on a larger sample)
  gives the test's power against it (>= 0.99, asserted), and the test rejects it.
- Sibling draws are distinct where the rule says so ("distinct": never a repeat; "sample": repeats at the rate
  sum_t q(t)^2), and different requests and rounds draw different keys, none of them a key the verifier or
  AR draws with.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import helpers
from loopspec_jax.decoding import common
from loopspec_jax.decoding import sampling
from loopspec_jax.decoding.tree import draft_tree as dt
from loopspec_jax.decoding.tree import specinfer
from loopspec_jax.decoding.tree import spectr

V = 6
N = 40_000
ALPHA = 1e-3
SHAPE = dt.static_shape(2, 3, 6)  # the root's 3 children; the first has 2 children, the second 1
Q0 = np.asarray([0.8, 0.1, 0.05, 0.03, 0.01, 0.01], np.float32)  # peaked: siblings repeat often
RULES = {"sample": (True, "specinfer", True), "distinct": (False, "specinfer", False), "kseq": (True, "kseq", True)}
# known-wrong variants: (drawn with replacement, rule, rule's replacement, siblings share one key)
WRONG = {
    "distinct drawn with replacement": (True, "specinfer", False, False),
    "without replacement, verified as i.i.d.": (False, "specinfer", True, False),
    "sample with a shared sibling key": (True, "specinfer", True, True),
    "kseq with a shared sibling key": (True, "kseq", True, True),
}


def dists(seed: int = 0):
  """(p0, p1 [V, V], q1 [V, V], p2): target and drafter of a two-step Markov chain over V tokens."""
  rng = np.random.default_rng(seed)
  p0 = helpers.rand_dist(rng, V, "sparse")
  p1 = np.stack([helpers.rand_dist(rng, V) for _ in range(V)])
  q1 = np.stack([helpers.rand_dist(rng, V) for _ in range(V)])
  q1 = (q1**3 / (q1**3).sum(1, keepdims=True)).astype(np.float32)  # peaked too
  return p0, p1, q1, helpers.rand_dist(rng, V)


def shared_key_draws(q, slot, ranks, kids, keys, replacement):
  """`draft_tree._draw_children` with every sibling on one key (the bug under test)."""
  return ORIGINAL_DRAW(q, slot, ranks, [0] * len(kids), keys, replacement)


ORIGINAL_DRAW = dt._draw_children


@functools.partial(jax.jit, static_argnames=("n", "drawn_with", "rule", "rule_with", "tag"))
def round_trials(seed, p0, p1, q0, q1, p2, *, n, drawn_with, rule, rule_with, tag=""):
  """n independent rounds (one request each): the drafter expands SHAPE with its real keys, the rule verifies
  it; returns (t1, t2, n_accepted, tree tokens [n, K]). `tag` names a monkeypatched variant (its own trace)."""
  del tag
  sp = common.make_sampling_params(n, 2, 1.0, 0, 1.0, seed, None)
  p0s = jnp.zeros((n,), jnp.int32)  # every request's round at position 0: the request ids tell them apart
  root = jnp.zeros((n,), jnp.int32)
  logits0 = jnp.broadcast_to(jnp.log(q0), (n, 1, V))
  run = lambda lvl, toks, past, pm: (jnp.log(q1)[toks], {})
  tree, q = dt.expand(
      SHAPE, root, logits0, run, None, sp, dt.draft_keys(sp, p0s), branch=3, sample=True, replacement=drawn_with
  )
  depth1 = tree.depth == 1
  p = jnp.where(depth1[:, :, None], p1[tree.tokens], p2)
  p = p.at[:, 0].set(p0)
  vkeys = jax.vmap(lambda rid: sampling.request_key(sp.base_key, rid, 1, sampling.PURPOSE_VERIFY))(sp.request_ids)
  if rule == "kseq":
    fn = lambda *a: spectr.verify_kseq(*a, 2)
  else:
    fn = lambda *a: specinfer.verify_multistep(*a, 2, replacement=rule_with)
  n_acc, path, y = jax.vmap(fn)(vkeys, tree.tokens, tree.parent, tree.valid, p, q)
  nkeys = jax.vmap(lambda rid: sampling.request_key(sp.base_key, rid, 2, sampling.PURPOSE_AR))(sp.request_ids)
  nxt = jax.vmap(sampling.sample_token)(nkeys, p1[y])  # the next round's first draw (when one token came out)
  t1, t2 = jax.vmap(helpers.first_two_emitted)(n_acc, path, y, nxt, tree.tokens)
  return t1, t2, n_acc, tree.tokens


def pair_freqs(seed, n, drawn_with, rule, rule_with, tag=""):
  p0, p1, q1, p2 = dists()
  args = tuple(map(jnp.asarray, (p0, p1, Q0, q1, p2)))
  t1, t2, n_acc, toks = round_trials(seed, *args, n=n, drawn_with=drawn_with, rule=rule, rule_with=rule_with, tag=tag)
  return helpers.pair_counts(t1, t2, V), np.asarray(n_acc), np.asarray(toks), p0[:, None] * p1


def power_against(n: int, probs, alt_counts, alpha: float) -> float:
  """Power of `helpers.chi2_pvalue(counts of n draws, probs) < alpha` when the draws follow the distribution
  that produced `alt_counts`: the noncentral chi-square tail, noncentrality n * chi2-divergence(alt, probs)
  over the pooled cells (the estimate's own upward bias, df / m for m counted draws, taken off). 1 where alt
  puts mass on a cell of probability 0 (the test then returns p = 0)."""
  probs, alt = np.asarray(probs, np.float64).ravel(), np.asarray(alt_counts, np.float64).ravel()
  m = alt.sum()
  big = probs * n >= 5
  cells_p, cells_a = list(probs[big]), list(alt[big] / m)
  if (~big).any():
    if probs[~big].sum() == 0:
      if alt[~big].sum() > 0:
        return 1.0
    else:
      cells_p.append(probs[~big].sum()), cells_a.append(alt[~big].sum() / m)
  cells_p, cells_a = np.asarray(cells_p), np.asarray(cells_a)
  df = len(cells_p) - 1
  lam = max(n * (np.sum((cells_a - cells_p) ** 2 / cells_p) - df / m), 0.0)
  return float(stats.ncx2.sf(stats.chi2.ppf(1 - alpha, df), df, lam))


@pytest.mark.parametrize("drafts", list(RULES))
def test_each_sampled_draft_rule_is_exact_with_a_peaked_drafter(drafts):
  drawn_with, rule, rule_with = RULES[drafts]
  counts, n_acc, _, exact = pair_freqs(0, N, drawn_with, rule, rule_with)
  assert helpers.chi2_power(N, exact, tv=0.03, alpha=ALPHA) >= 0.99
  pval = helpers.chi2_pvalue(counts, exact)
  assert pval > ALPHA, (drafts, pval)
  assert (n_acc == 0).any() and (n_acc == 1).any() and (n_acc == 2).any()  # every outcome of the walk occurs


@pytest.mark.parametrize("variant", list(WRONG))
def test_known_wrong_variants_are_rejected_and_the_test_has_the_power_to(variant, monkeypatch):
  drawn_with, rule, rule_with, shared = WRONG[variant]
  if shared:
    monkeypatch.setattr(dt, "_draw_children", shared_key_draws)
  tag = variant if shared else ""
  other, _, _, exact = pair_freqs(1, N, drawn_with, rule, rule_with, tag)  # an independent sample of the variant
  assert power_against(N, exact, other, ALPHA) >= 0.99, (variant, other / N - exact)
  counts, _, _, _ = pair_freqs(0, N, drawn_with, rule, rule_with, tag)
  assert helpers.chi2_pvalue(counts, exact, check_support=False) < ALPHA, variant


def test_sibling_draws_are_distinct_where_the_rule_says_so_and_keys_differ():
  """The root's three children: "distinct" never repeats a token; "sample" repeats a pair at the rate
  sum_t q0(t)^2 (0.6576 here: a shared key would make it 1); different requests' trees differ, and one
  request's next round (another root position) draws afresh."""
  n = N
  _, _, toks, _ = pair_freqs(0, n, False, "specinfer", False)
  kids = toks[:, [1, 2, 3]]
  assert all(len(set(row)) == 3 for row in kids.tolist())
  _, _, toks, _ = pair_freqs(0, n, True, "specinfer", True)
  kids = toks[:, [1, 2, 3]]
  rate = np.mean([kids[:, a] == kids[:, b] for a, b in ((0, 1), (0, 2), (1, 2))])
  want = float(np.sum(Q0.astype(np.float64) ** 2))
  assert abs(rate - want) < 4 * np.sqrt(want * (1 - want) / n), (rate, want)
  assert 0.5 < np.mean(np.any(kids[1:] != kids[:-1], axis=1))  # neighbouring requests draw apart
  sp = common.make_sampling_params(2, 2, 1.0, 0, 1.0, 0, None)
  keys = np.asarray(jax.vmap(lambda p: dt.draft_keys(sp, p))(jnp.asarray([[3, 3], [4, 4]], jnp.int32)))
  assert len({tuple(k) for k in keys.reshape(-1, keys.shape[-1]).tolist()}) == 4  # requests x rounds
  # the drafter's keys are its own: never one the verifier or AR draws with (same requests, nearby positions)
  other = [
      sampling.request_key(sp.base_key, rid, pos, purpose)
      for rid in (0, 1)
      for pos in range(2, 9)
      for purpose in (sampling.PURPOSE_VERIFY, sampling.PURPOSE_AR)
  ]
  assert not {tuple(k) for k in keys.reshape(-1, keys.shape[-1]).tolist()} & {
      tuple(np.asarray(k).tolist()) for k in other
  }
