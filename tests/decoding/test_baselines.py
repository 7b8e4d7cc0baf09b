"""The classic speculative baselines: a separate draft model (`method="draft"`), prompt lookup
(`method="lookup"`) and adaptive gamma (`gamma="auto"` for chain, draft and lookup).

- greedy output equals full-depth AR token for token, for each method and family, with drafters that are
  mostly right and mostly wrong (the drafter is the target's own weights run at R = 1 as a separate model, or
  random weights), so both the all-accepted path (drafter cache restored at p0 - 1) and rejections run;
- sampled output has the exact full-depth distribution (chi-square against enumerated probabilities, as in
  test_lossless_sampling.py) with a random drafter that disagrees with the target most of the time, and the
  test has power (the drafter's own distribution is rejected);
- tokens per verify pass agree with (1 - a^(gamma+1)) / (1 - a) at the measured per-draft acceptance a;
- a drafter with another vocabulary or tokenizer, and bad arguments, are refused before anything compiles;
- one trace per configuration; gamma="auto" follows its documented rule.

Compiled programs are shared on purpose (parameters are traced): the random and contractive models of a
family run the same programs, and batches stay in the (16, 32) length bucket of `helpers.PROMPTS`.
"""

import dataclasses
import json

import numpy as np
import pytest
from tokenizers import Tokenizer

import helpers
import loopspec_jax
from helpers import MAX_NEW, PROMPTS, tiny_model
from loopspec_jax import api
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding import draft
from loopspec_jax.decoding import lookup

# Prompts with repeats so that prompt lookup finds n-gram matches (same batch size and length bucket as PROMPTS).
REPEATS = ((1, 2, 3, 1, 2, 3, 1, 2), (5, 6, 7, 8, 5, 6, 7), (40, 41, 40, 41, 40))


def shallow(model, depth: int = 1):
  """A separate model object with the target's weights run to `depth` (a drafter that mostly agrees with a
  contractive target and mostly disagrees with a random one)."""
  return dataclasses.replace(model, config=model.config.replace(recurrence=depth), source=f"shallow{depth}")


def gen(model, prompts, **kw):
  return loopspec_jax.generate(model, [list(p) for p in prompts], max_new_tokens=kw.pop("max_new", MAX_NEW), **kw)


def assert_round_accounting(res, gamma):
  """Every round commits its accepted drafts plus one target token (rounds offer at most the budget left)."""
  st = res.stats
  pr = st["per_request"]
  for i, toks in enumerate(res.tokens):
    n, acc, rounds, drafted = len(toks), pr["accepted"][i], pr["rounds"][i], pr["drafted"][i]
    assert n == acc + rounds, (i, pr)
    assert acc <= pr["examined"][i] <= drafted <= gamma * rounds, (i, pr)
  n = st["tokens_generated"]
  assert st["commits"] == {"first": sum(pr["accepted"]), "second": 0, "restart": n - sum(pr["accepted"])}
  assert st["tokens_per_round"] == pytest.approx(n / st["rounds"]) == st["mean_accepted_length"]
  assert st["acceptance_rate"] == pytest.approx(sum(pr["accepted"]) / max(sum(pr["drafted"]), 1))


# ---------------------------------------------------------------------------------------------------
# Greedy exactness
# ---------------------------------------------------------------------------------------------------
FAMILIES = {"huginn:tiny": 0.05, "ouro:tiny": 0.02, "raven_llama:tiny": 0.05, "raven_olmo:tiny": 0.05}
DEFAULT_FAMILY = "huginn:tiny"


def check_draft_greedy(spec, contraction, gamma=2, prompts=PROMPTS, **kw):
  target = tiny_model(spec, contraction)
  want = helpers.ar_tokens(target, prompts, MAX_NEW, **kw)
  got = gen(target, prompts, method="draft", draft_model=shallow(target), gamma=gamma, **kw)
  assert got.tokens == want, (spec, contraction, got.stats)
  if gamma != "auto":
    assert_round_accounting(got, gamma)
  return got


def check_lookup_greedy(spec, contraction, gamma=3, **kw):
  target = tiny_model(spec, contraction)
  want = helpers.ar_tokens(target, REPEATS, MAX_NEW)
  got = gen(target, REPEATS, method="lookup", gamma=gamma, **kw)
  assert got.tokens == want, (spec, contraction, got.stats)
  if gamma != "auto":
    assert_round_accounting(got, gamma)
  return got


