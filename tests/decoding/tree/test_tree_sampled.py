"""Sampled-draft token trees (decoding/tree/draft_tree.py): draft-model trees (`generate(method="draft",
draft_model=, gamma=, branch=, tree_nodes=, drafts=)`) and tree self-speculation with drafts="sample".

- The static shape: a topological tree within the envelope, fixed before any token is drawn.
- Greedy draft trees equal AR token for token (a batch of different lengths; the HF-format fixture: slow);
  drafts="topk" under sampling equals AR's sampled output for the same seed (slow).
- Sampled drafts: the first two emitted tokens are chi-square tested against exact enumeration
  (`helpers.exact_sequence_distribution`) at a sample size whose power against any alternative at TV 0.05 is
  >= 0.99 (`helpers.chi2_power`, asserted), with a drafter that disagrees often (so rejections, residual draws
  and second siblings all occur). The same test with the residual left unnormalised (monkeypatched
  `specinfer._residual`) fails (slow).
- drafts="distinct" (siblings without replacement) with its matching rule: the kernel alone against exact
  probabilities (and the with-replacement rule on such draws fails), and the decoders (slow).
- drafts="kseq" (i.i.d. siblings, SpecTr's K-SEQ, `tree/spectr.py`): the same chi-square cases for both
  decoders (static and Sequoia count-table shapes); K-SEQ with rho = 1 fails them (slow).
- One compile per configuration, seeded and batch-independent (fresh jits; slow).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
import loopspec_jax
from helpers import MAX_NEW, PROMPTS, tiny_model
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import draft_tree
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.decoding.tree import specinfer
from loopspec_jax.decoding.tree import spectr

ENV = dict(gamma=3, branch=2, tree_nodes=6)


def shallow(model, depth: int = 1):
  """The target's weights run to `depth`: a separate drafter model."""
  return dataclasses.replace(model, config=model.config.replace(recurrence=depth), source=f"shallow{depth}")


def gen(model, prompts, max_new=MAX_NEW, **kw):
  return loopspec_jax.generate(model, [list(p) for p in prompts], max_new_tokens=max_new, **kw)


# ---------------------------------------------------------------------------------------------------
# The static shape
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env", [(3, 2, 6), (6, 4, 32), (5, 3, 24), (2, 2, 4), (1, 3, 3), (3, 2, 10)])
def test_static_shape_is_a_tree_in_the_envelope(env):
  gamma, branch, nodes = env
  s = draft_tree.static_shape(gamma, branch, nodes)
  k = nodes + 1
  assert len(s.parent) == len(s.depth) == len(s.rank) == k
  assert s.parent[0] == 0 and s.depth[0] == 0
  for i in range(1, k):
    assert s.parent[i] < i and s.depth[i] == s.depth[s.parent[i]] + 1 <= gamma
  for u in range(k):
    kids = [i for i in range(1, k) if s.parent[i] == u]
    assert [s.rank[i] for i in kids] == list(range(len(kids))) and len(kids) <= branch
    assert kids == list(range(kids[0], kids[0] + len(kids))) if kids else True  # siblings contiguous, in rank order
  assert s.runs == tuple(sorted(set(s.parent[1:])))  # expanded = nodes with children, level by level
  for lvl, exp in enumerate(s.expand):
    assert len(exp) <= (1 if lvl == 0 else branch) and all(s.depth[i] == lvl for i in exp)
  assert max(s.depth) == gamma  # the rank-0 path runs the whole depth


def test_bad_tree_envelopes_are_refused():
  model = tiny_model("huginn:tiny")
  for kw, match in [
      (dict(gamma=2, branch=2, tree_nodes=7), r"tree_nodes <= 6"),
      (dict(gamma="auto", branch=2), r"integer gamma"),
      (dict(gamma=2, branch=2, drafts="greedy"), r"drafts in"),
      (dict(gamma=2, drafts="sample"), r"drafts= only with a tree"),
  ]:
    with pytest.raises(ValueError, match=match):
      gen(model, [[1, 2]], max_new=4, method="draft", draft_model=shallow(model), **kw)
  with pytest.raises(ValueError, match="drafts in"):
    gen(model, [[1, 2]], max_new=4, method="tree:d1=1,gamma=2,branch=2,tree_nodes=4,drafts=top")


# ---------------------------------------------------------------------------------------------------
# Deterministic drafts: AR's own tokens
# ---------------------------------------------------------------------------------------------------
def test_greedy_draft_tree_matches_ar_in_both_regimes():
  for contraction in (None, 0.05):
    model = tiny_model("huginn:tiny", contraction)
    want = helpers.ar_tokens(model, PROMPTS, MAX_NEW)
    got = gen(model, PROMPTS, method="draft", draft_model=shallow(model), **ENV)
    assert got.tokens == want, (contraction, got.stats)
    pr = got.stats["per_request"]
    assert pr["nodes"] == [ENV["tree_nodes"] * r for r in pr["rounds"]]
  assert got.stats["tau"] > 2.0, got.stats  # a drafter that agrees: several tokens per verify pass


