"""Chain self-speculation (`generate(..., method='chain', d1=, gamma=)`): exactness against full-depth AR
decoding, its round accounting, one trace per configuration, validation, and seeded sampling.

As in test_loopspec.py, compiled programs are shared on purpose: the random-weight and the contractive model
of a config run the same compiled AR and chain programs (parameters are traced), every batch has 3 requests
in the (16, 32) length bucket, and results are cached. Each family uses a different (d1, gamma), so the
default run covers gamma = 1, 2, 3 and d1 = 1, 2 at a small (gamma + 1) * d1 (the drafting steps are
unrolled, so compile time grows with it); more (d1, gamma) per family and the HF fixtures are marked slow.
"""
import functools
import importlib
import math
import os
import sys
from unittest import mock

import chex
import jax
import numpy as np
import pytest

# Let `.venv/bin/pytest` import the package (and configs/) from a bare checkout.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

import loopspec_jax  # noqa: E402
from loopspec_jax import api  # noqa: E402
from loopspec_jax import autoregressive as ar  # noqa: E402
from loopspec_jax import chain  # noqa: E402
from loopspec_jax import config as config_lib  # noqa: E402

FIXTURES = os.path.join(_ROOT, "tests", "fixtures")

# The same batch as test_loopspec.py (3, 7 and 5 tokens): the AR programs are shared within a session.
PROMPTS = ((1, 2, 3), (5, 6, 7, 8, 9, 10, 11), (40, 41, 42, 43, 44))
MAX_NEW = 12

# Per family: (d1, gamma) of the default test and a `contraction` that makes drafts mostly accepted.
FAMILIES = {
    "tiny_ouro": dict(chain=(1, 3), contraction=0.02),  # R = 4
    "tiny_huginn": dict(chain=(1, 2), contraction=0.05),  # R = 8
    "tiny_raven_llama": dict(chain=(2, 1), contraction=0.05),  # R = 8
    "tiny_raven_olmo": dict(chain=(1, 1), contraction=0.05),  # R = 8
}
EXTRA = {  # slow
    "tiny_ouro": ((2, 1), (1, 5)),
    "tiny_huginn": ((2, 2), (4, 1)),
    "tiny_raven_llama": ((1, 3), (2, 4)),
    "tiny_raven_olmo": ((2, 3), (1, 4)),
}


def load_config(name, **overrides):
  cfg = config_lib.from_config_dict(importlib.import_module(f"configs.models.{name}").get_config())
  return cfg.replace(**overrides) if overrides else cfg


@functools.lru_cache(maxsize=None)
def tiny_model(name, contraction=None):
  return api.from_config(load_config(name), seed=0, contraction=contraction)


@functools.lru_cache(maxsize=None)
def run(name, contraction, method, prompts=PROMPTS, max_new=MAX_NEW, **kw):
  """generate() on a tiny model, cached: several tests read the same run (the result is never mutated)."""
  return loopspec_jax.generate(tiny_model(name, contraction), [list(p) for p in prompts], max_new_tokens=max_new,
                               method=method, **kw)


def assert_round_accounting(res, gamma, n_requests):
  """Each verify round commits its accepted drafts plus one token from p_R (residual or bonus), except that
  a request's last round may be cut at the token budget; the summary statistics follow from the counts."""
  st = res.stats
  n = st["tokens_generated"]
  acc, rounds = st["commits"]["first"], st["rounds"]
  assert n == sum(len(t) for t in res.tokens)
  assert st["commits"]["first"] + st["commits"]["restart"] == n and st["commits"]["second"] == 0
  assert rounds - n_requests <= n - acc <= rounds, st
  assert 0 <= acc <= rounds * gamma
  # At most gamma + 1 tokens per round per request.
  assert rounds >= sum(math.ceil(len(t) / (gamma + 1)) for t in res.tokens)
  assert st["mean_accepted_length"] == pytest.approx(n / rounds, rel=1e-12)
  assert st["acceptance_rate"] == pytest.approx(acc / (rounds * gamma), rel=1e-12)
  assert 1.0 <= st["mean_accepted_length"] <= gamma + 1


def check_exact(name, contraction, d1, gamma, **kw):
  want = run(name, contraction, "ar", **kw)
  got = run(name, contraction, "chain", d1=d1, gamma=gamma, **kw)
  assert got.tokens == want.tokens, f"{name} contraction={contraction} (d1, gamma)=({d1}, {gamma}) {got.stats}"
  assert_round_accounting(got, gamma, len(PROMPTS))
  return got


