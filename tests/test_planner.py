"""method="auto": the planner picks a registered exact method, says why, and decodes exactly."""

import dataclasses
import functools
import types

import pytest

import helpers
import loopspec_jax as lj
from loopspec_jax import methods
from loopspec_jax import planner
from loopspec_jax.analysis import hardware
from loopspec_jax.decoding import autoregressive
from loopspec_jax.decoding import chain
from loopspec_jax.decoding import common

HW = hardware.Hardware("x", bandwidth=1e10, peak_flops=1e11, op_overhead_s=1e-8)


@pytest.fixture
def quick_planner(monkeypatch):
  """A fixed device (no host microbenchmarks) and a two-method shortlist (two compiles), a fresh plan cache."""
  monkeypatch.setattr(planner, "hardware_for", lambda cfg, ws: HW)
  monkeypatch.setattr(planner, "measured_shortlist", lambda ranked, draft=None: [lj.AR(), lj.Chain(d1=1, gamma=2)])
  planner.clear_plans()
  yield
  planner.clear_plans()


def test_auto_is_registered_and_parses():
  assert methods.parse("auto") == planner.Auto()
  assert methods.parse("auto:probe_tokens=0,shortlist=0") == planner.Auto(probe_tokens=0, shortlist=0)
  assert methods.parse("auto:measure=4") == planner.Auto(measure=4)
  with pytest.raises(ValueError, match="measure must be >= 0"):
    planner.Auto(measure=-1).validate(helpers.tiny_config("huginn:tiny"))
  with pytest.raises(ValueError, match="resolved per call"):
    planner.Auto().make_decoder(helpers.tiny_config("huginn:tiny"), greedy=True, random_init=False)


def test_candidates_are_valid_and_ranked():
  cfg = helpers.tiny_config("huginn:tiny")
  hw = hardware.Hardware("x", bandwidth=1e10, peak_flops=1e11, op_overhead_s=1e-8)
  ranked = planner.rank(cfg, hw, 1, 64, planner.ENVELOPE)
  assert {type(c.method).__name__ for c in ranked} == {"AR", "Chain", "LoopSpec"}
  rates = [c.tokens_per_s for c in ranked]
  assert rates == sorted(rates, reverse=True)
  ar = next(c for c in ranked if c.method == lj.AR())
  assert ar.tokens_per_iteration == 1.0


@pytest.mark.parametrize(
    "auto",
    [
        planner.Auto(probe_tokens=8, measure=0),
        pytest.param("auto:probe_tokens=0,shortlist=0,measure=0", marks=pytest.mark.slow),
    ],
)
def test_auto_greedy_equals_ar_and_reports_its_choice(auto):
  model = helpers.tiny_model("huginn:tiny")
  out = lj.generate(model, helpers.PROMPTS, max_new_tokens=helpers.MAX_NEW, method=auto)
  assert out.tokens == helpers.ar_tokens(model, helpers.PROMPTS, helpers.MAX_NEW)
  plan = out.stats["plan"]
  assert methods.parse(plan["choice"]).name in ("ar", "chain", "loopspec")
  assert out.stats["method"] == methods.parse(plan["choice"]).name
  for c in plan["top"]:
    assert c["tokens_per_iteration"] > 0 and c["iteration_ms"] > 0 and c["tokens_per_s"] > 0
  assert plan["top"][0]["method"] == plan["choice"] and "x AR predicted" in plan["reason"]
  assert plan["depth_curve"]["source"] in ("probe", "envelope", "envelope (probe did not fit)")
  again = lj.generate(model, helpers.PROMPTS, max_new_tokens=helpers.MAX_NEW, method=auto)  # the plan cache
  assert again.stats["plan"]["cached"] and again.stats["plan"]["choice"] == plan["choice"]
  assert again.tokens == out.tokens