def test_draft_greedy_matches_ar_both_regimes():
  good = check_draft_greedy(DEFAULT_FAMILY, FAMILIES[DEFAULT_FAMILY])
  bad = check_draft_greedy(DEFAULT_FAMILY, None)
  assert good.stats["acceptance_rate"] > 0.6 and bad.stats["acceptance_rate"] < 0.4, (good.stats, bad.stats)
  assert good.stats["draft_cost_share"] > 0 and good.stats["alpha"] >= good.stats["acceptance_rate"]


def test_lookup_greedy_matches_ar():
  got = check_lookup_greedy(DEFAULT_FAMILY, FAMILIES[DEFAULT_FAMILY])
  assert got.stats["drafted"] > 0 and got.stats["draft_cost_share"] == 0.0, got.stats


@pytest.mark.slow
@pytest.mark.parametrize("spec", [s for s in FAMILIES if s != DEFAULT_FAMILY])
def test_greedy_matches_ar_every_family(spec):
  check_draft_greedy(spec, FAMILIES[spec])
  check_draft_greedy(spec, None)
  check_lookup_greedy(spec, FAMILIES[spec])


@pytest.mark.slow
def test_greedy_eos_and_random_init():
  """Requests stopping at different eos times, and Raven's random initial state (keyed per position as AR)."""
  target = tiny_model(DEFAULT_FAMILY, 0.05)
  helpers.eos_run(DEFAULT_FAMILY, 0.05, "lookup", gamma=3)
  # eos_run's cache needs hashable arguments (a LoopedModel is not): the same check for the draft model.
  eos = helpers.generate_cached(DEFAULT_FAMILY, 0.05, "ar", prompts=helpers.EOS_PROMPTS).tokens[1][4]
  want = helpers.generate_cached(DEFAULT_FAMILY, 0.05, "ar", prompts=helpers.EOS_PROMPTS, eos_id=eos).tokens
  got = gen(target, helpers.EOS_PROMPTS, method="draft", draft_model=shallow(target), gamma=2, eos_id=eos)
  assert got.tokens == want and len(set(map(len, want))) > 1, (got.tokens, want)
  check_draft_greedy(DEFAULT_FAMILY, 0.05, init_state="random")


def test_ngram_drafts():
  """The most recent match of the longest suffix wins; the copy continues periodically; no match: none."""
  toks = np.zeros((3, 16), np.int32)
  toks[0, :9] = [7, 1, 2, 9, 1, 2, 5, 1, 2]  # suffix (1, 2): latest match at 4 -> continuation starts at 6
  toks[1, :5] = [3, 4, 3, 4, 3]  # suffix (3, 4, 3) at 0 -> continuation 4, 3 then periodic
  toks[2, :3] = [1, 2, 3]  # no earlier occurrence of 3
  drafts, found = lookup.ngram_drafts(toks, np.array([9, 5, 3]), ngram=3, gamma=4)
  assert np.asarray(found).tolist() == [True, True, False]
  assert np.asarray(drafts)[0].tolist() == [5, 1, 2, 5]
  assert np.asarray(drafts)[1].tolist() == [4, 3, 4, 3]


def test_ngram_drafts_longest_suffix_beats_a_later_shorter_match():
  """The latest 1-token (and 2-token) match lies after the longest suffix's match and continues differently:
  the longest suffix must win (a shorter suffix overriding it gives another continuation)."""
  toks = np.zeros((2, 16), np.int32)
  # ngram 3: suffix (8, 1, 2) has no earlier match; (1, 2) matches at 0 -> continuation 7, 3, 2, 8; the
  # 1-token suffix (2) matches later, at 4 -> it would continue 8, 1, 2, 8.
  toks[0, :8] = [1, 2, 7, 3, 2, 8, 1, 2]
  # ngram 3: (4, 1, 2) matches at 0 -> 6, 3, 1, 2; (1, 2) and (2) match later, at 5 / 6 -> 9, 4, 1, 2.
  toks[1, :11] = [4, 1, 2, 6, 3, 1, 2, 9, 4, 1, 2]
  drafts, found = lookup.ngram_drafts(toks, np.array([8, 11]), ngram=3, gamma=4)
  assert np.asarray(found).tolist() == [True, True]
  assert np.asarray(drafts).tolist() == [[7, 3, 2, 8], [6, 3, 1, 2]]
  # The same rows at ngram 1: the latest 1-token match wins.
  drafts, _ = lookup.ngram_drafts(toks, np.array([8, 11]), ngram=1, gamma=4)
  assert np.asarray(drafts).tolist() == [[8, 1, 2, 8], [9, 4, 1, 2]]


