"""Prompt lookup with several matches (`method="lookup", candidates=C`): the C best distinct n-gram matches'
continuations verified as one token tree (`decoding/tree/lookup_tree.py`).

- the ranking and de-duplication of candidates on hand-made text (no model), candidate 0 being exactly the
  chain path's drafts, and shared prefixes merged by the verifier's `normalize`;
- greedy output equals AR token for token (the four families, the HF fixtures and the bundled tiny-raven,
  batches of prompts of different lengths; all but huginn:tiny are marked slow);
- sampled output (T = 1 with top-k, and with top-p) equals AR's sampled output for the same seed, with one
  compile per configuration;
- candidates=1 is the chain path, and bad arguments are refused before anything compiles.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import helpers
import loopspec_jax
from helpers import MAX_NEW, PROMPTS, tiny_model
from loopspec_jax import methods
from loopspec_jax.decoding import common
from loopspec_jax.decoding import lookup
from loopspec_jax.decoding.tree import lookup_tree as lt
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import verify as tv

# Prompts with repeats (matches to find), of different lengths, in the (16, 32) length bucket of PROMPTS.
REPEATS = ((1, 2, 3, 1, 2, 3, 1, 2), (5, 6, 7, 8, 5, 6, 7), (40, 41, 40, 41, 40))
SPEC = "lookup:ngram=2,gamma=3,candidates=4"
FAMILIES = {"huginn:tiny": 0.05, "ouro:tiny": 0.02, "raven_llama:tiny": 0.05, "raven_olmo:tiny": 0.05}


def test_candidates_are_ranked_by_match_length_then_recency_and_distinct():
  """Text 1 2 9 | 1 2 7 | 3 2 5 | 1 2 (L = 11, suffix 1 2): starts after '1 2' (c = 2, 5) match 2 tokens, after
  '3 2' (c = 8) one; c = 5 is the most recent 2-token match. A repeat of an earlier continuation is skipped."""
  toks = jnp.asarray([[1, 2, 9, 1, 2, 7, 3, 2, 5, 1, 2, 0], [4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0]])
  lens = jnp.asarray([11, 4])
  m = lt.match_lengths(toks, lens, 3)
  assert m[0].tolist()[:11] == [0, 0, 2, 0, 0, 2, 0, 0, 1, 0, 0]
  drafts, found = lt.pick_candidates(toks, lens, 3, 2, 4)
  assert drafts[0].tolist()[:3] == [[7, 3], [9, 1], [5, 1]] and found[0].tolist() == [True, True, True, False]
  # 4 4 4 4: starts 3, 2, 1 match 3, 2, 1 tokens ... and all continue with 4 4: one distinct candidate
  assert found[1].tolist() == [True, False, False, False] and drafts[1, 0].tolist() == [4, 4]


def test_first_candidate_is_the_chain_paths_draft():
  rng = np.random.default_rng(0)
  toks = jnp.asarray(rng.integers(0, 4, (32, 40)))
  lens = jnp.asarray(rng.integers(1, 40, (32,)))
  for ngram, gamma in ((3, 4), (1, 2)):
    want, found = lookup.ngram_drafts(toks, lens, ngram, gamma)
    got, got_found = lt.pick_candidates(toks, lens, ngram, gamma, 3)
    assert np.array_equal(np.asarray(got_found[:, 0]), np.asarray(found))
    assert np.array_equal(np.asarray(got[:, 0])[np.asarray(found)], np.asarray(want)[np.asarray(found)])


def test_tree_chains_share_prefixes_and_respect_the_budget():
  drafts = jnp.asarray([[[7, 3, 4], [7, 3, 5], [9, 1, 1]]])
  tree = lt.build_tree(jnp.asarray([2]), drafts, jnp.asarray([[True, True, False]]), jnp.asarray([2]))
  assert tree.tokens[0].tolist() == [2, 7, 3, 4, 7, 3, 5, 9, 1, 1]
  assert tree.parent[0].tolist() == [0, 0, 1, 2, 0, 4, 5, 0, 7, 8]
  assert tree.depth[0].tolist() == [0, 1, 2, 3, 1, 2, 3, 1, 2, 3]
  assert tree.valid[0].tolist() == [True, True, True, False, True, True, False, False, False, False]
  merged, anc = tv.normalize(tree, 3)
  assert merged.valid[0].tolist() == [True, True, True] + [False] * 7  # 7 3 of candidate 2 merges into 1


# ---------------------------------------------------------------------------------------------------
# With a model
# ---------------------------------------------------------------------------------------------------
def check_greedy(spec, contraction, method=SPEC):
  want = helpers.generate_cached(spec, contraction, "ar", prompts=REPEATS)
  got = helpers.generate_cached(spec, contraction, method, prompts=REPEATS)
  assert got.tokens == want.tokens, (spec, contraction, got.stats)
  st = got.stats
  assert sum(st["per_request"]["rounds"]) + sum(st["per_request"]["accepted"]) == st["tokens_generated"]
  return got


def test_greedy_equals_ar_huginn():
  got = check_greedy("huginn:tiny", FAMILIES["huginn:tiny"])
  assert got.stats["tau"] > 1.0 and got.stats["nodes_per_pass"] > 0, got.stats


@pytest.mark.slow
@pytest.mark.parametrize("spec", helpers.TINY_SPECS)
def test_greedy_equals_ar_every_family_random_and_contractive(spec):
  check_greedy(spec, FAMILIES[spec])
  check_greedy(spec, None)


def test_sampled_top_k_equals_ar_one_compile():
  model = tiny_model("huginn:tiny", 0.05)
  kw = dict(temperature=1.0, top_k=20)
  entries = [(common, "prefill_state"), (tl, "initial_state"), (lt, "decode_loop")]
  runs = helpers.sampling_runs(model, SPEC, kw, entries)
  assert runs["cache_sizes"] == (1, 1, 1), runs["cache_sizes"]
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)
  assert runs["a"].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, seed=0, **kw)
  assert runs["seed1"].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, seed=1, **kw)


def test_sampled_top_p_equals_ar_on_repeats():
  model = tiny_model("huginn:tiny", 0.05)
  kw = dict(temperature=1.0, top_p=0.9, seed=3)
  want = helpers.ar_tokens(model, REPEATS, MAX_NEW, **kw)
  got = loopspec_jax.generate(model, [list(p) for p in REPEATS], max_new_tokens=MAX_NEW, method=SPEC, **kw)
  assert got.tokens == want, got.stats


def test_candidates_one_is_the_chain_path():
  cfg = tiny_model("huginn:tiny").config
  one = methods.parse("lookup:3,4").make_decoder(cfg, greedy=True, random_init=False)
  also = methods.parse("lookup:3,4,candidates=1").make_decoder(cfg, greedy=True, random_init=False)
  many = methods.parse("lookup:3,4,candidates=4").make_decoder(cfg, greedy=True, random_init=False)
  assert one.loop is also.loop is lookup.decode_loop and one.loop_kw == also.loop_kw
  assert many.loop is lt.decode_loop and many.loop_kw["candidates"] == 4
  assert methods.parse("lookup:3,4,candidates=4") == methods.build("lookup", ngram=3, gamma=4, candidates=4)


@pytest.mark.parametrize(
    "args,match",
    [
        (dict(method="lookup", gamma=2, candidates=0), r"candidates in 1..16, got 0"),
        (dict(method="lookup", gamma=2, candidates=17), r"candidates in 1..16, got 17"),
        (dict(method="lookup", gamma=2, candidates=2.5), r"candidates in 1..16, got 2.5"),
        (dict(method="lookup", gamma=2, candidates=True), r"candidates in 1..16, got True"),
        (dict(method="lookup:ngram=0,gamma=2,candidates=4"), r"ngram"),
        (dict(method="lookup:ngram=2,gamma=0,candidates=4"), r"gamma"),
    ],
)
def test_bad_arguments_rejected_before_compiling(args, match):
  model = tiny_model("huginn:tiny")
  entries = [(common, "prefill_state"), (lt, "decode_loop"), (lookup, "decode_loop")]
  helpers.assert_rejected_before_compiling(model, dict(prompts=[[1, 2]], max_new_tokens=4, **args), match, entries)


# ---------------------------------------------------------------------------------------------------
# Slow: eos, the HF fixtures and the bundled tiny-raven (R = 32)
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_eos_stops_each_request_as_ar():
  helpers.eos_run("huginn:tiny", 0.05, SPEC)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["huginn_tiny", "ouro_tiny"])
def test_hf_fixtures_greedy_equals_oracle_and_ar(name):
  model, prompts, oracle = helpers.fixture_batch(name)
  want = loopspec_jax.generate(model, prompts, max_new_tokens=len(oracle), method="ar")
  assert want.tokens[0] == oracle
  got = loopspec_jax.generate(model, prompts, max_new_tokens=len(oracle), method="lookup:2,3,candidates=3")
  assert got.tokens == want.tokens, got.stats


@pytest.mark.slow
def test_bundled_tiny_raven_greedy_and_sampled_equal_ar():
  model = loopspec_jax.load("tiny-raven")
  text = ["ROMEO:\nWhat say you? What say you, good nurse? What say", "1 + 2 = 3. 2 + 3 = 5. 3 + 4 ="]
  prompts = [model.encode(t) for t in text] + [list(range(5, 17))]
  for kw in (dict(), dict(temperature=1.0, top_k=50, seed=4), dict(temperature=1.0, top_p=0.9, seed=5)):
    want = loopspec_jax.generate(model, prompts, max_new_tokens=24, method="ar", **kw)
    got = loopspec_jax.generate(model, prompts, max_new_tokens=24, method="lookup:3,4,candidates=4", **kw)
    assert got.tokens == want.tokens, (kw, got.stats)