@pytest.mark.slow
def test_shortlist_is_retimed_from_the_compiled_loops():
  cfg = helpers.tiny_config("huginn:tiny")
  hw = hardware.Hardware("x", bandwidth=1e10, peak_flops=1e11, op_overhead_s=1e-6)
  analytic = {c.method: c for c in planner.rank(cfg, hw, 1, 64, planner.ENVELOPE)}
  timed = planner.rank(cfg, hw, 1, 64, planner.ENVELOPE, shortlist=2)
  assert len(timed) == 3 and lj.AR() in [c.method for c in timed]
  for c in timed:  # the HLO's kernels x 1 us alone differ from the analytic guess
    assert c.iteration_s != analytic[c.method].iteration_s
    assert c.tokens_per_iteration == analytic[c.method].tokens_per_iteration


def test_measured_shortlist_has_every_family():
  cfg = helpers.tiny_config("huginn:tiny")
  ranked = planner.rank(cfg, HW, 1, 64, planner.ENVELOPE)
  short = planner.measured_shortlist(ranked, draft_model=helpers.tiny_model("huginn:tiny"))
  names = [m.name for m in short]
  assert names[0] == "ar" and names.count("ar") == 1 and {"lookup", "draft"} <= set(names)
  assert sorted(m.d1 for m in short if m.name == "chain") == [1, 1, 2, 2]  # two gammas per d1
  assert sorted(m.d2 is None for m in short if m.name == "loopspec") == [False, True]


@pytest.mark.slow
def test_plan_is_measured_once_then_cached_and_reuses_the_compiled_loop(quick_planner):
  """The first call probes (each shortlisted method decodes `measure` tokens at the call's own shapes), the
  second finds the plan in the cache and compiles nothing: it costs what the fixed method costs."""
  model = helpers.tiny_model("huginn:tiny")
  auto = planner.Auto(probe_tokens=8, measure=4)
  kw = dict(max_new_tokens=helpers.MAX_NEW, method=auto)
  first = lj.generate(model, [list(helpers.PROMPTS[1])], **kw)
  plan = first.stats["plan"]
  assert not plan["cached"] and plan["basis"].startswith("measured") and plan["plan_seconds"] > 0
  assert {r["method"] for r in plan["top"]} == {"ar", "chain:d1=1,gamma=2"}
  for r in plan["top"]:  # measured and predicted tokens and ms per iteration, side by side
    assert r["tokens_per_iteration"] > 0 and r["iteration_ms"] > 0 and r["predicted_iteration_ms"] > 0
  sizes = (autoregressive.decode_loop._cache_size(), chain.decode_loop._cache_size())
  second = lj.generate(model, [list(helpers.PROMPTS[1])], **kw)
  assert second.stats["plan"]["cached"] and second.stats["plan"]["choice"] == plan["choice"]
  assert (autoregressive.decode_loop._cache_size(), chain.decode_loop._cache_size()) == sizes
  ar = helpers.ar_tokens(model, [list(helpers.PROMPTS[1])], helpers.MAX_NEW)
  assert first.tokens == second.tokens == ar


def test_engine_serves_the_planned_method(quick_planner):
  from loopspec_jax.serving import engine as E

  model = helpers.tiny_model("huginn:tiny")
  eng = E.Engine(model, E.EngineConfig(method="auto", slots=2, max_len=32))
  assert eng.method.name in ("ar", "chain", "loopspec") and eng.plan["choice"] == eng.method.spec
  assert eng.plan["basis"] == "predicted" and eng.plan["depth_curve"]["source"] == "envelope"


@pytest.mark.slow
def test_lm_eval_backend_takes_auto(quick_planner):
  pytest.importorskip("lm_eval")
  from loopspec_jax.integrations import lm_eval as backend

  model = helpers.tokenized_model("huginn:tiny", contraction=0.7, max_len=128)
  lm = backend.LoopSpecLM(model=model, method="auto", measure=4, warmup=False)
  assert isinstance(lm.method, planner.Auto) and lm.method.measure == 4
  prompt = model.encode("Question: 2 + 3?")
  toks = lm._generate([prompt], 6, {"temperature": 0.0}, [0], "t")
  assert toks == helpers.ar_tokens(model, [prompt], 6)


