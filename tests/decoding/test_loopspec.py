"""LoopSpec decoding (`generate(..., method='loopspec')`): exactness against full-depth AR decoding, the cost
identity of its per-request counters, one trace per configuration, validation, and seeded sampling.

Compile cost dominates on CPU (each distinct (config, batch, capacity, d1, d2, greedy, bucket) is one XLA
program, ~10-25 s), so the default tests share programs on purpose: parameters are traced arguments, so the
random-weight model and the contractive model of one config run the SAME compiled AR and LoopSpec programs,
every prompt batch below has 3 requests and falls in the same (16, 32) length bucket, and results are cached
per (model, method, depths). The wider (d1, d2) matrix and the HF fixtures are marked slow.
"""

import functools

import pytest

import helpers
import loopspec_jax
from helpers import MAX_NEW, PROMPTS, tiny_model
from loopspec_jax.decoding import common
from loopspec_jax.decoding.loopspec import decoder as loopspec_decoder
from loopspec_jax.decoding.loopspec import state as loopspec

# Per family: the (d1, d2) pair of the default test, its lane capacity (None: the default) and the
# `contraction` that makes the depths converge so drafts are mostly accepted (random weights: mostly
# rejected). The settings differ between families to cover, at no extra compile cost, d1 = 1 and d1 > 1,
# d2 = 2 d1, d2 = 3 d1 and the single proposal (d2 = None), and the minimum capacity R/d1 + 1.
FAMILIES = {
    "ouro:tiny": dict(pair=(1, 2), cap=None, contraction=0.02),  # R = 4
    "huginn:tiny": dict(pair=(2, 4), cap=8 // 2 + 1, contraction=0.05),  # R = 8, minimum capacity
    "raven_llama:tiny": dict(pair=(2, 6), cap=None, contraction=0.05),  # R = 8
    "raven_olmo:tiny": dict(pair=(1, None), cap=None, contraction=0.05),  # R = 8, single proposal
}
# More pairs per family at the default capacity: slow.
EXTRA_PAIRS = {
    "ouro:tiny": ((1, None), (2, None)),
    "huginn:tiny": ((2, 4), (1, 2), (4, None)),
    "raven_llama:tiny": ((2, 4), (2, None)),
    "raven_olmo:tiny": ((1, 4), (2, 6)),
}


run = helpers.generate_cached  # generate() on a tiny model, cached: several tests read one run


def cost_of(r, d1, d2):
  """Recurrent steps a commit's source costs until the next commit: first d1, second d2, restart R."""
  return {loopspec.PROP_RESTART: r, loopspec.PROP_FIRST: d1, loopspec.PROP_SECOND: r if d2 is None else d2}


def assert_cost_identity(res, r, d1, d2):
  """The per-request tick counts are exactly explained by the commit sources, and the summary statistics
  follow from the counters.

  A tick runs d1 core steps. Request i starts with one lane at depth 0 (R steps to its first commit); after
  each commit the next commit comes cost(source) steps later, where source is the lane that carries on
  (first-proposal child: d1, second-proposal child: d2, restart: R). The last commit ends the request, so its
  cost is never paid: ticks * d1 == R + sum over commits but the last of cost(source).
  """
  st = res.stats
  pr = st["per_request"]
  cost = cost_of(r, d1, d2)
  dd2 = r if d2 is None else d2
  for i, toks in enumerate(res.tokens):
    n = len(toks)
    first, second, restart, last = pr["first"][i], pr["second"][i], pr["restart"][i], pr["last_source"][i]
    assert first + second + restart == n, (i, pr)
    if d2 is None:
      assert second == 0, (i, pr)
    spent = r + first * d1 + second * dd2 + restart * r - cost[last]
    assert pr["ticks"][i] * d1 == spent, f"request {i}: ticks*d1={pr['ticks'][i] * d1} != {spent} ({pr})"
    assert pr["reject_first"][i] >= second, (i, pr)  # a second-proposal commit implies a rejected x1
  # The release's mean accepted length from the counts (tokens per full R-step execution).
  c = st["commits"]
  big_n = st["tokens_generated"]
  assert big_n == sum(len(t) for t in res.tokens)
  assert (c["first"], c["second"], c["restart"]) == (sum(pr["first"]), sum(pr["second"]), sum(pr["restart"]))
  n_rej1 = c["second"] + c["restart"]
  cycles = big_n * d1 + n_rej1 * (dd2 - d1) + c["restart"] * (r - dd2)
  assert st["mean_accepted_length"] == pytest.approx(r * big_n / cycles, rel=1e-12)
  assert 1.0 <= st["mean_accepted_length"] <= r / d1 + 1e-12
  # It agrees with the measured rate up to the start-up transient: by the identity above, the ticks spend
  # exactly `cycles` steps plus R - cost(last source) per request (the first lane's ramp-up minus the unpaid
  # cost of the last commit), which is between 0 and R - d1.
  ticks = sum(pr["ticks"])
  assert st["request_ticks"] == ticks
  assert st["ticks"] == max(pr["ticks"])  # loop iterations: every live request ticks in each one
  transient = sum(r - cost[s] for s in pr["last_source"])
  assert ticks * d1 == cycles + transient
  assert 0 <= transient <= len(res.tokens) * (r - d1)
  assert st["tokens_per_r_steps"] == pytest.approx(r * big_n / (ticks * d1), rel=1e-12)


def check_exact(name, contraction, d1, d2, lane_capacity=None, max_new=MAX_NEW):
  """LoopSpec tokens == AR tokens on PROMPTS, plus the cost identity; returns the LoopSpec result."""
  cfg = tiny_model(name, contraction).config
  want = run(name, contraction, "ar", max_new=max_new)
  got = run(name, contraction, "loopspec", max_new=max_new, d1=d1, d2=d2, lane_capacity=lane_capacity)
  assert got.tokens == want.tokens, f"{name} contraction={contraction} (d1, d2)=({d1}, {d2}) {got.stats['commits']}"
  assert all(len(t) == max_new for t in got.tokens)
  assert_cost_identity(got, cfg.recurrence, d1, d2)
  cap = got.stats["lane_capacity"]  # the engine may round a requested capacity up (e.g. to whole stages)
  assert cap >= (lane_capacity or cfg.recurrence // d1) and got.stats["max_live_lanes"] <= cap, got.stats
  if d2 is None:
    assert got.stats["gate_evals"] == 0 and got.stats["skipped_second"] == 0
  return got


def check_default(name, contraction, max_new=MAX_NEW):
  f = FAMILIES[name]
  return check_exact(name, contraction, *f["pair"], lane_capacity=f["cap"], max_new=max_new)


# ---------------------------------------------------------------------------------------------------
# 1. Greedy exactness, both acceptance regimes, all four families
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", [n if n in ("huginn:tiny", "ouro:tiny") else pytest.param(n, marks=pytest.mark.slow) for n in FAMILIES]
)
def test_greedy_matches_ar_in_both_regimes(name):
  n = len(PROMPTS) * MAX_NEW
  # Random weights: depth-d1 drafts mostly disagree with depth R.
  rnd = check_default(name, None)
  assert rnd.stats["commits"]["first"] < n / 4, rnd.stats["commits"]
  assert rnd.stats["reject_first"] > n / 2, rnd.stats
  # Contractive weights: the readouts converge with depth, drafts are mostly accepted.
  con = check_default(name, FAMILIES[name]["contraction"])
  assert con.stats["commits"]["first"] > 0.75 * n, con.stats["commits"]
  assert con.stats["mean_accepted_length"] > 2 * rnd.stats["mean_accepted_length"]


def test_second_proposal_is_used():
  """Random weights, two proposals: some x1 are rejected and the lane of x2 (argmax p_d2) carries on."""
  for name in ("ouro:tiny", "raven_llama:tiny"):
    res = check_default(name, None)
    assert res.stats["commits"]["second"] > 0, (name, res.stats["commits"])
    assert 0 < res.stats["gate_open_rate"] <= 1 and res.stats["gate_evals"] > 0


def test_minimum_lane_capacity_skips_spawns_and_stays_exact():
  """Huginn runs at lane_capacity = R/d1 + 1, which leaves no room for second-proposal branches: their spawns
  are skipped (a withdrawn second proposal costs speed, never correctness)."""
  name = "huginn:tiny"
  assert FAMILIES[name]["cap"] == tiny_model(name).config.recurrence // FAMILIES[name]["pair"][0] + 1
  res = check_default(name, None)
  assert res.stats["skipped_spawns"] > 0 and res.stats["skipped_second"] > 0, res.stats


@pytest.mark.parametrize("contraction", [None, FAMILIES["ouro:tiny"]["contraction"]])
def test_eos_stops_requests_at_different_ticks(contraction):
  """eos is a traced value: requests stop at their own eos while the others go on (their lanes are pruned, the
  rest of the batch keeps ticking), every request's tokens are still AR's, and the cost identity holds for
  requests that stop early."""
  name = "ouro:tiny"
  d1, d2 = FAMILIES[name]["pair"]
  got = helpers.eos_run(name, contraction, "loopspec", d1=d1, d2=d2)
  assert_cost_identity(got, tiny_model(name).config.recurrence, d1, d2)


# ---------------------------------------------------------------------------------------------------
# 2. Cost identity with no rejections: one commit per tick after the R/d1 start-up
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["huginn:tiny", pytest.param("raven_olmo:tiny", marks=pytest.mark.slow)])
def test_no_rejection_pipeline_commits_one_token_per_tick(name):
  """contraction=0 makes a Raven core ignore its state, so every depth reads out the same distribution:
  x1 is never rejected. The pipeline then holds R/d1 lanes and commits one token per tick once the first
  lane has reached R: ticks == N + R/d1 - 1, i.e. R/d1 tokens per R recurrent steps in steady state."""
  d1, _ = FAMILIES[name]["pair"]
  r = tiny_model(name, 0.0).config.recurrence
  ticks = {}
  for max_new in (8, 16):  # same (16, 32) bucket: the same compiled programs
    res = check_default(name, 0.0, max_new=max_new)
    pr = res.stats["per_request"]
    assert pr["reject_first"] == [0] * len(PROMPTS), pr
    assert res.stats["commits"]["second"] == 0 and res.stats["gate_open_rate"] == 0.0
    assert res.stats["skipped_spawns"] == 0 and res.stats["max_live_lanes"] == r // d1
    for i in range(len(PROMPTS)):
      assert pr["ticks"][i] == max_new + r // d1 - 1, (max_new, pr)
      # Every commit accepts x1. (The last one has no successor lane, since no child is spawned past the
      # token budget; it is counted by its verification stage.)
      assert pr["first"][i] == max_new and pr["last_source"][i] == loopspec.PROP_FIRST, pr
    # The release's mean accepted length is then exactly R/d1; the measured rate includes the start-up.
    assert res.stats["mean_accepted_length"] == r / d1
    assert res.stats["tokens_per_r_steps"] == pytest.approx(r * max_new / ((max_new + r // d1 - 1) * d1))
    ticks[max_new] = pr["ticks"]
  # Steady state: 8 more tokens cost exactly 8 more ticks of d1 steps each -> R/d1 tokens per R steps.
  for a, b in zip(ticks[8], ticks[16]):
    assert r * (16 - 8) / ((b - a) * d1) == r // d1


# ---------------------------------------------------------------------------------------------------
# 3 + 5. Sampling: one trace for every call of a configuration, seeded reproducibility, batch independence
# ---------------------------------------------------------------------------------------------------
SAMPLING = dict(temperature=0.8, top_p=0.9, d1=1, d2=2)


@functools.lru_cache(maxsize=None)
def sampling_runs():
  """Four sampling calls of one configuration (tiny Ouro, contractive: accepts, rejections and second
  proposals all occur) under fresh jits of the LoopSpec programs (see `helpers.sampling_runs`)."""
  return helpers.sampling_runs(
      tiny_model("ouro:tiny", 0.05),
      "loopspec",
      SAMPLING,
      [(common, "prefill_state"), (loopspec, "initial_state"), (loopspec_decoder, "decode_loop")],
  )


def test_one_trace_per_configuration():
  runs = sampling_runs()
  # prefill, initial state and decode loop: each compiled exactly once for the four calls.
  assert runs["cache_sizes"] == (1, 1, 1)


def test_sampling_is_reproducible_and_batch_independent():
  runs = sampling_runs()
  helpers.assert_seeded_and_batch_independent(runs, 64)
  # Sampling still follows the cost identity, and exercises rejections and second proposals.
  for key in ("a", "moved", "seed1"):
    assert_cost_identity(runs[key], 4, SAMPLING["d1"], SAMPLING["d2"])
  commits = [runs[k].stats["commits"] for k in ("a", "moved", "seed1")]
  assert all(sum(c[k] for c in commits) > 0 for k in ("first", "second", "restart")), commits


# ---------------------------------------------------------------------------------------------------
# 4. Invalid configurations are rejected before anything compiles
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d1=3), r"d1=3 must divide the recurrence R=8"),
        (dict(d1=8), r"d1=8 must be smaller than R=8"),
        (dict(d1=0), r"integer d1 >= 1"),
        (dict(d1=2, d2=2), r"d2=2 must satisfy d1 < d2 < R"),
        (dict(d1=4, d2=2), r"d2=2 must satisfy d1 < d2 < R"),
        (dict(d1=2, d2=8), r"d2=8 must satisfy d1 < d2 < R"),
        (dict(d1=2, d2=5), r"d1=2 must divide d2=5"),
        (dict(d1=2, d2=4, lane_capacity=3), r"lane_capacity=3 is too small: .* R/d1 = 4"),
        (dict(d1=1, lane_capacity=7), r"lane_capacity=7 is too small: .* R/d1 = 8"),
        (dict(d1=2, gate_mass=0.1), r"gate_mass applies to the second proposal: give d2"),
        (dict(d1=2, d2=4, gate_mass=1.5), r"gate_mass must be a number in \[0, 1\]"),
        (dict(d1=2, d2=4, gate_mass=-0.1), r"gate_mass must be a number in \[0, 1\]"),
        (dict(d1=2, d2=4, gate_mass="0.1"), r"gate_mass must be a number in \[0, 1\]"),
        (dict(method="chain", d1=2, gamma=2, gate_mass=0.1), r"method='chain' takes no gate_mass"),
        (dict(d1=2, d2=4, prompts=[[1, 64]]), r"token id 64 outside the vocabulary \[0, 64\)"),
        (dict(d1=2, d2=4, prompts=[[1, 2], [-1]]), r"prompt 1 has token id -1 outside the vocabulary"),
        (dict(d1=2, d2=4, prompts=[list(range(60))]), r"exceeds the context of 64 positions"),
    ],
)
def test_invalid_configurations_rejected_before_compiling(kwargs, match):
  model = tiny_model("raven_llama:tiny")  # R = 8, V = 64, context 64
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=MAX_NEW, method="loopspec")
  args.update(kwargs)
  helpers.assert_rejected_before_compiling(
      model, args, match, [(common, "prefill_state"), (loopspec, "initial_state"), (loopspec_decoder, "decode_loop")]
  )


