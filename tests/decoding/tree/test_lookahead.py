"""Lookahead decoding on the tree verifier (`method='lookahead:window=,ngram=,guesses='`): the pool and the
Jacobi window on hand-made inputs (no model), then greedy and sampled output equal AR token for token."""

import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from helpers import MAX_NEW, PROMPTS, tiny_model
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import lookahead as la
from loopspec_jax.decoding.tree import verify as tv


def test_prompt_pool_holds_the_prompts_last_ngrams():
  tokens = jnp.asarray([[5, 6, 7, 8, 9, 0, 0, 0], [1, 2, 0, 0, 0, 0, 0, 0]])
  pool, count = la.prompt_pool(tokens, jnp.asarray([5, 2]), 3, 2)
  assert count.tolist() == [2, 0]
  assert pool[0].tolist() == [[6, 7, 8], [7, 8, 9]] and pool[1].tolist() == [[-1] * 3] * 2
  pool, count = la.prompt_pool(tokens, jnp.asarray([5, 2]), 3, 4)
  assert count.tolist() == [3, 0] and pool[0].tolist()[:3] == [[5, 6, 7], [6, 7, 8], [7, 8, 9]]


def test_tree_has_the_window_chain_and_the_newest_matching_ngrams():
  """Pool n-grams (numbers 0..4 in ring slots 0..4): those starting with the root token 7, newest first."""
  pool = jnp.asarray([[[7, 1, 2], [3, 4, 5], [7, 3, 3], [7, 1, 2], [7, 9, 9], [-1, -1, -1]]])
  state = la.LookaheadState(window=jnp.asarray([[11, 12]]), pool=pool, added=jnp.asarray([5]))
  tree = la.build_tree(jnp.asarray([7]), state, 4)
  assert tree.tokens[0].tolist() == [7, 11, 12, 9, 9, 1, 2, 3, 3, 1, 2]  # picks slots 4, 3, 2, 0
  assert tree.parent[0].tolist() == [0, 0, 1, 0, 3, 0, 5, 0, 7, 0, 9]
  assert tree.depth[0].tolist() == [0, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2]
  assert tree.valid[0].tolist() == [True] * 11
  merged, _ = tv.normalize(tree, 2)
  # slot 0 repeats slot 3 (7, 1, 2): merged away
  assert merged.valid[0].tolist() == [True] * 9 + [False, False]
  tree = la.build_tree(jnp.asarray([3]), state, 2)  # one match (slot 1), one empty guess
  assert tree.tokens[0].tolist()[3:5] == [4, 5] and tree.valid[0].tolist() == [True] * 5 + [False] * 2


def test_jacobi_step_shifts_the_window_and_adds_trajectory_ngrams():
  """Root 7 at p0 = 3 after tokens 1 2 3 7; window (11, 12, 13); draws after nodes 0..3 are (11, 20, 21, 22):
  two tokens commit (11 accepted, then 20), so the next window is the draws after nodes 2, 3, 3."""
  state = la.LookaheadState(
      window=jnp.asarray([[11, 12, 13]]), pool=jnp.full((1, 8, 3), -1, jnp.int32), added=jnp.asarray([6])
  )
  tokens = jnp.asarray([[1, 2, 3, 7, 0, 0, 0, 0, 0, 0]])
  y = jnp.asarray([[11, 20, 21, 22, 0, 0]])
  out = la.jacobi_update(state, tokens, jnp.asarray([3]), y, jnp.asarray([2]), jnp.asarray([True]))
  assert out.window.tolist() == [[21, 22, 22]]
  assert int(out.added[0]) == 10
  # n-grams numbers 6..9 in slots 6, 7, 0, 1: (3 7 11) (7 11 20) (11 12 21) (12 13 22)
  assert np.asarray(out.pool[0]).tolist()[6:] == [[3, 7, 11], [7, 11, 20]]
  assert np.asarray(out.pool[0]).tolist()[:2] == [[11, 12, 21], [12, 13, 22]]
  done = la.jacobi_update(state, tokens, jnp.asarray([3]), y, jnp.asarray([0]), jnp.asarray([False]))
  assert done.window.tolist() == [[11, 12, 13]] and int(done.added[0]) == 6


# ---------------------------------------------------------------------------------------------------
# With a model
# ---------------------------------------------------------------------------------------------------
SPEC = "lookahead:window=3,ngram=3,guesses=3"


def test_greedy_and_sampled_equal_ar_token_for_token():
  """Random and contractive Huginn weights, greedy; then T = 1 with top-k under four seeded calls that
  compile the loop once: the tokens are AR's."""
  name = "huginn:tiny"
  for contraction in (None, 0.05):
    want = helpers.generate_cached(name, contraction, "ar")
    got = helpers.generate_cached(name, contraction, SPEC)
    assert got.tokens == want.tokens, got.stats
  assert got.stats["tau"] > 1.2, got.stats
  model = tiny_model(name, 0.05)
  kw = dict(temperature=1.0, top_k=20)
  runs = helpers.sampling_runs(model, SPEC, kw, [(common, "prefill_state"), (la, "decode_loop")])
  assert runs["cache_sizes"] == (1, 1)
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)
  assert runs["a"].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, seed=0, **kw)
  assert runs["seed1"].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, seed=1, **kw)


@pytest.mark.parametrize(
    "method,match",
    [
        ("lookahead:window=0", r"1 <= window <= 32, got 0"),
        ("lookahead:ngram=1", r"2 <= ngram <= 16, got 1"),
        ("lookahead:guesses=0", r"1 <= guesses <= 64, got 0"),
        ("lookahead:window=2.5", r"integer window, got 2.5"),
    ],
)
def test_bad_settings_rejected_before_compiling(method, match):
  model = tiny_model("raven_llama:tiny")
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=MAX_NEW, method=method)
  helpers.assert_rejected_before_compiling(model, args, match, [(common, "prefill_state"), (la, "decode_loop")])