@pytest.mark.slow  # ~18 s; the default suite checks the bundled drafter's tau (test_drafter_acceptance)
def test_draft_model_equal_to_the_target_has_every_greedy_draft_accepted():
  """A drafter that is an exact copy of the target (same weights and depth, a separate model object) drafts the
  target's argmax: every round commits gamma + 1 tokens but the last, which the budget cuts. Exact counts per
  request, so a drafter cache that goes stale (e.g. the re-run of position p0 - 1 after a fully accepted round
  not attending to itself) shows as a rejected draft even though the output stays exact."""
  target = tiny_model(DEFAULT_FAMILY, FAMILIES[DEFAULT_FAMILY])
  copy = dataclasses.replace(target, source="copy")
  gamma, n_new = 3, 14  # 14 = 3 * (gamma + 1) + 2: three full rounds, then a truncated one
  want = helpers.ar_tokens(target, PROMPTS, n_new)
  got = gen(target, PROMPTS, method="draft", draft_model=copy, gamma=gamma, max_new=n_new)
  assert got.tokens == want
  rounds = -(-n_new // (gamma + 1))
  pr = got.counts.per_request
  assert pr["tokens"] == [n_new] * len(PROMPTS)
  assert pr["rounds"] == [rounds] * len(PROMPTS), pr
  assert pr["accepted"] == [n_new - rounds] * len(PROMPTS), pr
  assert pr["drafted"] == pr["examined"] == pr["accepted"], pr
  assert got.stats["acceptance_rate"] == 1.0


# ---------------------------------------------------------------------------------------------------
# gamma="auto"
# ---------------------------------------------------------------------------------------------------
def test_auto_gamma_rule():
  """Past acceptance high -> long drafts; low -> 1; free drafts -> the compiled maximum."""
  num = np.array([0.0, 9.0, 0.0], np.float32)
  den = np.array([0.0, 9.5, 9.0], np.float32)  # prior only, ~95% accepted, none accepted
  g = np.asarray(adaptive.choose_gamma(num, den, 8, draft_cost=2.0, fixed_cost=66.0))
  assert g[1] == 8 and g[2] == 1 and 1 < g[0] < 8, g
  assert np.asarray(adaptive.choose_gamma(num, den, 8, draft_cost=0.0, fixed_cost=66.0)).tolist() == [8, 8, 8]
  a = np.linspace(0.0, 0.99, 12)
  assert np.allclose(adaptive.expected_tokens(a, 3), [sum(x**i for i in range(4)) for x in a], rtol=1e-5)


@pytest.fixture
def small_auto(monkeypatch):
  monkeypatch.setattr(adaptive, "AUTO_MAX_GAMMA", 3)  # a cheaper compile; the rule is the same


@pytest.mark.slow
def test_auto_gamma_greedy_matches_ar(small_auto):
  for contraction in (FAMILIES[DEFAULT_FAMILY], None):
    got = check_draft_greedy(DEFAULT_FAMILY, contraction, gamma="auto")
    assert got.stats["gamma"] == "auto" and got.stats["gamma_max"] == 3
  assert got.stats["mean_gamma"] < 2.0, got.stats  # a drafter that is always wrong is asked for little


@pytest.mark.slow
def test_auto_gamma_chain_and_lookup_greedy(small_auto):
  for contraction in (FAMILIES[DEFAULT_FAMILY], None):
    want = helpers.ar_tokens(tiny_model(DEFAULT_FAMILY, contraction), PROMPTS, MAX_NEW)
    got = gen(tiny_model(DEFAULT_FAMILY, contraction), PROMPTS, method="chain", d1=1, gamma="auto")
    assert got.tokens == want, got.stats
  check_lookup_greedy(DEFAULT_FAMILY, FAMILIES[DEFAULT_FAMILY], gamma="auto")


# ---------------------------------------------------------------------------------------------------
# Sampled exactness (chi-square) with a drafter that disagrees often
# ---------------------------------------------------------------------------------------------------
VOCAB = 8
PROMPT = [1, 2, 3, 4, 5]
BATCH = 3000
ALPHA = 1e-3


def small_target():
  return tiny_model("raven_llama:tiny", 0.05, seed=0, vocab_size=VOCAB)


def wrong_drafter():
  """Random R = 1 weights of another family: TV to the target's distribution is large."""
  return tiny_model("ouro:tiny", None, seed=7, vocab_size=VOCAB, recurrence=1)


# (name, generate kwargs, temperature, top_k, top_p, n_tokens, seed)
FAST = [("draft_T1", dict(method="draft", gamma=2), 1.0, 0, 1.0, 2, 31)]  # 2 tokens: 1 draft + residual / bonus
SLOW = [
    ("draft_T1_3tokens", dict(method="draft", gamma=2), 1.0, 0, 1.0, 3, 36),
    ("draft_topk_topp", dict(method="draft", gamma=3), 0.8, 5, 0.9, 3, 32),
    ("lookup_T1", dict(method="lookup", gamma=2, ngram=2), 1.0, 0, 1.0, 3, 33),
    ("draft_auto", dict(method="draft", gamma="auto"), 1.0, 0, 1.0, 3, 34),
    ("chain_auto", dict(method="chain", d1=2, gamma="auto"), 1.0, 0, 0.8, 3, 35),
]


def run_sampled(case):
  name, kw, temperature, top_k, top_p, n_tokens, seed = case
  kw = dict(kw)
  if kw["method"] == "draft":
    kw["draft_model"] = wrong_drafter()
  res = gen(
      small_target(),
      [PROMPT] * BATCH,
      max_new=n_tokens,
      temperature=temperature,
      top_k=top_k,
      top_p=top_p,
      seed=seed,
      **kw,
  )
  toks = np.asarray(res.tokens, np.int64)
  counts = np.zeros((VOCAB,) * n_tokens, np.int64)
  np.add.at(counts, tuple(toks.T), 1)
  exact = helpers.exact_sequence_distribution(small_target(), PROMPT, n_tokens, temperature, top_k, top_p)
  p = helpers.chi2_pvalue(counts, exact)
  print(
      f"  {name}: p={p:.4g} acceptance={res.stats['acceptance_rate']:.3f} tokens/pass={res.stats['tokens_per_round']:.3f}"
  )
  assert p > ALPHA, (name, p, res.stats)
  return res, counts


@pytest.mark.slow  # ~30 s; a draft chain verifies with the chain rule, which test_lossless_sampling checks by default
@pytest.mark.parametrize("case", FAST, ids=[c[0] for c in FAST])
def test_sampled_distribution_is_exact(case):
  res, counts = run_sampled(case)
  name, kw, temperature, top_k, top_p, n_tokens, _ = case
  assert res.stats["alpha"] < 0.7, res.stats  # the drafter disagrees often
  # Power: the same samples reject the drafter's own distribution.
  wrong = helpers.exact_sequence_distribution(wrong_drafter(), PROMPT, n_tokens, temperature, top_k, top_p)
  assert helpers.chi2_pvalue(counts, wrong, check_support=False) < 1e-8


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=[c[0] for c in SLOW])
def test_sampled_distribution_is_exact_slow(case, monkeypatch):
  monkeypatch.setattr(adaptive, "AUTO_MAX_GAMMA", 3)
  run_sampled(case)