# ---------------------------------------------------------------------------------------------------
# Slow: the wider (d1, d2) matrix, minimum capacity on every family, the HF fixtures
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name,pair", [(n, p) for n, pairs in EXTRA_PAIRS.items() for p in pairs])
def test_more_pairs_match_ar(name, pair):
  for contraction in (None, FAMILIES[name]["contraction"]):
    check_exact(name, contraction, *pair)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_minimum_lane_capacity_all_families(name):
  # d2 = 2 d1: a second-proposal child is spawned while R/d1 pipeline lanes are live and a first-proposal
  # child is due in the same tick, so R/d1 + 1 lanes cannot hold both. (With d2 close to R, e.g. (2, 6) at
  # R = 8, the pipeline has room for it and nothing is skipped.)
  d1 = FAMILIES[name]["pair"][0]
  d2 = 2 * d1
  cap = tiny_model(name).config.recurrence // d1 + 1
  res = check_exact(name, None, d1, d2, lane_capacity=cap)
  assert res.stats["skipped_spawns"] > 0, res.stats
  check_exact(name, FAMILIES[name]["contraction"], d1, d2, lane_capacity=cap)


@pytest.mark.slow
@pytest.mark.parametrize("name,pairs", [("huginn_tiny", ((2, 4), (4, None))), ("ouro_tiny", ((1, 2), (2, None)))])
def test_hf_fixtures_match_oracle_and_ar(name, pairs):
  """The real-format checkpoints: the oracle's greedy continuation (reference implementation) and AR on a
  batch that adds a shorter prompt."""
  model, prompts, oracle = helpers.fixture_batch(name)
  want = loopspec_jax.generate(model, prompts, max_new_tokens=len(oracle), method="ar")
  assert want.tokens[0] == oracle
  for d1, d2 in pairs:
    got = loopspec_jax.generate(model, prompts, max_new_tokens=len(oracle), method="loopspec", d1=d1, d2=d2)
    assert got.tokens == want.tokens, (name, d1, d2, got.stats["commits"])
    assert_cost_identity(got, model.config.recurrence, d1, d2)
