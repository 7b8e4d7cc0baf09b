"""The side-by-side benchmark runs end to end; experiment flags, specs and stats sums follow one convention."""

import json
import os
import sys
import types

import chex
import pytest
from absl import flags
from absl import logging
from absl.testing import absltest

import loopspec_jax
from loopspec_jax import methods
from loopspec_jax.analysis import cost
from loopspec_jax.analysis import theory
from loopspec_jax.experiment import files
from loopspec_configs import models as model_configs
from loopspec_experiments import bench
from loopspec_experiments import common
from loopspec_experiments import demo
from loopspec_experiments import generate
from loopspec_experiments import reference_speed
from loopspec_experiments import row_cost
from loopspec_experiments import sweep


class BenchTest(chex.TestCase):

  @pytest.mark.slow  # ~30 s of compiles; the bench's parts have their own fast tests
  def test_benchmark_tiny_model_side_by_side(self):
    model = common.resolve_model("random:huginn:tiny", contraction=0.05, seed=0)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    methods = ["ar", "chain:d1=2,gamma=3", "loopspec:d1=2", "loopspec:d1=2,d2=4"]
    res = bench.benchmark(model, prompts, methods, {"temperature": 0.0}, max_new_tokens=8, repeats=1, progress=False)
    self.assertEqual(list(res), ["ar", "chain(d1=2,gamma=3)", "loopspec(d1=2)", "loopspec(d1=2,d2=4)"])
    r = model.config.recurrence
    for label, x in res.items():
      self.assertTrue(x["identical_to_ar"], label)  # greedy speculative output equals AR token for token
      self.assertEqual(x["tokens"], 16)
      self.assertGreater(x["wall_clock_ratio_median"], 0.0)
      self.assertGreater(x["mean_accepted_length"], 0.0)
      self.assertGreater(x["ticks"], 0)
    self.assertAlmostEqual(res["ar"]["wall_clock_ratio_median"], 1.0)
    self.assertEqual(res["ar"]["ticks"], 16)  # AR: one loop iteration per token
    # gamma is the library's cost identity on the summed counts, for chain and LoopSpec alike.
    ch = res["chain(d1=2,gamma=3)"]
    self.assertAlmostEqual(ch["mean_accepted_length"], theory.chain_accepted_length(r, 2, 3, 16, ch["rounds"]))
    ls = res["loopspec(d1=2,d2=4)"]
    c = ls["commits"]
    self.assertAlmostEqual(
        ls["mean_accepted_length"], theory.gamma_from_counts(r, 2, 4, 16, c["second"] + c["restart"], c["restart"])
    )
    # With a contractive core, most first proposals are accepted.
    self.assertGreater(ls["mean_accepted_length"], 2.0)
    rows = [{"model": "tiny", "task": "random", "sampling": "greedy", **v} for v in res.values()]
    table = bench.markdown_table(rows)
    self.assertIn("loopspec(d1=2,d2=4)", table)
    self.assertIn("ms/tick", table)
    json.dumps(rows, default=files.json_default)
    line = common.time_line("loopspec", ls, res["ar"])
    self.assertRegex(line, r"^loopspec: \d+ ticks, [\d.]+ tokens/tick, [\d.]+ ms/tick \(AR: [\d.]+ ms/token\)$")

  def test_method_specs_and_none(self):
    self.assertEqual(methods.parse("loopspec:d1=2,d2=8"), methods.LoopSpec(d1=2, d2=8))
    self.assertEqual(methods.parse("loopspec:d1=2,d2=none"), methods.LoopSpec(d1=2))
    self.assertEqual(methods.parse("ar"), methods.AR())
    self.assertEqual(common.parse_optional_int("none"), None)
    self.assertEqual(common.parse_optional_int(" 4 "), 4)

  def test_model_specs(self):
    cfg = common.resolve_model("random:ouro:tiny").config
    self.assertEqual((cfg.family, cfg.recurrence), ("ouro", 4))
    with self.assertRaisesRegex(ValueError, "known"):
      common.resolve_model("random:tiny_huginn")