@pytest.mark.slow
def test_tokens_per_pass_match_theory():
  """Sampled tokens per verify pass agree with (1 - a^(gamma+1)) / (1 - a) at the measured a (accepted /
  examined drafts) within 5%, for a drafter of middling acceptance (the target itself at depth 1)."""
  gamma = 3
  target = tiny_model(DEFAULT_FAMILY, 0.5)
  res = gen(target, PROMPTS * 40, max_new=24, method="draft", draft_model=shallow(target), gamma=gamma, temperature=1.0)
  st = res.stats
  a = st["alpha"]
  predicted = float(adaptive.expected_tokens(a, gamma))
  print(f"  a={a:.3f} tokens/pass={st['tokens_per_round']:.3f} predicted={predicted:.3f} rounds={st['rounds']}")
  assert 0.2 < a < 0.95, st
  assert st["tokens_per_round"] == pytest.approx(predicted, rel=0.05), (a, st["tokens_per_round"], predicted)


# ---------------------------------------------------------------------------------------------------
# Validation and compilation
# ---------------------------------------------------------------------------------------------------
ENTRY_POINTS = [(common, "prefill_state"), (draft, "decode_loop"), (draft, "initial_state"), (lookup, "decode_loop")]


def _renamed_tokenizer():
  """The tiny-raven tokenizer with two vocabulary entries swapped: same size, other tokens."""
  tok = helpers.tokenized_model().tokenizer
  d = json.loads(tok.to_str())
  vocab = d["model"]["vocab"]
  a, b = sorted(vocab, key=vocab.get)[300:302]
  vocab[a], vocab[b] = vocab[b], vocab[a]
  return Tokenizer.from_str(json.dumps(d))


