"""Sequoia static tree shapes (`decoding/tree/sequoia.py`, `generate(method="tree:...,shape=sequoia")`).

- The dynamic program is exact: its value equals a brute force over every ancestor-closed node set of the
  complete tree (small envelopes, random and non-monotone acceptance vectors), and the shape it returns has
  that value under the model.
- The shape is a topological tree within the envelope (depth <= gamma, ranks < branch, 1 + tree_nodes nodes).
- Bad shape / accept arguments are refused before compiling.
- Greedy output equals AR token for token; sampled output with top-rank drafts (drafts="topk") equals AR's
  sampled output for the same seed, one compile of the loop (slow); drafts="sample" with the Sequoia shape is
  chi-square tested in tests/decoding/tree/test_tree_sampled.py ("tree-sequoia", slow).
"""

import itertools

import numpy as np
import pytest

import helpers
import loopspec_jax
from helpers import MAX_NEW, PROMPTS, tiny_model
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import draft_tree
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.decoding.tree import sequoia


def brute_force(accept, gamma: int, branch: int, n: int) -> float:
  """The best sum of reach probabilities over all ancestor-closed sets of n non-root nodes."""
  nodes = [()]  # paths of ranks
  for d in range(1, gamma + 1):
    nodes += [p + (r,) for p in nodes if len(p) == d - 1 for r in range(branch)]
  nodes = nodes[1:]
  reach = {p: float(np.prod([accept[i][r] for i, r in enumerate(p)])) for p in nodes}
  best = -np.inf
  for pick in itertools.combinations(nodes, n):
    s = set(pick)
    if all(len(p) == 1 or p[:-1] in s for p in pick):
      best = max(best, sum(reach[p] for p in pick))
  return best


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("env", [(3, 2, 4), (2, 3, 4), (3, 2, 6)])
def test_dp_matches_brute_force(env, seed):
  gamma, branch, n = env
  rng = np.random.RandomState(seed)
  raw = rng.dirichlet(np.ones(branch + 1), size=gamma)[:, :branch]  # per depth, any order (non-monotone too)
  accept = sequoia.parse_accept(raw.tolist(), gamma, branch)
  shape = sequoia.sequoia_shape(accept, gamma, branch, n)
  value = sequoia.best_children(accept, gamma, branch, n)[0][0][n]
  assert value == pytest.approx(brute_force(accept, gamma, branch, n))
  assert sequoia.expected_accepted(shape, accept) == pytest.approx(value)


@pytest.mark.parametrize("env", [(6, 4, 32), (3, 2, 6), (1, 3, 3), (5, 3, 24)])
def test_shape_is_a_tree_in_the_envelope(env):
  gamma, branch, n = env
  shape = sequoia.sequoia_shape(sequoia.parse_accept((0.8, 0.1, 0.05)[:branch], gamma, branch), gamma, branch, n)
  assert len(shape.parent) == 1 + n and shape.depth[0] == 0
  assert all(shape.parent[i] < i and shape.depth[i] == shape.depth[shape.parent[i]] + 1 for i in range(1, n + 1))
  assert max(shape.depth) <= gamma and max(shape.rank) < branch
  sibs = [(shape.parent[i], shape.rank[i]) for i in range(1, n + 1)]
  assert len(set(sibs)) == n  # one node per (parent, rank)
  # accept (1, 0, ...): the chain spine is worth gamma, anything else nothing
  chain = sequoia.sequoia_shape(sequoia.parse_accept((1.0,), gamma, branch), gamma, branch, n)
  assert sequoia.expected_accepted(chain, sequoia.parse_accept((1.0,), gamma, branch)) == pytest.approx(gamma)