def test_demo_prints_the_auto_row():
  from loopspec_experiments import demo

  ar = {"tokens_per_second": 100.0, "decode_seconds": 1.0}
  auto = {"tokens_per_second": 150.0, "decode_seconds": 0.5, "plans": [{"choice": "chain:d1=2,gamma=8"}] * 2}
  line = demo.auto_line(ar, [], auto)
  assert line.startswith("auto:") and "2.00x AR" in line and "picked chain:d1=2,gamma=8 " in line


class FakeHost:
  """A fake `run` for `planner.measure`: method -> (true seconds / iteration, tokens / iteration), a load factor
  per round that slows every run of that round alike, and `lucky` (method, round): that run met a quiet moment
  (5x faster). Records the order of the calls."""

  def __init__(self, truth, load, lucky=None):
    self.truth, self.load, self.lucky, self.calls = truth, load, lucky, []

  def __call__(self, method, budget):
    n = len(self.calls) // len(self.truth) - 1  # the first pass over the shortlist compiles (untimed)
    self.calls.append(method)
    sec, tok = self.truth[method]
    sec *= self.load[max(n, 0)] * (0.2 if (method, n) == self.lucky else 1.0)
    iters = max(int(budget / tok), 1)
    totals = {"iterations": iters, "decode_seconds": sec * iters}
    return types.SimpleNamespace(counts=types.SimpleNamespace(totals=totals, tokens=tok * iters, requests=1))


AR, FAST, LUCKY = lj.AR(), lj.Chain(d1=2, gamma=8), lj.LoopSpec(d1=4)
TRUTH = {AR: (0.010, 1.0), FAST: (0.030, 3.6), LUCKY: (0.008, 0.72)}  # 1.2x and 0.9x AR


def test_measure_compares_within_a_round_and_keeps_the_median():
  """Load drifting 5x between rounds cancels (each ratio is taken within its round); one quiet moment of the
  slow candidate (its probe 5x too fast, results/bench_auto/vm-2026-12-03) does not win: the median does."""
  host = FakeHost(TRUTH, load=[1.0, 3.0, 1.5, 5.0, 2.0], lucky=(LUCKY, 1))
  got = planner.measure(host, [AR, FAST, LUCKY], budget=16, rounds=5)
  assert got[AR][2] == pytest.approx(1.0)
  assert got[FAST][2] == pytest.approx(1.2) and got[LUCKY][2] == pytest.approx(0.9)
  assert got[FAST][0] == pytest.approx(3.6)
  # order: one compile pass, then each round rotated by one
  rounds = [host.calls[3 * (r + 1) : 3 * (r + 2)] for r in range(5)]
  assert rounds[0] == [AR, FAST, LUCKY] and rounds[1] == [FAST, LUCKY, AR] and rounds[2] == [LUCKY, AR, FAST]
  with pytest.raises(ValueError, match="must be AR"):
    planner.measure(host, [FAST, AR], budget=16)


def test_plan_picks_the_median_winner_and_says_why(monkeypatch):
  monkeypatch.setattr(planner, "hardware_for", lambda cfg, ws: HW)
  monkeypatch.setattr(planner, "measured_shortlist", lambda ranked, draft=None: [AR, FAST, LUCKY])
  model = types.SimpleNamespace(config=helpers.tiny_config("huginn:tiny"))
  host = FakeHost(TRUTH, load=[2.0, 1.0, 4.0, 1.0, 3.0], lucky=(LUCKY, 2))
  auto = planner.Auto(probe_tokens=0, measure=16, rounds=5)
  method, plan = planner.make_plan(model, [[1] * 8], 32, True, auto, run=host)
  assert method == FAST and plan["choice"] == FAST.spec
  assert "1.20x AR measured" in plan["reason"] and "5 interleaved rounds" in plan["basis"]
  assert [r["method"] for r in plan["top"]] == [FAST.spec, AR.spec, LUCKY.spec]
  assert plan["top"][0]["x_ar"] == pytest.approx(1.2) and plan["top"][0]["predicted_iteration_ms"] > 0
  # a candidate within AR_MARGIN of AR loses to AR
  slow = {AR: (0.010, 1.0), FAST: (0.030, 3.09), LUCKY: (0.008, 0.72)}
  method, plan = planner.make_plan(model, [[1] * 8], 32, True, auto, run=FakeHost(slow, load=[1.0] * 5))
  assert method == AR and plan["choice"] == AR.spec