def test_mismatched_drafter_is_refused():
  target = tiny_model(DEFAULT_FAMILY)
  base = dict(prompts=[[1, 2, 3]], max_new_tokens=4, method="draft", gamma=2)
  other_vocab = tiny_model("ouro:tiny", vocab_size=32, recurrence=1)
  helpers.assert_rejected_before_compiling(target, dict(base, draft_model=other_vocab), "vocabulary", ENTRY_POINTS)
  tok_target = helpers.tokenized_model()
  same = shallow(tok_target)
  renamed = dataclasses.replace(same, tokenizer=_renamed_tokenizer())
  helpers.assert_rejected_before_compiling(tok_target, dict(base, draft_model=renamed), "tokenizer", ENTRY_POINTS)
  untokenized = dataclasses.replace(same, tokenizer=None)
  helpers.assert_rejected_before_compiling(tok_target, dict(base, draft_model=untokenized), "tokenizer", ENTRY_POINTS)
  short = dataclasses.replace(shallow(target), config=shallow(target).config.replace(max_len=32))
  helpers.assert_rejected_before_compiling(target, dict(base, draft_model=short), "context", ENTRY_POINTS)
  draft.check_compatible(tok_target, same)  # the same tokenizer passes


@pytest.mark.parametrize(
    "args, match",
    [
        (dict(method="draft", gamma=2), "draft_model"),
        (dict(method="draft", draft_model=1, gamma=2), "LoopedModel"),
        (dict(method="draft", draft_model="tiny-raven-draft", gamma=2), "vocabulary"),  # a name is loaded
        (dict(method="lookup", gamma=0), "gamma"),
        (dict(method="lookup", gamma="fast"), "gamma"),
        (dict(method="lookup", gamma=2, ngram=0), "ngram"),
        (dict(method="lookup", gamma=2, d1=1), "takes no d1"),
        (dict(method="chain", d1=1, gamma=2, ngram=2), "takes no ngram"),
        (dict(method="ar", draft_model=1), "takes no draft_model"),
    ],
)
def test_bad_arguments_rejected_before_compiling(args, match):
  model = tiny_model(DEFAULT_FAMILY)
  helpers.assert_rejected_before_compiling(model, dict(prompts=[[1, 2]], max_new_tokens=4, **args), match, ENTRY_POINTS)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft", "lookup"])
def test_one_trace_per_configuration(method):
  model = tiny_model(DEFAULT_FAMILY, 0.05)
  if method == "draft":
    kw, entries = dict(draft_model=shallow(model), gamma=2), [(draft, "initial_state"), (draft, "decode_loop")]
  else:
    kw, entries = dict(gamma=2), [(lookup, "initial_state"), (lookup, "decode_loop")]
  runs = helpers.sampling_runs(model, method, dict(kw, temperature=1.0), entries)
  assert runs["cache_sizes"] == (1, 1), runs["cache_sizes"]
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)


@pytest.mark.slow
def test_bundled_draft_model():
  """tiny-raven-draft loads by name, shares tiny-raven's tokenizer, and decodes it exactly (greedy)."""
  target, drafter = api.load("tiny-raven"), api.load("tiny-raven-draft")
  assert drafter.config.vocab_size == target.config.vocab_size and drafter.config.recurrence == 1
  draft.check_compatible(target, drafter)
  ids = target.encode("ROMEO:\nWhat say you")
  want = helpers.ar_tokens(target, [ids], 24)
  got = gen(target, [ids], max_new=24, method="draft", draft_model=drafter, gamma=4)
  assert got.tokens == want, got.stats
  assert got.stats["acceptance_rate"] > 0.3, got.stats