# ---------------------------------------------------------------------------------------------------
# Greedy exactness, both acceptance regimes, all four families
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_matches_ar_in_both_regimes(name):
  d1, gamma = FAMILIES[name]["chain"]
  rnd = check_exact(name, None, d1, gamma)
  assert all(len(t) == MAX_NEW for t in rnd.tokens)
  assert rnd.stats["acceptance_rate"] < 0.3, rnd.stats  # random weights: drafts mostly rejected
  con = check_exact(name, FAMILIES[name]["contraction"], d1, gamma)
  assert con.stats["acceptance_rate"] > 0.6, con.stats  # converging depths: drafts mostly accepted
  assert con.stats["mean_accepted_length"] > rnd.stats["mean_accepted_length"]


def test_no_rejection_commits_gamma_plus_one_per_round():
  """contraction=0: every depth reads out the same distribution, so every draft is accepted and each round
  commits gamma + 1 tokens (the last round of a request is cut at the budget)."""
  name = "tiny_huginn"
  d1, gamma = FAMILIES[name]["chain"]
  res = check_exact(name, 0.0, d1, gamma)
  assert res.stats["rounds"] == len(PROMPTS) * math.ceil(MAX_NEW / (gamma + 1))
  # MAX_NEW = 12 is a multiple of gamma + 1 = 3: every round has gamma accepted drafts and one bonus token.
  assert MAX_NEW % (gamma + 1) == 0 and res.stats["acceptance_rate"] == 1.0
  assert res.stats["mean_accepted_length"] == gamma + 1


# Same batch size and bucket as PROMPTS (the same compiled programs), with a one-token prompt.
EOS_PROMPTS = ((7,), (5, 6, 7, 8, 9, 10, 11), (40, 41, 42, 43, 44))


@pytest.mark.parametrize("contraction", [None, FAMILIES["tiny_ouro"]["contraction"]])
def test_eos_stops_requests_at_different_rounds(contraction):
  """eos is a traced value: a round commits up to the first eos (drafts after it are dropped), the request
  stops while the others go on, and every request's tokens are still AR's."""
  name = "tiny_ouro"
  d1, gamma = FAMILIES[name]["chain"]
  free = run(name, contraction, "ar", prompts=EOS_PROMPTS)
  eos = free.tokens[1][4]
  want = run(name, contraction, "ar", prompts=EOS_PROMPTS, eos_id=eos)
  for full, cut in zip(free.tokens, want.tokens):
    assert cut == (full[:full.index(eos) + 1] if eos in full else full)
  assert len(set(len(t) for t in want.tokens)) > 1, want.tokens  # the requests stop at different times
  got = run(name, contraction, "chain", prompts=EOS_PROMPTS, eos_id=eos, d1=d1, gamma=gamma)
  assert got.tokens == want.tokens, got.stats
  assert_round_accounting(got, gamma, len(EOS_PROMPTS))


# ---------------------------------------------------------------------------------------------------
# Sampling: one trace for every call of a configuration, seeded reproducibility, batch independence
# ---------------------------------------------------------------------------------------------------
SAMPLING = dict(temperature=0.8, top_p=0.9, d1=1, gamma=2)


@functools.lru_cache(maxsize=None)
def sampling_runs():
  """Four sampling calls of one chain configuration under fresh jits of its programs.

  `ar.prefill_state` and `chain.decode_loop` are swapped (undone on exit) for fresh jits of the same
  undecorated functions wrapped in `chex.assert_max_traces(n=1)`: the wrapper counts Python executions of the
  body, which happen only while jax traces, so a retrace raises; the fresh jits start with empty caches, so
  `_cache_size()` counts exactly the programs these calls compiled, whatever other tests compiled before. The
  calls differ in prompts, prompt lengths, seed and request ids but share batch size and length bucket.
  """
  chex.clear_trace_counter()
  model = tiny_model("tiny_ouro", 0.05)
  prefill = jax.jit(chex.assert_max_traces(ar.prefill_state.__wrapped__, n=1),
                    static_argnames=("cfg", "readout_depths", "total_len", "random_init"))
  decode = jax.jit(chex.assert_max_traces(chain.decode_loop.__wrapped__, n=1),
                   static_argnames=("cfg", "d1", "gamma", "greedy", "random_init"), donate_argnames=("state",))
  gen = lambda prompts, **kw: loopspec_jax.generate(model, [list(p) for p in prompts], max_new_tokens=MAX_NEW,
                                                    method="chain", **SAMPLING, **kw)
  other = ((9, 8, 7, 6, 5, 4), (30, 31))
  with mock.patch.object(ar, "prefill_state", prefill), mock.patch.object(chain, "decode_loop", decode):
    out = {
        "a": gen(PROMPTS, seed=0),
        "again": gen(PROMPTS, seed=0),
        # PROMPTS[0] again, as request id 0, now at batch index 1 among other requests (ids 7 and 9).
        "moved": gen((other[0], PROMPTS[0], other[1]), seed=0, request_ids=[7, 0, 9]),
        "seed1": gen(PROMPTS, seed=1),
    }
    out["cache_sizes"] = (prefill._cache_size(), decode._cache_size())
  return out