def test_shortlist_keeps_two_gammas_per_chain_depth():
  cfg = helpers.tiny_config("huginn:tiny")
  ranked = planner.rank(cfg, HW, 1, 64, planner.ENVELOPE)
  short = planner.measured_shortlist(ranked)
  for d1 in (1, 2):
    best = [c.method for c in ranked if c.method.name == "chain" and c.method.d1 == d1][:2]
    assert [m for m in short if m.name == "chain" and m.d1 == d1] == best
  one = planner.measured_shortlist(ranked, per_family={"chain": 1, "loopspec": 1})
  assert len([m for m in one if m.name == "chain"]) == 2


# ---------------------------------------------------------------------------------------------------
# Re-planning (Auto.replan): first pick for N tokens, a second measured probe on prompt + those, the rest
# ---------------------------------------------------------------------------------------------------
def forced_measure(picks):
  """A `planner.measure` stand-in whose k-th call makes picks[k] (then AR) the winner (2x AR, the rest 0.5x) without
  decoding: the plans differ by construction, the decodes themselves are real."""
  calls = []

  def fake(run, shortlist, budget, rounds=5):
    best = picks[len(calls)] if len(calls) < len(picks) else AR
    calls.append([m.spec for m in shortlist])
    return {m: (1.0, 0.01, 1.0 if m == AR else 2.0 if m == best else 0.5) for m in shortlist + [best]}

  fake.calls = calls
  return fake


REPLAN = planner.Auto(probe_tokens=0, measure=2, rounds=1, replan=4)


def test_auto_replan_parses_and_is_refused_before_compiling():
  assert methods.parse("auto:replan=8") == planner.Auto(replan=8) and planner.Auto().replan == planner.REPLAN
  assert methods.build("auto", replan=0) == planner.Auto(replan=0)
  model = helpers.tiny_model("huginn:tiny")
  never = [(planner.common, "prefill_state"), (planner, "_depth_logits")]
  for bad in ("auto:replan=-1", "auto:replan=1.5", "auto:replan=x", planner.Auto(replan=True)):
    args = dict(prompts=[[1, 2, 3]], max_new_tokens=8, method=bad)
    helpers.assert_rejected_before_compiling(model, args, "replan must be an int >= 0", never)


def test_auto_replan_joins_two_picks_into_ar_greedy_on_a_batch(quick_planner, monkeypatch):
  """Prompts of 3, 7 and 5 tokens: AR for 4 tokens, then the re-plan's chain for 8 from prompt + those; the
  joined tokens are AR's, the stats join both segments and the plan gives both picks with their figures;
  the second call takes both picks from the cache (no probe) and decodes the same tokens."""
  fake = forced_measure([AR, lj.Chain(d1=1, gamma=2)])
  monkeypatch.setattr(planner, "measure", fake)
  model = helpers.tiny_model("huginn:tiny")
  out = lj.generate(model, helpers.PROMPTS, max_new_tokens=helpers.MAX_NEW, method=REPLAN)
  assert out.tokens == helpers.ar_tokens(model, helpers.PROMPTS, helpers.MAX_NEW)
  plan = out.stats["plan"]
  assert plan["picks"] == ["ar", "chain:d1=1,gamma=2"] and plan["choice"] == "ar" and not plan["cached"]
  second = plan["replan"]
  assert second["choice"] == "chain:d1=1,gamma=2" and second["after_tokens"] == 4 and not second["cached"]
  assert second["reason"].startswith("after 4 tokens of ar, on prompt + those: chain(d1=1,gamma=2)")
  assert second["top"][0]["x_ar"] == 2.0 and "measured on these requests (2 new tokens" in second["basis"]
  assert second["depth_curve"] == plan["depth_curve"]  # the first plan's curve: no second depth probe
  assert out.stats["method"] == "auto" and out.stats["per_request"]["tokens"] == [helpers.MAX_NEW] * 3
  seg = out.stats["segments"]
  assert [s["method"] for s in seg] == ["ar", "chain"] and [s["tokens"] for s in seg] == [12, 24]
  assert out.stats["ticks"] == seg[0]["ticks"] + seg[1]["ticks"]
  assert out.stats["decode_seconds"] == pytest.approx(seg[0]["decode_seconds"] + seg[1]["decode_seconds"])
  again = lj.generate(model, helpers.PROMPTS, max_new_tokens=helpers.MAX_NEW, method=REPLAN)
  assert len(fake.calls) == 2 and again.tokens == out.tokens
  assert again.stats["plan"]["cached"] and again.stats["plan"]["replan"]["cached"]