class FlagsTest(absltest.TestCase):
  """Every experiment parses its own --config; several experiments live in one process without collisions."""

  def tearDown(self):
    super().tearDown()
    flags.FLAGS.unparse_flags()
    logging.set_verbosity(logging.WARNING)

  def _parse(self, module, *args):
    saved = sys.argv
    try:
      rest = common.parse_flags(module.FLAGS, ["prog", *args])
    finally:
      sys.argv = saved
    return rest, module._CONFIG.value

  def test_defaults_come_from_the_package(self):
    _, cfg = self._parse(bench)
    self.assertEqual(list(cfg.models), ["random:huginn:bench_r32"])
    _, cfg = self._parse(sweep)
    self.assertEqual(cfg.model, "random:huginn:bench_r32")
    _, cfg = self._parse(demo, "--config.max_new_tokens=8", "--config.d1=4", "--config.d2=none")
    self.assertEqual((cfg.max_new_tokens, cfg.d1, cfg.d2, cfg.model), (8, 4, None, "tiny-raven"))
    self.assertTrue(os.path.isabs(common.config_path("demo.py")))

  def test_package_relative_config_with_preset_and_overrides(self):
    cwd = os.getcwd()
    os.chdir("/")  # works from any directory
    try:
      rest, cfg = self._parse(
          bench, "--config=bench/bundled.py:quick", "--config.repeats=2", "--config.contraction=none", "extra"
      )
    finally:
      os.chdir(cwd)
    self.assertEqual(rest, ["prog", "extra"])
    self.assertEqual((cfg.repeats, cfg.max_new_tokens, cfg.contraction), (2, 16, None))
    _, cfg = self._parse(sweep, "--config=sweeps/default.py:tiny", "--config.chain_d1=none")
    self.assertEqual((cfg.model, cfg.chain_d1), ("random:huginn:tiny", None))
    with self.assertRaises(Exception):
      self._parse(sweep, "--config=sweeps/default.py:nosuchpreset")

  def test_memory_bound_preset_is_the_reference_speed_shape(self):
    """bench/default.py:memory_bound and the reference-speed comparison decode one model shape (huginn:bench_e512:
    Huginn-0125's layout at E = 512), whose weights are far larger than a CPU's caches."""
    _, cfg = self._parse(bench, "--config=bench/default.py:memory_bound")
    self.assertEqual(list(cfg.models), ["random:huginn:bench_e512"])
    self.assertEqual(reference_speed.FLAGS["variant"].default, "bench_e512")
    mc = model_configs.model_config("huginn:bench_e512")
    self.assertEqual((mc.hidden_size, mc.head_dim, mc.intermediate_size, mc.vocab_size), (512, 64, 1728, 65536))
    self.assertEqual((mc.n_prelude, mc.n_core, mc.n_coda, mc.recurrence), (2, 4, 2, 32))
    self.assertGreater(sum(cost.param_bytes(mc).values()), 250e6)  # 63.7M float32 parameters

  def test_reparse_and_logs_quiet_unless_asked(self):
    _, cfg = self._parse(generate, "--config.max_new_tokens=3")
    self.assertEqual(cfg.max_new_tokens, 3)
    self.assertEqual(logging.get_verbosity(), logging.WARNING)
    _, cfg = self._parse(generate, "--config.max_new_tokens=5", "--verbosity=0")  # a second parse in one process
    self.assertEqual(cfg.max_new_tokens, 5)
    self.assertEqual(logging.get_verbosity(), logging.INFO)


def test_reference_speed_table_and_bandwidth_without_torch():
  """The reference comparison's own parts run without torch: the bandwidth probe and the table."""
  assert reference_speed.stream_bandwidth(gib=1 / 64, repeats=2) > 1e8
  res = {
      "ours": {"tokens_per_second": [8.0, 9.0], "seconds_2n": [1.0, 1.1], "share_of_bound": 0.9},
      "ref": {
          "tokens_per_second": [3.0, 3.5],
          "seconds_2n": [2.0, 2.1],
          "share_of_bound": 0.35,
          "ratio_median": 2.6,
          "agree": {"matching": 32, "total": 32},
      },
  }
  table = reference_speed.markdown_table(res, "ours")
  assert "| ref | 3.25 | 307.7 | 3.00 / 3.50 | 2.05 | 2.60x | 35% | 32/32 |" in table
  assert "| ours | 8.50 |" in table


def test_demo_report_adds_the_single_proposal_line():
  model = types.SimpleNamespace(recurrence=32)
  ar = {"tokens_per_second": 300.0, "decode_seconds": 1.0, "ticks": 96, "tokens": 96}
  ls = {"tokens_per_second": 450.0, "decode_seconds": 0.5, "ticks": 130, "tokens": 96, "mean_accepted_length": 12.9}
  single = dict(ls, decode_seconds=0.4, mean_accepted_length=10.1, ticks=140)
  text = demo.report(model, 2, ar, ls, single)
  assert "wall-clock ratio (decode after prefill): 2.00x" in text
  assert "single proposal (d1, d2) = (2, -):" in text and "2.50x AR" in text and "140 ticks" in text
  assert "single proposal" not in demo.report(model, 2, ar, ls)


