"""Acceptance is exact too: under greedy decoding, where each commit comes from is fixed by the model.

Token equality cannot see a wrong draft path (a depth-d1 draft reading the wrong cache slot or the depth-R coda
cache stays lossless, since verification at R repairs it; only acceptance moves). But with greedy decoding the
source of every commit is a function of the per-depth readouts along the autoregressive continuation: for the
token following position p, LoopSpec commits from its first-proposal child iff argmax p_d1 == argmax p_R at p,
else from its second-proposal child iff d2 is set and argmax p_d2 == argmax p_R, else it restarts (given that
no spawn is skipped: the lane capacity here is generous and `skipped_spawns == 0` is asserted). Chain accepts
drafts while argmax p_d1 == argmax p_R, gamma per round, cut at the budget. `helpers.loopspec_sources` and
`helpers.chain_counts` compute these predictions from ONE full-sequence forward (`loopspec_jax.readouts`), and
the engines' per-request counters must equal them exactly.

Models: every family at contraction 0.6, where readouts at shallow depths agree with depth R on some positions
and not on others, so first, second and restart commits all occur (asserted). 20 new tokens per request.
Any new decoder (draft model, lookup, serving engine) should get the same check.
"""

import numpy as np
import pytest

import helpers
from helpers import PROMPTS, tiny_model

CONTRACTION = 0.6
N_NEW = 20  # with PROMPTS: the (16, 32) length bucket
# (spec, d1, d2): per family one two-proposal pair (the single proposal for two); more pairs are slow. Pairs with
# d2 >= R/2 (or d1 > 1) keep second-proposal branches from nesting, so a bounded capacity skips no spawn.
LOOPSPEC = [
    ("huginn:tiny", 2, 4),
]
LOOPSPEC_SLOW = [
    ("huginn:tiny", 2, None),
    ("ouro:tiny", 1, 2),
    ("ouro:tiny", 2, None),
    ("raven_llama:tiny", 2, 6),
    ("raven_olmo:tiny", 1, 4),
    ("ouro:tiny", 1, 3),
    ("huginn:tiny", 1, 4),
    ("raven_llama:tiny", 1, 6),
    ("raven_olmo:tiny", 2, 4),
    ("raven_llama:tiny", 4, None),
    ("raven_olmo:tiny", 1, None),
]
# (spec, d1, gamma)
CHAIN = [("ouro:tiny", 1, 3)]
CHAIN_SLOW = [
    ("huginn:tiny", 2, 2),
    ("raven_llama:tiny", 1, 4),
    ("raven_olmo:tiny", 2, 3),
    ("ouro:tiny", 2, 1),
    ("huginn:tiny", 1, 5),
    ("raven_llama:tiny", 4, 2),
    ("raven_olmo:tiny", 1, 2),
]


def ar_reference(spec):
  return helpers.generate_cached(spec, CONTRACTION, "ar", max_new=N_NEW)