@pytest.mark.slow
def test_greedy_draft_tree_matches_the_fixture_oracle():
  model, prompts, oracle = helpers.fixture_batch("huginn_tiny")
  n = len(oracle)
  want = helpers.ar_tokens(model, prompts, n)
  assert want[0] == oracle
  got = gen(model, prompts, max_new=n, method="draft", draft_model=shallow(model, 2), gamma=4, branch=3, tree_nodes=12)
  assert got.tokens == want, got.stats


@pytest.mark.slow
def test_topk_draft_tree_sampled_equals_ar_and_traces_once():
  model = tiny_model("huginn:tiny", 0.05)
  kw = dict(draft_model=shallow(model), **ENV, drafts="topk", temperature=1.0, top_k=20)
  entries = [(common, "prefill_state"), (draft_tree, "initial_state"), (draft_tree, "decode_loop")]
  runs = helpers.sampling_runs(model, "draft", kw, entries)
  assert runs["cache_sizes"] == (1, 1, 1)
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)
  assert runs["a"].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, temperature=1.0, top_k=20, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft", "tree"])
def test_sampled_drafts_trace_once_and_are_seeded(method):
  model = tiny_model("huginn:tiny", 0.05)
  if method == "draft":
    kw = dict(draft_model=shallow(model), **ENV, temperature=1.0)
    entries = [(common, "prefill_state"), (draft_tree, "initial_state"), (draft_tree, "decode_loop")]
  else:
    kw = dict(d1=1, **ENV, drafts="sample", temperature=1.0)
    entries = [(common, "prefill_state"), (tl, "initial_state"), (self_spec, "decode_loop")]
  runs = helpers.sampling_runs(model, method, kw, entries)
  assert runs["cache_sizes"] == (1, 1, 1)
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)
  assert runs["a"].stats["drafts"] == "sample" and runs["a"].stats["tau"] > 1.5


# ---------------------------------------------------------------------------------------------------
# The without-replacement rule on its own (no model): depth-2 trees over 4 tokens
# ---------------------------------------------------------------------------------------------------
V4, PARENT4, N4 = 4, jnp.asarray([0, 0, 0, 1, 1, 2, 2]), 40_000


def wor(key, q, n: int):
  """n tokens drawn from q without replacement (sequentially, renormalised)."""
  out, left = [], q
  for kk in jax.random.split(key, n):
    t = jax.random.categorical(kk, jnp.log(left))
    out.append(t)
    left = left.at[t].set(0.0)
  return jnp.stack(out)


@functools.partial(jax.jit, static_argnames=("replacement",))
def wor_trials(key, p0, p1, q0, q1, p2, replacement):
  def one(k):
    k1, k2, k3, k4 = jax.random.split(k, 4)
    c1 = wor(k1, q0, 2)
    c2 = jax.vmap(lambda kk, a: wor(kk, q1[a], 2))(jax.random.split(k2, 2), c1)
    tokens = jnp.concatenate([jnp.zeros((1,), jnp.int32), c1, c2.reshape(-1)]).astype(jnp.int32)
    p = jnp.stack([p0, p1[c1[0]], p1[c1[1]], p2, p2, p2, p2])
    q = jnp.stack([q0, q1[c1[0]], q1[c1[1]], q0, q0, q0, q0])
    n, path, y = specinfer.verify_multistep(k3, tokens, PARENT4, jnp.ones((7,), bool), p, q, 2, replacement=replacement)
    nxt = jax.random.categorical(k4, jnp.log(p1[y]))
    t1 = jnp.where(n == 0, y, tokens[path[1]])
    t2 = jnp.where(n == 0, nxt, jnp.where(n == 1, y, tokens[path[2]]))
    return t1, t2

  return jax.vmap(one)(jax.random.split(key, N4))


def test_without_replacement_rule_is_exact_and_the_with_replacement_rule_is_not():
  """Siblings drawn without replacement: the matching rule (q renormalised with earlier siblings removed)
  follows p0(t1) p1[t1](t2); the with-replacement rule on the same draws does not (p0 = (.1, .2, .3, .4), q0
  reversed: it over-rejects the second sibling)."""
  rng = np.random.default_rng(3)
  p1 = np.stack([helpers.rand_dist(rng, V4) for _ in range(V4)])
  q1 = np.stack([helpers.rand_dist(rng, V4) for _ in range(V4)])
  p0 = np.asarray([0.1, 0.2, 0.3, 0.4], np.float32)
  q0 = p0[::-1].copy()
  exact = p0[:, None] * p1
  assert helpers.chi2_power(N4, exact, tv=0.05, alpha=0.01) >= 0.99
  args = tuple(map(jnp.asarray, (p0, p1, q0, q1, p1[0])))
  for replacement, ok in ((False, True), (True, False)):
    t1, t2 = wor_trials(jax.random.PRNGKey(0), *args, replacement=replacement)
    c = np.zeros((V4, V4))
    np.add.at(c, (np.asarray(t1), np.asarray(t2)), 1)
    p = helpers.chi2_pvalue(c, exact, check_support=False)
    assert (p > 0.01) if ok else (p < 1e-6), (replacement, p)