@pytest.mark.slow  # ~20 s; test_demo_auto_row_adds_runs_whose_picks_differ drives the same interleaving
def test_demo_interleaves_methods_per_prompt(monkeypatch):
  """Per prompt: one compiling call per method, then rounds that time each method once in turn."""
  import loopspec_jax

  calls, real = [], loopspec_jax.generate
  record = lambda model, prompts, **kw: calls.append((kw["request_ids"][0], kw["method"])) or real(model, prompts, **kw)
  monkeypatch.setattr(loopspec_jax, "generate", record)
  model = common.resolve_model("random:huginn:tiny", contraction=0.05, seed=0)
  runs = [("ar", dict(method="ar")), ("ls", dict(method="loopspec", d1=2, d2=4, lane_capacity=8))]
  out = demo.decode_interleaved(model, [[1, 2, 3], [4, 5]], runs, max_new_tokens=4, seed=0, repeats=2, temperature=0.0)
  assert calls == [(i, m) for i in (0, 1) for _ in range(3) for m in ("ar", "loopspec")]
  assert out["ar"][0] == out["ls"][0] and len(out["ar"][0]) == 2
  assert out["ls"][1]["tokens"] == 8


def test_demo_report_names_the_gate_mass():
  model = types.SimpleNamespace(recurrence=32)
  ar = {"tokens_per_second": 300.0, "decode_seconds": 1.0, "ticks": 96, "tokens": 96}
  ls = {"tokens_per_second": 450.0, "decode_seconds": 0.5, "ticks": 130, "tokens": 96, "mean_accepted_length": 12.9}
  assert "of 16, gate_mass 0.1" in demo.report(model, 2, ar, ls, gate_mass=0.1)
  assert "gate_mass" not in demo.report(model, 2, ar, ls)


def test_demo_explains_a_ratio_below_one_on_a_cpu():
  model = loopspec_jax.load("tiny-raven")
  mib32 = 32 << 20
  note = demo.cache_note(model, 2, 0.7, "cpu", mib32)
  assert note.startswith("why: a LoopSpec tick does the arithmetic of an AR token (16 lanes x 2 steps)")
  assert "1.7 MB of core weights fit the CPU's 32 MiB cache" in note and "bench/default.py:memory_bound" in note
  assert "reads the same KV bytes (6.8 MB per 100 cached positions" in note and "loopspec-row-cost" in note
  assert demo.cache_note(model, 2, 1.2, "cpu", mib32) is None and demo.cache_note(model, 2, 0.7, "gpu", mib32) is None
  assert demo.cache_note(model, 2, 0.7, "cpu", 1 << 20) is None  # weights larger than the cache: another reason
  assert common.last_level_cache_bytes() >= 1 << 20


@pytest.mark.slow  # ~25 s of measured timing: a benchmark tool, run by loopspec-row-cost
def test_row_cost_measures_every_row_count_and_bounds_the_ratio():
  """The row-cost bound: core steps on M rows (each row attending to its own cache block) and an AR token at
  the same cache length, timed interleaved; the bound is tokens per tick x t_AR / (d1 t(G))."""
  model = common.resolve_model("random:huginn:tiny", contraction=0.05, seed=0)
  d1 = 2
  g = model.config.recurrence // d1
  res = row_cost.measure(model, [1, g], context=32, new_tokens=8, steps=2, repeats=2)
  assert set(res["step_seconds"]) == {1, g} and all(len(t) == 2 for t in res["step_seconds_all"].values())
  assert min(res["step_seconds"].values()) > 0 and res["ar_token_seconds"] > 0
  s = row_cost.summarize("tiny", model, res, d1, new_tokens=8)
  assert s["groups"] == g and s["ideal_tokens_per_tick"] == 8 / (8 + g - 1)
  assert s["bound_no_rejection"] < s["bound_at_one_token_per_tick"]
  # The arithmetic of the bound, on numbers: AR 4 ms/token, t(G) = 1 ms, d1 = 2, 0.5 tokens per tick -> 1x.
  assert row_cost.ratio_bound(4e-3, 1e-3, 2, 0.5) == 1.0
  table = row_cost.tables([("tiny", res, s)], 8)
  assert table.count("| tiny | ") == 3 and "bound: 8 tokens without a rejection" in table
  with pytest.raises(ValueError, match="must exceed new_tokens"):
    row_cost.ar_token_loop(model, context=8, new_tokens=8, seed=0)
  with pytest.raises(ValueError, match="fit the model's context"):
    row_cost.check_cache_length(model.config, model.config.max_len + 1, 8)
  # The whole tick against an AR token per cache length, and the per-position slope of each.
  costs = row_cost.decode_costs(model, d1, [16, 24], new_tokens=4, repeats=1)
  assert set(costs) == {16, 24} and all(c["ar"] > 0 and c["loopspec"] > 0 for c in costs.values())
  s = row_cost.summarize("tiny", model, res, d1, new_tokens=8, costs=costs)
  assert s["ar_slope_s_per_position"] == row_cost.slope_per_position(costs, "ar")
  table = row_cost.tables([("tiny", res, s)], 8)
  assert "| tiny | 24 |" in table and "| tiny | per 100 positions |" in table