def test_auto_replan_stops_requests_at_eos_and_skips_when_short(quick_planner, monkeypatch):
  """eos: request 1 ends within the first 6 tokens (a one-token dummy of the continuation, dropped), the
  others later; every request's tokens are AR's cut at its eos. No re-plan when max_new_tokens <= N."""
  monkeypatch.setattr(planner, "measure", forced_measure([lj.Chain(d1=1, gamma=2), AR]))
  got = helpers.eos_run("huginn:tiny", None, dataclasses.replace(REPLAN, replan=6))
  assert got.stats["plan"]["picks"] == ["chain:d1=1,gamma=2", "ar"]
  assert got.stats["per_request"]["tokens"] == [len(t) for t in got.tokens] and len(got.tokens[1]) <= 5 < 6 < max(
      map(len, got.tokens)
  )
  short = lj.generate(helpers.tiny_model("huginn:tiny"), helpers.PROMPTS, max_new_tokens=4, method=REPLAN)
  assert short.stats["plan"]["replan"] == {"skipped": "max_new_tokens 4 <= replan 4"}
  assert short.stats["plan"]["picks"] == ["ar"] and short.stats["method"] == "ar"


def test_auto_replan_sampled_keys_go_on_by_position(quick_planner, monkeypatch):
  """Sampled (T = 1, Raven's random initial states): AR for 4 tokens, then AR again from prompt + those 4
  (forced, so both segments are token-identical to AR under sampling): the joined tokens are ONE AR run's,
  so the continuation draws each position's key and noise exactly where AR does (a restart would not)."""
  monkeypatch.setattr(planner, "measure", forced_measure([AR, AR]))
  model = helpers.tiny_model("huginn:tiny")
  kw = dict(max_new_tokens=helpers.MAX_NEW, temperature=1.0, seed=3, init_state="random", request_ids=[4, 0, 9])
  out = lj.generate(model, helpers.PROMPTS, method=REPLAN, **kw)
  assert out.stats["plan"]["picks"] == ["ar", "ar"] and out.stats["method"] == "ar"
  assert out.stats["segments"][1]["tokens"] == 3 * (helpers.MAX_NEW - 4)
  assert out.tokens == lj.generate(model, helpers.PROMPTS, method="ar", **kw).tokens
  again = lj.generate(model, helpers.PROMPTS, method=REPLAN, **kw)  # cached second pick = first: one run
  assert again.tokens == out.tokens and "one run" in again.stats["plan"]["replan"]["skipped"]


def test_a_sampled_probe_draws_other_keys_than_its_decode():
  """The pick must not depend on the draws the decode then makes: a sampled probe runs at the next seed."""
  sampled = common.Sampling(temperature=0.8, seed=5)
  run = functools.partial(lambda m, b=None, *, sampling: sampling.seed, sampling=sampled)
  assert run(AR) == 5 and planner.probe_run(run, sampled)(AR, 4) == 6
  assert planner.probe_run(run, common.Sampling(seed=5)) is run and planner.probe_run(run, None) is run