def check_loopspec(spec, d1, d2, default_capacity=False):
  model = tiny_model(spec, CONTRACTION)
  r = model.config.recurrence
  # Room for the R/d1 + 1 pipeline lanes, each with a second-proposal subtree of up to (R - d2)/d1 + 1 lanes;
  # or the default table (at R <= 8 the schedule's worst case, `state.stage_width`).
  cap = None if default_capacity else (r // d1 + 1) * (1 if d2 is None else (r - d2) // d1 + 2)
  got = helpers.generate_cached(spec, CONTRACTION, "loopspec", max_new=N_NEW, d1=d1, d2=d2, lane_capacity=cap)
  want = ar_reference(spec)
  assert got.tokens == want.tokens, got.stats["commits"]
  assert got.stats["skipped_spawns"] == 0, got.stats
  pr = got.stats["per_request"]
  totals = {"first": 0, "second": 0, "restart": 0}
  for i, (prompt, toks) in enumerate(zip(PROMPTS, want.tokens)):
    pred = helpers.loopspec_sources(model, prompt, toks, d1, d2)
    engine = {k: pr[k][i] for k in ("first", "second", "restart", "last_source")}
    assert engine == {k: pred[k] for k in engine}, f"request {i}: engine {engine}, readouts {pred}"
    for k in totals:
      totals[k] += pred[k]
  assert got.stats["commits"] == totals
  # The check bites: the sources are mixed.
  assert totals["first"] > 0 and totals["restart"] > 0 and (d2 is None or totals["second"] > 0), totals


def check_chain(spec, d1, gamma):
  model = tiny_model(spec, CONTRACTION)
  got = helpers.generate_cached(spec, CONTRACTION, "chain", max_new=N_NEW, d1=d1, gamma=gamma)
  want = ar_reference(spec)
  assert got.tokens == want.tokens, got.stats
  pr = got.stats["per_request"]
  for i, (prompt, toks) in enumerate(zip(PROMPTS, want.tokens)):
    accepted, rounds = helpers.chain_counts(model, prompt, toks, d1, gamma)
    assert (pr["accepted"][i], pr["rounds"][i]) == (
        accepted,
        rounds,
    ), f"request {i}: engine accepted/rounds {(pr['accepted'][i], pr['rounds'][i])}, readouts {(accepted, rounds)}"
  rate = got.stats["acceptance_rate"]
  assert 0 < rate < 1, rate


def with_slow(fast, slow):
  return fast + [pytest.param(*case, marks=pytest.mark.slow) for case in slow]


@pytest.mark.parametrize("spec,d1,d2", with_slow(LOOPSPEC, LOOPSPEC_SLOW))
def test_loopspec_commit_sources_equal_readout_prediction(spec, d1, d2):
  check_loopspec(spec, d1, d2)


@pytest.mark.parametrize(
    "spec,d1,d2",
    [("ouro:tiny", 1, 2)]
    + [pytest.param(n, 1, d2, marks=pytest.mark.slow) for n, d2 in (("huginn:tiny", 2), ("huginn:tiny", 4))],
)
def test_loopspec_default_capacity_skips_no_spawn(spec, d1, d2):
  """Issue 25 item 9: d1 = 1 with nested second-proposal branches (R = 8 (1, 2): up to 21 lanes per stage) at
  the default lane table: no spawn is skipped and every commit's source is the readout prediction."""
  check_loopspec(spec, d1, d2, default_capacity=True)


@pytest.mark.slow
def test_bundled_tiny_ouro_default_capacity_skips_no_spawn():
  """The bundled tiny-ouro (R = 4) at (1, 2) and the default table (3 lanes per stage, the worst case): greedy
  output equals AR, no spawn is skipped and every commit's source is the readout prediction."""
  import loopspec_jax

  model = loopspec_jax.load("tiny-ouro")
  prompts = [list(p) for p in PROMPTS]
  want = loopspec_jax.generate(model, prompts, max_new_tokens=32, method="ar")
  got = loopspec_jax.generate(model, prompts, max_new_tokens=32, method="loopspec", d1=1, d2=2)
  assert got.tokens == want.tokens and got.stats["skipped_spawns"] == 0, got.stats
  assert got.stats["lane_capacity"] == 12
  pr = got.stats["per_request"]
  for i, (prompt, toks) in enumerate(zip(PROMPTS, want.tokens)):
    pred = helpers.loopspec_sources(model, prompt, toks, 1, 2)
    engine = {k: pr[k][i] for k in ("first", "second", "restart", "last_source")}
    assert engine == {k: pred[k] for k in engine}, f"request {i}: engine {engine}, readouts {pred}"


@pytest.mark.parametrize("spec,d1,gamma", with_slow(CHAIN, CHAIN_SLOW))
def test_chain_accepted_drafts_equal_readout_prediction(spec, d1, gamma):
  check_chain(spec, d1, gamma)


def test_prediction_helpers_on_a_hand_made_case(monkeypatch):
  """The predictors themselves, on hand-made argmax rows (no model): sources per commit, and chain rounds with
  a budget that cuts the last round."""
  rows = {(1, 4, 8): [[5, 1, 2, 3, 4], [6, 1, 9, 9, 4], [6, 2, 9, 3, 4]]}

  class Cfg:
    recurrence = 8

  class Model:
    config = Cfg()

  monkeypatch.setattr(
      helpers,
      "greedy_argmax",
      lambda model, prompt, new, depths: np.array(
          rows[tuple(depths)] if tuple(depths) in rows else [rows[(1, 4, 8)][0], rows[(1, 4, 8)][2]]
      ),
  )
  src = helpers.loopspec_sources(Model(), [0], [6, 2, 9, 3, 4], 1, 4)
  assert src["sources"] == [
      helpers.SOURCE_SECOND,
      helpers.SOURCE_RESTART,
      helpers.SOURCE_SECOND,
      helpers.SOURCE_FIRST,
      helpers.SOURCE_FIRST,
  ]
  assert (src["first"], src["second"], src["restart"], src["last_source"]) == (2, 2, 1, helpers.SOURCE_FIRST)
  # d1 matches R at tokens 3, 4 only. gamma = 2: round 1 rejects at once (1 token), round 2 likewise, round 3
  # likewise, round 4 accepts drafts 3 and 4, which fill the budget: 2 accepted over 4 rounds.
  assert helpers.chain_counts(Model(), [0], [6, 2, 9, 3, 4], 1, 2) == (2, 4)