# ---------------------------------------------------------------------------------------------------
# Sampled drafts: chi-square against exact enumeration
# ---------------------------------------------------------------------------------------------------
VOCAB = 8
PROMPT = [1, 2, 3, 4, 5]
N = 10_000  # power >= 0.99 at TV 0.05 (asserted; about 0.998 for 64 cells at ALPHA)
ALPHA = 1e-3
SMALL = dict(gamma=2, branch=2, tree_nodes=4)


def small_target():
  return tiny_model("raven_llama:tiny", 0.05, seed=0, vocab_size=VOCAB)


def self_target():
  """A random target (no contraction): its depth-1 readout disagrees with depth R often."""
  return tiny_model("raven_llama:tiny", None, seed=1, vocab_size=VOCAB)


def wrong_drafter():
  return tiny_model("ouro:tiny", None, seed=7, vocab_size=VOCAB, recurrence=1)


CASES = {
    "draft": (small_target, dict(method="draft", draft_model=None, **SMALL)),
    "tree": (self_target, dict(method="tree", d1=1, drafts="sample", **SMALL)),
    "draft-distinct": (small_target, dict(method="draft", draft_model=None, drafts="distinct", **SMALL)),
    "tree-distinct": (self_target, dict(method="tree", d1=1, drafts="distinct", **SMALL)),
    "tree-sequoia": (self_target, dict(method="tree", d1=1, drafts="distinct", shape="sequoia", **SMALL)),
    "draft-kseq": (small_target, dict(method="draft", draft_model=None, drafts="kseq", **SMALL)),
    "tree-kseq": (self_target, dict(method="tree", d1=1, drafts="kseq", **SMALL)),
    "tree-kseq-sequoia": (self_target, dict(method="tree", d1=1, drafts="kseq", shape="sequoia", **SMALL)),
}
DEFAULT_CASES = ()  # each case is 25-30 s on a quiet host: the statistics run with -m slow


def sampled_counts(case: str, seed: int):
  target, kw = CASES[case]
  kw = dict(kw)
  if kw["method"] == "draft":
    kw["draft_model"] = wrong_drafter()
  res = gen(target(), [PROMPT] * N, max_new=2, temperature=1.0, seed=seed, **kw)
  toks = np.asarray(res.tokens, np.int64)
  counts = np.zeros((VOCAB, VOCAB), np.int64)
  np.add.at(counts, tuple(toks.T), 1)
  exact = helpers.exact_sequence_distribution(target(), PROMPT, 2, 1.0)
  return res, counts, exact


@pytest.mark.parametrize("case", [c if c in DEFAULT_CASES else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_sampled_tree_matches_exact_enumeration(case):
  res, counts, exact = sampled_counts(case, seed=11)
  p = helpers.chi2_pvalue(counts, exact)
  print(f"  {case}: p={p:.4g} tau={res.stats['tau']:.3f} acceptance={res.stats['acceptance']:.3f}")
  assert helpers.chi2_power(N, exact, tv=0.05, alpha=ALPHA) >= 0.99
  assert p > ALPHA, (p, res.stats)
  assert 0.1 < res.stats["acceptance"] < 0.9, res.stats  # rejections and acceptances both common


@pytest.mark.slow
@pytest.mark.parametrize("case", ("draft", "tree"))
def test_unnormalised_residual_fails_the_same_test(case, monkeypatch):
  """The residual max(p - q, 0) left unnormalised (later siblings' ratios shrink): the same test rejects."""
  original = specinfer._residual
  monkeypatch.setattr(specinfer, "_residual", lambda p, q, renormalize: original(p, q, False))
  module = draft_tree if case == "draft" else self_spec
  monkeypatch.setattr(module, "decode_loop", helpers.fresh_jit(module.decode_loop))  # retrace with the bias
  _, counts, exact = sampled_counts(case, seed=11)
  p = helpers.chi2_pvalue(counts, exact, check_support=False)
  print(f"  {case} biased: p={p:.4g}")
  assert p < ALPHA, p


@pytest.mark.slow
@pytest.mark.parametrize("case", ("draft-kseq", "tree-kseq"))
def test_kseq_with_rho_one_fails_the_same_test(case, monkeypatch):
  """K-SEQ with rho = 1 at every node (invalid for k > 1: the residual p - min(p, q) f(beta) goes negative
  and is clipped): the same test rejects."""
  original = spectr.verify_kseq
  monkeypatch.setattr(spectr, "verify_kseq", lambda *a, **k: original(*a, variant="rho_one"))
  module = draft_tree if case.startswith("draft") else self_spec
  monkeypatch.setattr(module, "decode_loop", helpers.fresh_jit(module.decode_loop))  # retrace with the bias
  _, counts, exact = sampled_counts(case, seed=11)
  p = helpers.chi2_pvalue(counts, exact, check_support=False)
  print(f"  {case} rho = 1: p={p:.4g}")
  assert p < ALPHA, p