def test_one_trace_per_configuration():
  # prefill and decode loop: each compiled exactly once for the four calls.
  assert sampling_runs()["cache_sizes"] == (1, 1)


def test_sampling_is_reproducible_and_batch_independent():
  runs = sampling_runs()
  a = runs["a"]
  assert a.tokens == runs["again"].tokens
  assert runs["moved"].tokens[1] == a.tokens[0]
  assert runs["seed1"].tokens != a.tokens
  for key in ("a", "moved", "seed1"):
    assert_round_accounting(runs[key], SAMPLING["gamma"], len(PROMPTS))
  assert all(len(t) == MAX_NEW for t in a.tokens)
  assert all(0 <= t < 64 for toks in a.tokens for t in toks)
  rates = [runs[k].stats["acceptance_rate"] for k in ("a", "moved", "seed1")]
  assert 0 < min(rates) and max(rates) < 1, rates  # both accepted and rejected drafts occur


# ---------------------------------------------------------------------------------------------------
# Invalid configurations are rejected before anything compiles
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    (dict(gamma=0), r"gamma >= 1, got 0"),
    (dict(gamma=-2), r"gamma >= 1, got -2"),
    (dict(gamma=None), r"gamma >= 1, got None"),
    (dict(gamma=1.5), r"gamma >= 1, got 1.5"),
    (dict(d1=8), r"draft depth 1 <= d1 < R=8, got 8"),
    (dict(d1=9), r"draft depth 1 <= d1 < R=8, got 9"),
    (dict(d1=0), r"draft depth 1 <= d1 < R=8, got 0"),
    (dict(d1=None), r"draft depth 1 <= d1 < R=8, got None"),
    (dict(prompts=[[1, 64]]), r"token id 64 outside the vocabulary \[0, 64\)"),
    (dict(prompts=[list(range(60))]), r"exceeds the context of 64 positions"),
])
def test_invalid_configurations_rejected_before_compiling(kwargs, match):
  model = tiny_model("tiny_raven_llama")  # R = 8, V = 64, context 64
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=MAX_NEW, method="chain", d1=2, gamma=2)
  args.update(kwargs)
  never = mock.Mock(side_effect=AssertionError("validation let a bad request reach a compiled program"))
  with mock.patch.object(ar, "prefill_state", never), mock.patch.object(chain, "decode_loop", never):
    with pytest.raises(ValueError, match=match):
      loopspec_jax.generate(model, **args)
  never.assert_not_called()


# ---------------------------------------------------------------------------------------------------
# Slow: more (d1, gamma) per family, the HF fixtures
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name,setting", [(n, s) for n, ss in EXTRA.items() for s in ss])
def test_more_gammas_match_ar(name, setting):
  for contraction in (None, FAMILIES[name]["contraction"]):
    check_exact(name, contraction, *setting)


@pytest.mark.slow
@pytest.mark.parametrize("name,settings", [("huginn_tiny", ((2, 2), (1, 4))), ("ouro_tiny", ((1, 3), (2, 1)))])
def test_hf_fixtures_match_oracle_and_ar(name, settings):
  model = loopspec_jax.load(os.path.join(FIXTURES, name))
  with np.load(os.path.join(FIXTURES, name, "oracle.npz")) as f:
    prompt, oracle = f["input_ids"].tolist(), f["greedy_tokens"].tolist()
  prompts = [prompt, prompt[3:8]]
  want = loopspec_jax.generate(model, prompts, max_new_tokens=len(oracle), method="ar")
  assert want.tokens[0] == oracle
  for d1, gamma in settings:
    got = loopspec_jax.generate(model, prompts, max_new_tokens=len(oracle), method="chain", d1=d1, gamma=gamma)
    assert got.tokens == want.tokens, (name, d1, gamma, got.stats)
    assert_round_accounting(got, gamma, len(prompts))
