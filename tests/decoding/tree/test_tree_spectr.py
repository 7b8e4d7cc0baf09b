"""SpecTr's K-SEQ on sampled trees (decoding/tree/spectr.py): the rule in closed form, its acceptance, and the
kernel chi-square tested against exact enumeration (the approach of test_tree_specinfer.py).

- rho: valid (p >= min(q, p / rho) f(beta) everywhere), 1 at k = 1, within [1, k]; the emitted marginal of
  one node in closed form equals p for random p, q, k (and the two wrong variants do not).
- Acceptance: P(some child accepted) = 1 - (1 - beta)^k and P(slot i) = beta (1 - beta)^i against Monte
  Carlo, and above SpecInfer's for p close to q.
- The kernel on hand-made depth-2 trees over 4 tokens (children drawn i.i.d. from q, duplicates kept; one
  tree with 2 children per node, one with 3 / 1 / 2 / 0): the first two emitted tokens follow p0(t1)
  p1[t1](t2), at a sample size with power >= 0.99 against TV 0.05 (asserted); rho = 1 at k > 1 and the
  residual without f(beta) fail the same test.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
import loopspec_jax
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import draft_tree
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.decoding.tree import sequoia
from loopspec_jax.decoding.tree import specinfer
from loopspec_jax.decoding.tree import spectr

V = 4
N = 40_000
TREES = {"binary": (0, 0, 0, 1, 1, 2, 2), "ragged": (0, 0, 0, 0, 1, 2, 2)}  # node -> parent (node 0: root)


def dists(seed):
  rng = np.random.default_rng(seed)
  p0 = helpers.rand_dist(rng, V, "sparse")
  p1 = np.stack([helpers.rand_dist(rng, V, "dense" if a % 2 else "sparse") for a in range(V)])
  q0 = helpers.rand_dist(rng, V)
  q1 = np.stack([helpers.rand_dist(rng, V) for _ in range(V)])
  p2 = helpers.rand_dist(rng, V)
  return p0, p1, q0, q1, p2


@functools.partial(jax.jit, static_argnames=("k", "variant"))
def batch_rule(p, q, *, k: int, variant=None):
  """node_rule and the closed-form emitted distribution over a batch of (p, q) pairs [n, V]."""

  def one(p, q):
    rho, m, res, acc = spectr.node_rule(p, q, k, variant)
    f = 1.0 if variant == "no_factor" else spectr.scale(jnp.sum(m), k)
    return rho, m, f, acc, m * f + (1.0 - acc) * res / jnp.sum(res)

  return jax.vmap(one)(p, q)


def test_rho_is_valid_and_the_node_marginal_is_exact():
  rng = np.random.default_rng(0)
  conc = lambda: np.full(8, rng.choice([0.3, 1.0, 5.0]))
  p = np.stack([rng.dirichlet(conc()) for _ in range(64)]).astype(np.float32)
  q = np.stack([rng.dirichlet(conc()) for _ in range(64)]).astype(np.float32)
  p[:8], q[:8] = q[8:16], q[8:16]  # p == q: rho = 1, everything accepted
  for k in (1, 2, 3, 4, 6):
    rho, m, f, acc, out = map(np.asarray, batch_rule(jnp.asarray(p), jnp.asarray(q), k=k))
    beta = m.sum(-1)
    assert np.all((1.0 <= rho) & (rho <= k + 1e-6))
    assert np.all(rho >= f - 1e-6)  # rho >= f(beta(rho)): valid
    assert np.all(p - m * f[:, None] >= -1e-6)  # the residual needs no clipping beyond rounding
    np.testing.assert_allclose(acc, 1 - (1 - beta) ** k, atol=1e-5)
    if k == 1:  # ordinary speculative sampling
      assert np.all(rho == 1.0) and np.allclose(beta, np.minimum(p, q).sum(-1), atol=1e-6)
    np.testing.assert_allclose(out, p, atol=2e-6)
    np.testing.assert_allclose(acc[:8], 1.0, atol=1e-5)
  # the wrong variants are biased on p = (.1, .2, .3, .4), q reversed, k = 2 (TV 0.12 and 0.06)
  p = np.asarray([[0.1, 0.2, 0.3, 0.4]], np.float32)
  for variant, tv in (("rho_one", 0.1), ("no_factor", 0.05)):
    out = np.asarray(batch_rule(jnp.asarray(p), jnp.asarray(p[:, ::-1].copy()), k=2, variant=variant)[-1])
    assert 0.5 * np.abs(out - p).sum() > tv, variant


@functools.partial(jax.jit, static_argnames=("k", "rule"))
def one_level(key, p, q, *, k: int, rule: str):
  """A root with k children drawn i.i.d. from q: (n accepted, the accepted slot) over N trials."""
  tokens_parent = jnp.zeros((k + 1,), jnp.int32)

  def one(kk):
    k1, k2 = jax.random.split(kk)
    kids = jax.random.categorical(k1, jnp.log(q), shape=(k,))
    tokens = jnp.concatenate([jnp.zeros((1,), jnp.int32), kids]).astype(jnp.int32)
    pp, qq = jnp.broadcast_to(p, (k + 1, V)), jnp.broadcast_to(q, (k + 1, V))
    valid = jnp.ones((k + 1,), bool)
    if rule == "kseq":
      n, path, _ = spectr.verify_kseq(k2, tokens, tokens_parent, valid, pp, qq, 1)
    else:
      n, path, _ = specinfer.verify_multistep(k2, tokens, tokens_parent, valid, pp, qq, 1)
    return n, path[1]

  return jax.vmap(one)(jax.random.split(key, N))


def test_acceptance_is_one_minus_one_minus_beta_to_the_k():
  p = np.asarray([0.30, 0.25, 0.25, 0.20], np.float32)
  q = np.asarray([0.22, 0.28, 0.20, 0.30], np.float32)  # close to p: 1 - TV = 0.9
  prev = None
  for k in (1, 2, 4):
    _, m, _, acc = spectr.node_rule(p, q, k)
    beta = float(jnp.sum(m))
    n, slot = one_level(jax.random.PRNGKey(k), jnp.asarray(p), jnp.asarray(q), k=k, rule="kseq")
    n, slot = np.asarray(n), np.asarray(slot)
    sd = np.sqrt(float(acc) * (1 - float(acc)) / N)
    assert abs(n.mean() - float(acc)) < 5 * sd + 1e-4, (k, n.mean(), float(acc))
    for i in range(k):  # slot i + 1 (node index) accepted with beta (1 - beta)^i
      want = beta * (1 - beta) ** i
      assert abs(np.mean(slot == i + 1) - want) < 5 * np.sqrt(want * (1 - want) / N) + 1e-4, (k, i)
    if k > 1:  # above SpecInfer's rule on the same kind of draws
      n_si, _ = one_level(jax.random.PRNGKey(k), jnp.asarray(p), jnp.asarray(q), k=k, rule="specinfer")
      assert n.mean() > np.asarray(n_si).mean() + 0.01, (k, n.mean(), np.asarray(n_si).mean())
    assert prev is None or float(acc) > prev
    prev = float(acc)


@functools.partial(jax.jit, static_argnames=("parent", "variant"))
def trials(key, p0, p1, q0, q1, p2, *, parent, variant=None):
  """N rounds on the tree `parent` (depth <= 2): depth-1 children i.i.d. from q0, depth-2 children of a
  node with token a i.i.d. from q1[a]; the first two emitted tokens (t1, t2) and the accepted depth."""
  parent = np.asarray(parent)
  depth = np.zeros(len(parent), int)
  for i in range(1, len(parent)):
    depth[i] = depth[parent[i]] + 1
  par = jnp.asarray(parent, jnp.int32)

  def one(k):
    ks = jax.random.split(k, len(parent) + 2)
    tok = [jnp.int32(0)]
    for i in range(1, len(parent)):
      dist = q0 if depth[i] == 1 else q1[tok[parent[i]]]
      tok.append(jax.random.categorical(ks[i], jnp.log(dist)).astype(jnp.int32))
    tokens = jnp.stack(tok)
    p = jnp.stack([p0] + [p1[tok[i]] if depth[i] == 1 else p2 for i in range(1, len(parent))])
    q = jnp.stack([q0] + [q1[tok[i]] if depth[i] == 1 else q0 for i in range(1, len(parent))])
    n, path, y = spectr.verify_kseq(ks[0], tokens, par, jnp.ones((len(parent),), bool), p, q, 2, variant)
    nxt = jax.random.categorical(ks[-1], jnp.log(p1[y]))  # the next round's draw after y
    return (*helpers.first_two_emitted(n, path, y, nxt, tokens), n)

  return jax.vmap(one)(jax.random.split(key, N))


def counts(t1, t2):
  return helpers.pair_counts(t1, t2, V)


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("seed", [0, 1])
def test_kseq_matches_exact_enumeration(tree, seed):
  p0, p1, q0, q1, p2 = dists(seed)
  exact = p0[:, None] * p1
  assert helpers.chi2_power(N, exact, tv=0.05, alpha=0.01) >= 0.99
  t1, t2, n = trials(jax.random.PRNGKey(seed), *map(jnp.asarray, (p0, p1, q0, q1, p2)), parent=TREES[tree])
  pval = helpers.chi2_pvalue(counts(t1, t2), exact)
  print(f"  {tree} seed {seed}: p={pval:.4g}")
  assert pval > 0.01, pval
  n = np.asarray(n)
  assert (n == 0).any() and (n == 1).any() and (n == 2).any()  # every outcome of the walk occurs


@pytest.mark.parametrize("variant", ["rho_one", "no_factor"])
def test_wrong_variants_fail_the_same_test(variant):
  """p0 = (.1, .2, .3, .4), q0 reversed: rho = 1 with k = 2 (TV 0.12 at the root) and the residual without
  f(beta) (TV 0.06) are rejected."""
  _, p1, _, q1, p2 = dists(0)
  p0 = np.asarray([0.1, 0.2, 0.3, 0.4], np.float32)
  q0 = p0[::-1].copy()
  exact = p0[:, None] * p1
  args = map(jnp.asarray, (p0, p1, q0, q1, p2))
  t1, t2, _ = trials(jax.random.PRNGKey(0), *args, parent=TREES["binary"], variant=variant)
  pval = helpers.chi2_pvalue(counts(t1, t2), exact, check_support=False)
  print(f"  {variant}: p={pval:.4g}")
  assert pval < 1e-6, pval


# ---------------------------------------------------------------------------------------------------
# drafts="kseq" in the decoders
# ---------------------------------------------------------------------------------------------------
ENV = dict(gamma=3, branch=2, tree_nodes=6)


@pytest.mark.slow
def test_kseq_tree_is_batched_seeded_and_compiles_once():
  """Tree self-speculation with drafts="kseq" (static and Sequoia count-table shapes share nothing but the
  rule): four sampling calls (seeds, request ids, batch positions) under fresh jits, one program each."""
  model = helpers.tiny_model("huginn:tiny", 0.05)
  kw = dict(d1=1, **ENV, drafts="kseq", temperature=1.0)
  entries = [(common, "prefill_state"), (tl, "initial_state"), (self_spec, "decode_loop")]
  runs = helpers.sampling_runs(model, "tree", kw, entries)
  assert runs["cache_sizes"] == (1, 1, 1)
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)
  assert runs["a"].stats["drafts"] == "kseq" and runs["a"].stats["tau"] > 1.5, runs["a"].stats


def test_greedy_is_untouched_by_kseq_and_bad_values_are_refused():
  model = helpers.tiny_model("huginn:tiny", 0.05)
  want = helpers.ar_tokens(model, helpers.PROMPTS, helpers.MAX_NEW)
  kw = dict(method="tree", d1=1, drafts="kseq", shape="sequoia", **ENV)  # greedy: drafts ignored (top-k)
  got = loopspec_jax.generate(model, helpers.PROMPTS, max_new_tokens=helpers.MAX_NEW, **kw)
  assert got.tokens == want and got.stats["drafts"] == "topk", got.stats
  entries = [(common, "prefill_state"), (self_spec, "decode_loop")]
  base = dict(prompts=[[1, 2, 3]], max_new_tokens=4, temperature=1.0)
  for extra, match in [
      (dict(drafts="k-seq"), "drafts in"),
      (dict(drafts="kseq", shape="sequoia", accept="0.9/0.05"), "K-SEQ table needs rows"),
      (dict(drafts="kseq", shape="sequoia", accept="0.9;0.8/0.3"), "summing to <= 1"),
  ]:
    args = dict(base, method="tree", d1=1, **ENV, **extra)
    helpers.assert_rejected_before_compiling(model, args, match, entries)


def test_kseq_sequoia_shape_uses_the_count_table():
  table = sequoia.DEFAULT_ACCEPT[1, "kseq"]
  env = self_spec.resolve(helpers.tiny_config("huginn:tiny"), 1, 6, 4, 32, "kseq", "sequoia", greedy=False)
  assert env["accept"] == sequoia.parse_counts(table, 4)
  shape = self_spec.static_shape_of(6, 4, 32, "kseq", "sequoia", env["accept"])
  assert shape == sequoia.kseq_shape(env["accept"], 6, 4, 32) and len(shape.parent) == 33
  # the count DP's tree is at least as good under its own model as other 32-node shapes: the positional DP's
  # for each row and for the sample vector, draft_tree's static shape, and the 6-node chain
  best_k = sequoia.expected_accepted_counts(shape, env["accept"])
  others = [sequoia.sequoia_shape(sequoia.parse_accept(r, 6, 4), 6, 4, 32) for r in env["accept"]]
  others.append(sequoia.sequoia_shape(sequoia.parse_accept(sequoia.DEFAULT_ACCEPT[1, "sample"], 6, 4), 6, 4, 32))
  others.append(draft_tree.static_shape(6, 4, 32))
  for other in others:
    assert best_k >= sequoia.expected_accepted_counts(other, env["accept"]) - 1e-9
  chain = sequoia.kseq_shape(env["accept"][:1], 6, 1, 6)
  assert chain.depth == tuple(range(7))
  assert abs(sequoia.expected_accepted_counts(chain, env["accept"]) - sum(table[0][0] ** d for d in range(1, 7))) < 1e-9
  greedy = self_spec.resolve(helpers.tiny_config("huginn:tiny"), 1, 6, 4, 32, "kseq", "sequoia", greedy=True)
  assert greedy["accept"] == sequoia.parse_accept(sequoia.default_accept(1, "greedy", 4), 6, 4)