def test_parse_accept_and_bad_arguments_are_refused():
  assert sequoia.parse_accept("0.5/0.25", 2, 3) == ((0.5, 0.25, 0.0),) * 2
  for bad in ("0.5/x", (0.7, 0.6), (0.1,) * 5, ((0.5,),) * 3, (-0.1,)):
    with pytest.raises(ValueError, match="accept"):
      sequoia.parse_accept(bad, 2, 4)
  model = tiny_model("huginn:tiny", 0.05)
  entries = [(common, "prefill_state"), (self_spec, "decode_loop")]
  base = dict(prompts=[[1, 2, 3]], max_new_tokens=MAX_NEW, method="tree", d1=1, gamma=3, branch=2, tree_nodes=6)
  helpers.assert_rejected_before_compiling(model, dict(base, shape="round"), "shape", entries)
  helpers.assert_rejected_before_compiling(model, dict(base, accept="0.5/0.5"), "accept=", entries)
  helpers.assert_rejected_before_compiling(model, dict(base, shape="sequoia", accept="0.9/0.9"), "accept", entries)


SPEC = "tree:d1=1,gamma=3,branch=2,tree_nodes=6,shape=sequoia,accept=0.6/0.3"


def test_greedy_sequoia_tree_equals_ar():
  for contraction in (None, 0.05):
    want = helpers.generate_cached("huginn:tiny", contraction, "ar")
    got = helpers.generate_cached("huginn:tiny", contraction, SPEC)
    assert got.tokens == want.tokens, got.stats
    assert got.stats["shape"] == "sequoia" and got.stats["accept"][0] == [0.6, 0.3]
  assert got.stats["tau"] > 1.5, got.stats


@pytest.mark.slow
def test_sampled_topk_sequoia_tree_equals_ar_and_traces_once():
  model = tiny_model("huginn:tiny", 0.05)
  kw = dict(temperature=1.0, top_k=20)
  runs = helpers.sampling_runs(model, SPEC, kw, [(common, "prefill_state"), (self_spec, "decode_loop")])
  assert runs["cache_sizes"] == (1, 1)
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)
  assert runs["a"].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, **kw, seed=0)


def test_default_shape_is_unchanged():
  """shape=None keeps the EAGLE-2 loop (no static shape in the loop's arguments)."""
  cfg = tiny_model("huginn:tiny", 0.05).config
  dec = loopspec_jax.TreeSelf(d1=1, gamma=3, branch=2, tree_nodes=6).make_decoder(cfg, greedy=True, random_init=False)
  assert "shape" not in dec.loop_kw
  seq = loopspec_jax.TreeSelf(d1=1, gamma=3, branch=2, tree_nodes=6, shape="sequoia")
  dec = seq.make_decoder(cfg, greedy=True, random_init=False)
  assert isinstance(dec.loop_kw["shape"], draft_tree.Shape)


def test_default_vector_follows_the_decoding_mode():
  """shape=sequoia without accept=: greedy decoding takes the greedy vector, sampling the vector measured for
  its drafts mode (sample / distinct / topk); accept= still overrides both."""
  cfg = tiny_model("huginn:tiny", 0.05).config
  env = dict(d1=1, gamma=6, branch=4, tree_nodes=32, shape="sequoia")
  for greedy, drafts, mode in ((True, "sample", "greedy"), (False, "sample", "sample"), (False, None, "topk")):
    for d1 in (1, 2, 5):  # deeper than measured: the deepest measured d1's vector
      dec = loopspec_jax.TreeSelf(**dict(env, d1=d1), drafts=drafts).make_decoder(cfg, greedy=greedy, random_init=False)
      want = sequoia.parse_accept(sequoia.default_accept(min(d1, 2), mode, 4), 6, 4)
      assert dec.loop_kw["shape"] == sequoia.sequoia_shape(want, 6, 4, 32)
      assert dec.stats.keywords["accept"] == want
  assert sequoia.default_accept(1, "distinct", 2) == sequoia.DEFAULT_ACCEPT[1, "distinct"][:2]
  seq = loopspec_jax.TreeSelf(**env, drafts="sample", accept="0.6/0.3")
  assert seq.make_decoder(cfg, greedy=False, random_init=False).stats.keywords["accept"][0] == (0.6, 0.3, 0.0, 0.0)
  with pytest.raises(ValueError, match="mode"):
    sequoia.default_accept(1, "beam", 4)