if __name__ == "__main__":
  absltest.main()


def test_demo_auto_row_adds_runs_whose_picks_differ(monkeypatch):
  """The demo's `auto` row sums runs of several prompts whose plans pick different methods, and calls that
  re-planned to a second pick (`DecodeStats.then`: method 'auto'): the picks are forced, not hoped for."""
  import loopspec_jax as lj
  from loopspec_jax import methods, planner

  picks = {  # prompt length -> (first pick, second pick after `replan` tokens)
      3: (methods.Chain(d1=2, gamma=2), methods.AR()),
      2: (methods.Lookup(gamma=2), methods.Lookup(gamma=2)),
  }

  def forced_plan(model, prompts, max_new_tokens, greedy, auto, run=None, curve=None, sampling=None):
    first, second = picks[len(prompts[0]) if curve is None else len(prompts[0]) - auto.replan]
    m = first if curve is None else second
    curve = {"beta": 1.0, "alpha": 1.0, "source": "forced"}
    return m, {"choice": m.spec, "reason": "forced by the test", "depth_curve": curve}

  real_key = planner.plan_key  # one plan per prompt (the demo's prompts may share a shape bucket)
  monkeypatch.setattr(planner, "plan_key", lambda model, prompts, *a: real_key(model, prompts, *a) + (len(prompts[0]),))
  monkeypatch.setattr(planner, "PLANS", {})
  monkeypatch.setattr(planner, "make_plan", forced_plan)
  model = common.resolve_model("random:huginn:tiny", contraction=0.05, seed=0)
  auto = lj.Auto(probe_tokens=0, measure=4, replan=3)
  runs = [("ar", dict(method="ar")), ("auto", dict(method=auto))]
  prompts = [[1, 2, 3], [4, 5]]
  out = demo.decode_interleaved(model, prompts, runs, max_new_tokens=6, seed=0, repeats=1, temperature=0.0)
  assert out["auto"][0] == out["ar"][0]  # every pick is exact
  agg = out["auto"][1]
  assert agg["method"] == "auto" and agg["tokens"] == 12 and agg["batch"] == 2
  # prompt 0 re-planned to another pick (two segments), prompt 1's cached second pick was its first (one run)
  assert [p["picks"] for p in agg["plans"]] == [["chain:d1=2,gamma=2", "ar"], ["lookup:gamma=2"]]
  assert demo.auto_line(out["ar"][1], *out["auto"]).startswith("auto:")


def test_stats_of_different_methods_add_only_for_the_planner():
  from loopspec_jax.decoding.stats import DecodeStats

  a = DecodeStats("chain", {"d1": 2}, {"tokens": [4], "rounds": [2]}, {"iterations": 2, "decode_seconds": 1.0})
  b = DecodeStats("ar", {}, {"tokens": [3, 5]}, {"iterations": 8, "decode_seconds": 2.0})
  with pytest.raises(ValueError, match="only runs of one method"):
    a + b
  mixed = a.as_planned() + b.as_planned()
  assert (mixed.method, mixed.settings, mixed.planned) == ("auto", {}, True)
  assert mixed.per_request == {"tokens": [4, 3, 5], "rounds": [2, 0, 0]}
  assert mixed.summary()["tokens"] == 12 and mixed.summary()["decode_seconds"] == 3.0
  assert (a.as_planned() + a.as_planned()).method == "chain"  # one pick keeps its own figures


def test_demo_compiles_every_fixed_method_of_both_phases_up_front(monkeypatch):
  """compile_all: one call per (phase, fixed method), several at a time; auto is left to run alone."""
  import threading

  import loopspec_jax

  calls, threads = [], set()
  record = lambda model, prompts, **kw: calls.append((kw["method"], kw.get("temperature"))) or threads.add(
      threading.get_ident()
  )
  monkeypatch.setattr(loopspec_jax, "generate", record)
  from loopspec_configs import demo as demo_config

  cfg = demo_config.get_config()
  phases = [(n, s, demo.demo_runs(cfg, 2, 8, s)) for n, s in demo.SETTINGS]
  assert [l for l, _ in phases[0][2]] == ["autoregressive", "loopspec", "loopspec single proposal", "auto"]
  demo.compile_all(None, [1, 2, 3], phases, max_new_tokens=4, workers=2)
  assert sorted(calls, key=str) == sorted([(m, t) for t in (0.0, 1.0) for m in ("ar", "loopspec", "loopspec")], key=str)
