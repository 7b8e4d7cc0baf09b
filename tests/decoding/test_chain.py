"""Chain self-speculation (`generate(..., method='chain', d1=, gamma=)`): exactness against full-depth AR
decoding, its round accounting, one trace per configuration, validation, and seeded sampling.

As in test_loopspec.py, compiled programs are shared on purpose: the random-weight and the contractive model
of a config run the same compiled AR and chain programs (parameters are traced), every batch has 3 requests
in the (16, 32) length bucket, and results are cached. Each family uses a different (d1, gamma), so the
default run covers gamma = 1, 2, 3 and d1 = 1, 2 at a small (gamma + 1) * d1 (the drafting steps are
unrolled, so compile time grows with it); more (d1, gamma) per family and the HF fixtures are marked slow.
"""

import math

import pytest

import helpers
import loopspec_jax
from helpers import MAX_NEW, PROMPTS, tiny_model
from loopspec_jax.decoding import chain
from loopspec_jax.decoding import common

# Per family: (d1, gamma) of the default test and a `contraction` that makes drafts mostly accepted.
FAMILIES = {
    "ouro:tiny": dict(chain=(1, 3), contraction=0.02),  # R = 4
    "huginn:tiny": dict(chain=(1, 2), contraction=0.05),  # R = 8
    "raven_llama:tiny": dict(chain=(2, 1), contraction=0.05),  # R = 8
    "raven_olmo:tiny": dict(chain=(1, 1), contraction=0.05),  # R = 8
}
EXTRA = {  # slow
    "ouro:tiny": ((2, 1), (1, 5)),
    "huginn:tiny": ((2, 2), (4, 1)),
    "raven_llama:tiny": ((1, 3), (2, 4)),
    "raven_olmo:tiny": ((2, 3), (1, 4)),
}


run = helpers.generate_cached  # generate() on a tiny model, cached: several tests read one run


def assert_round_accounting(res, r, d1, gamma):
  """Per request, every verify round commits its accepted drafts and then exactly one token drawn from p_R
  (residual or bonus), except a last round cut by the budget or eos right after an accepted draft; a draft
  counts as accepted only if it was committed. The summary statistics follow from the per-request counts.

  (`commits` is derived from `accepted`, so only the per-request counters can expose a wrong count: e.g. a
  last round counting drafts past the token budget leaves fewer than rounds - 1 tokens from p_R.)
  """
  st = res.stats
  pr = st["per_request"]
  for i, toks in enumerate(res.tokens):
    n, acc, rounds = len(toks), pr["accepted"][i], pr["rounds"][i]
    assert 0 <= acc <= gamma * rounds and rounds >= 1, (i, pr)
    assert n - acc in (rounds, rounds - 1), f"request {i}: {n} tokens, {acc} accepted drafts, {rounds} rounds"
    assert rounds >= math.ceil(n / (gamma + 1)), (i, pr)
  n, acc, rounds = st["tokens_generated"], sum(pr["accepted"]), sum(pr["rounds"])
  assert n == sum(len(t) for t in res.tokens)
  assert st["commits"] == {"first": acc, "second": 0, "restart": n - acc}, st["commits"]
  assert st["rounds"] == rounds and st["ticks"] == max(pr["rounds"])
  assert st["tokens_per_round"] == pytest.approx(n / rounds, rel=1e-12)
  assert st["acceptance_rate"] == pytest.approx(acc / (rounds * gamma), rel=1e-12)
  # Mean accepted length on LoopSpec's scale: tokens per R sequential recurrent steps.
  assert st["mean_accepted_length"] == pytest.approx(r * n / (rounds * ((gamma + 1) * d1 + r - d1)), rel=1e-12)


def check_exact(name, contraction, d1, gamma, **kw):
  want = run(name, contraction, "ar", **kw)
  got = run(name, contraction, "chain", d1=d1, gamma=gamma, **kw)
  assert got.tokens == want.tokens, f"{name} contraction={contraction} (d1, gamma)=({d1}, {gamma}) {got.stats}"
  assert_round_accounting(got, tiny_model(name).config.recurrence, d1, gamma)
  return got


# ---------------------------------------------------------------------------------------------------
# Greedy exactness, both acceptance regimes, all four families
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [n if n in ("huginn:tiny", "ouro:tiny") else pytest.param(n, marks=pytest.mark.slow) for n in FAMILIES],
)
def test_greedy_matches_ar_in_both_regimes(name):
  d1, gamma = FAMILIES[name]["chain"]
  rnd = check_exact(name, None, d1, gamma)
  assert all(len(t) == MAX_NEW for t in rnd.tokens)
  assert rnd.stats["acceptance_rate"] < 0.3, rnd.stats  # random weights: drafts mostly rejected
  con = check_exact(name, FAMILIES[name]["contraction"], d1, gamma)
  assert con.stats["acceptance_rate"] > 0.6, con.stats  # converging depths: drafts mostly accepted
  assert con.stats["mean_accepted_length"] > rnd.stats["mean_accepted_length"]


@pytest.mark.parametrize("max_new", [MAX_NEW, MAX_NEW + 1, MAX_NEW + 2])
def test_no_rejection_commits_gamma_plus_one_per_round(max_new):
  """contraction=0: every depth reads out the same distribution, so every draft is accepted and each round
  commits gamma + 1 tokens; the last round of a request is cut at the budget, and only its committed drafts
  count as accepted. Budgets 13 and 14 are not multiples of gamma + 1 = 3 (same compiled programs as 12)."""
  name = "huginn:tiny"
  d1, gamma = FAMILIES[name]["chain"]
  r = tiny_model(name).config.recurrence
  res = check_exact(name, 0.0, d1, gamma, max_new=max_new)
  full, rem = divmod(max_new, gamma + 1)
  rounds = full + (rem > 0)
  accepted = full * gamma + rem  # a cut last round commits rem <= gamma drafts, all accepted
  pr = res.stats["per_request"]
  assert pr["rounds"] == [rounds] * len(PROMPTS) and pr["accepted"] == [accepted] * len(PROMPTS), pr
  assert res.stats["acceptance_rate"] == pytest.approx(accepted / (rounds * gamma))
  assert res.stats["tokens_per_round"] == pytest.approx(max_new / rounds)
  if rem == 0:
    assert res.stats["tokens_per_round"] == gamma + 1
    assert res.stats["mean_accepted_length"] == pytest.approx(r * (gamma + 1) / ((gamma + 1) * d1 + r - d1))


@pytest.mark.parametrize("contraction", [None, FAMILIES["ouro:tiny"]["contraction"]])
def test_eos_stops_requests_at_different_rounds(contraction):
  """eos is a traced value: a round commits up to the first eos (drafts after it are dropped), the request
  stops while the others go on, and every request's tokens are still AR's."""
  name = "ouro:tiny"
  d1, gamma = FAMILIES[name]["chain"]
  got = helpers.eos_run(name, contraction, "chain", d1=d1, gamma=gamma)
  assert_round_accounting(got, tiny_model(name).config.recurrence, d1, gamma)


# ---------------------------------------------------------------------------------------------------
# Sampling: one trace for every call of a configuration, seeded reproducibility, batch independence
# ---------------------------------------------------------------------------------------------------
SAMPLING = dict(temperature=0.8, top_p=0.9, d1=1, gamma=2)


def test_sampling_traces_once_and_is_seeded_and_batch_independent():
  """Four sampling calls of one chain configuration (see `helpers.sampling_runs`)."""
  runs = helpers.sampling_runs(
      tiny_model("ouro:tiny", 0.05), "chain", SAMPLING, [(common, "prefill_state"), (chain, "decode_loop")]
  )
  assert runs["cache_sizes"] == (1, 1)  # prefill and decode loop: each compiled exactly once
  helpers.assert_seeded_and_batch_independent(runs, 64)
  rates = [runs[k].stats["acceptance_rate"] for k in ("a", "moved", "seed1")]
  assert 0 < min(rates) and max(rates) < 1, rates  # both accepted and rejected drafts occur
  for key in ("a", "moved", "seed1"):
    assert_round_accounting(runs[key], 4, SAMPLING["d1"], SAMPLING["gamma"])


# ---------------------------------------------------------------------------------------------------
# Invalid configurations are rejected before anything compiles
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(gamma=0), r"gamma >= 1, got 0"),
        (dict(gamma=-2), r"gamma >= 1, got -2"),
        (dict(gamma=1.5), r"gamma >= 1, got 1.5"),
        (dict(d1=8), r"draft depth 1 <= d1 < R=8, got 8"),
        (dict(d1=9), r"draft depth 1 <= d1 < R=8, got 9"),
        (dict(d1=0), r"draft depth 1 <= d1 < R=8, got 0"),
        (dict(prompts=[[1, 64]]), r"token id 64 outside the vocabulary \[0, 64\)"),
        (dict(prompts=[list(range(60))]), r"exceeds the context of 64 positions"),
    ],
)
def test_invalid_configurations_rejected_before_compiling(kwargs, match):
  model = tiny_model("raven_llama:tiny")  # R = 8, V = 64, context 64
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=MAX_NEW, method="chain", d1=2, gamma=2)
  args.update(kwargs)
  helpers.assert_rejected_before_compiling(model, args, match, [(common, "prefill_state"), (chain, "decode_loop")])


# ---------------------------------------------------------------------------------------------------
# Slow: more (d1, gamma) per family, the HF fixtures
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "name,setting,contraction",
    [(n, s, c) for n, ss in EXTRA.items() for s in ss for c in (None, FAMILIES[n]["contraction"])],
)
def test_more_gammas_match_ar(name, setting, contraction):
  check_exact(name, contraction, *setting)


@pytest.mark.slow
@pytest.mark.parametrize("name,settings", [("huginn_tiny", ((2, 2), (1, 4))), ("ouro_tiny", ((1, 3), (2, 1)))])
def test_hf_fixtures_match_oracle_and_ar(name, settings):
  model, prompts, oracle = helpers.fixture_batch(name)
  want = loopspec_jax.generate(model, prompts, max_new_tokens=len(oracle), method="ar")
  assert want.tokens[0] == oracle
  for d1, gamma in settings:
    got = loopspec_jax.generate(model, prompts, max_new_tokens=len(oracle), method="chain", d1=d1, gamma=gamma)
    assert got.tokens == want.tokens, (name, d1, gamma, got.stats)
    assert_round_accounting(got, model.config.recurrence, d1, gamma)
