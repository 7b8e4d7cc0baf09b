"""Depth analysis, the (d1, d2, gamma) sweep and the analysis notebook, end to end on a tiny contractive model.

One module fixture runs experiments/measure_depths.py and sweep.py in process (their
configs/sweeps/*.py 'tiny' presets: random huginn:tiny, contraction 0.7, one or two 10-token prompts, 16 new
tokens), the sweep first stopped after two rows (a killed sweep) with a torn line appended, then resumed. The
tests check the cost identity and Theorem 1 on the engine's stats, resumability, the tables and the notebook.
Every decode uses the same shapes (prompt bucket 16, cache 32), so each program compiles once per module.
"""

import dataclasses
import json
import math
import os

import numpy as np
import pytest

import helpers
import loopspec_jax
from loopspec_jax import api
from loopspec_jax import methods
from loopspec_jax.analysis import depth_metrics as DA
from loopspec_jax.analysis import theory
from loopspec_configs import models as model_configs
from loopspec_configs.sweeps import bundled as bundled_config
from loopspec_configs.sweeps import default as sweep_config
from loopspec_configs.sweeps import depths as depths_config
from loopspec_jax.decoding.stats import DecodeStats
from loopspec_experiments import measure_depths
from loopspec_experiments import sweep
from loopspec_jax.experiment import sweep_grid
from loopspec_jax.experiment import sweep_stats

_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the notebook is notebooks/ of the checkout


def numpy_model(spec: str, contraction: float, seed: int = 0):
  """The 'random:<family>:<variant>' model with the init scales of model.init_params, drawn with numpy.

  Eager jax.random compiles one kernel per parameter shape (~25 s for huginn:tiny on a busy 2-core
  machine); the tests only need some tiny contractive model, not those exact weights.
  """
  cfg = model_configs.model_config(spec[len("random:") :])
  params = helpers.numpy_params(cfg, contraction, seed)
  return api.LoopedModel(cfg, params)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  out = tmp_path_factory.mktemp("depth_sweep")
  dcfg = depths_config.get_config("tiny")
  dcfg.out_dir = str(out / "depths")
  dcfg.progress = False
  scfg = sweep_config.get_config("tiny")
  scfg.out_dir = str(out / "sweep")
  scfg.depths_json = str(out / "depths" / "depths_{task}_{sampling}.json")
  scfg.progress = False
  model = numpy_model(dcfg.model, dcfg.contraction, dcfg.seed)
  summaries = measure_depths.run_depths(dcfg, model)
  jsonl = os.path.join(scfg.out_dir, "sweep.jsonl")
  scfg.stop_after = 2
  with pytest.raises(sweep.SweepInterrupted):
    sweep.run_sweep(scfg, model)
  partial = DA.read_jsonl(jsonl)
  with open(jsonl, "a") as f:  # a writer killed mid-line
    f.write('{"key": "torn')
  scfg.stop_after = None
  scfg.interleave_ar = True  # the configurations left after the interruption time AR passes beside their own
  result = sweep.run_sweep(scfg, model)
  rcfg = scfg.copy_and_resolve_references()
  rcfg.configs = ""  # the replay covers the whole feasible grid
  rcfg.replay_prompts = scfg.num_prompts  # the engine's prompts (the depth records cover them)
  replay = sweep.replay_rows(rcfg, model)
  return {
      "out": out,
      "dcfg": dcfg,
      "scfg": scfg,
      "model": model,
      "summaries": summaries,
      "partial": partial,
      "result": result,
      "replay": replay,
      "jsonl": jsonl,
  }


def depth_record(run, index=0):
  recs = DA.read_jsonl(os.path.join(run["dcfg"].out_dir, "depths.jsonl"))
  return next(r for r in recs if r["index"] == index)


def test_cost_identity_and_theorem1_on_the_engine(run):
  """gamma from counts == stats == R / C(count rates); ticks match the identity; greedy restarts <= d2 misses."""
  model, scfg = run["model"], run["scfg"]
  r = model.config.recurrence
  d1, d2 = 1, 4
  prompt = depth_record(run)["prompt"]
  res = loopspec_jax.generate(
      model,
      [prompt],
      max_new_tokens=scfg.max_new_tokens,
      method="loopspec",
      d1=d1,
      d2=d2,
      lane_capacity=scfg.lane_capacity,
      request_ids=[0],
  )
  s = res.stats
  n, c = s["tokens_generated"], s["commits"]
  rej1 = c["second"] + c["restart"]
  assert n == scfg.max_new_tokens == c["first"] + c["second"] + c["restart"]
  assert 0 < rej1 < n, "the model should reject some first proposals, not all"
  g = theory.gamma_from_counts(r, d1, d2, n, rej1, c["restart"])
  assert g == pytest.approx(s["mean_accepted_length"], rel=1e-12)
  assert g == pytest.approx(r / theory.expected_cost(r, d1, d2, rej1 / n, c["restart"] / n), rel=1e-12)
  pred = DA.predicted_loopspec(r, d1, d2, n, s["reject_first"], c["restart"])
  assert s["skipped_spawns"] == 0
  assert s["reject_first"] == rej1  # no skipped spawns: a restart is exactly a failed cascade
  assert pred["predicted_gamma"] == pytest.approx(g, rel=1e-12)
  # The pipeline's ticks: R steps to the first commit, then each commit costs d1 / d2 / R by its source.
  pr = s["per_request"]
  cost = {0: r, 1: d1, 2: d2}
  cycles = n * d1 + rej1 * (d2 - d1) + c["restart"] * (r - d2)
  assert pr["ticks"][0] * d1 == r + cycles - cost[pr["last_source"][0]]
  # Theorem 1 (greedy): P(restart) <= P(argmax p_d2 != argmax p_R), on the same decoded tokens.
  rec = depth_record(run)
  assert res.tokens[0] == rec["tokens"]  # lossless: LoopSpec decodes the AR tokens the depths were measured on
  miss_d2 = rec["n"] - rec["agree"][d2 - 1]
  assert c["restart"] <= miss_d2
  eps2 = rec["tv_sum"][d2 - 1] / rec["n"]
  assert theory.theorem1_check(c["restart"] / n, eps2, gated=True)["holds"]


def test_measure_depths_outputs_and_resume(run):
  dcfg = run["dcfg"]
  s = run["summaries"][("random", "greedy")]
  r = run["model"].config.recurrence
  assert s["depths"] == list(range(1, r + 1)) and s["positions"] == dcfg.num_prompts * dcfg.max_new_tokens
  assert s["agreement"][-1] == 1.0 and s["mean_tv"][-1] == 0.0 and s["mean_kl"][-1] == 0.0
  assert all(0.0 <= t <= 1.0 for t in s["mean_tv"])
  # Greedy: one-hot distributions, so TV is the disagreement rate.
  np.testing.assert_allclose(s["mean_tv"], s["disagreement"], atol=1e-12)
  assert s["fits"]["envelope"] and s["fits"]["least_squares"]
  env = s["fits"]["envelope"]
  d = np.arange(1, r)
  assert np.all(theory.power_law(d, env["beta"], env["alpha"]) >= np.asarray(s["mean_tv"][:-1]) - 1e-12)
  t2 = s["theorem2"]
  assert tuple(t2["best_feasible"]) == theory.best_feasible_depths(r, env["beta"], env["alpha"], include_single=True)
  path = measure_depths.summary_path(dcfg.out_dir, "random", "greedy")
  with open(path) as f:
    assert json.load(f)["mean_tv"] == s["mean_tv"]
  assert os.path.getsize(measure_depths.summary_path(dcfg.out_dir, "random", "greedy", "png")) > 1000
  jsonl = os.path.join(dcfg.out_dir, "depths.jsonl")
  before = open(jsonl).read()
  again = measure_depths.run_depths(dcfg, run["model"])  # resumed: every prompt is skipped
  assert open(jsonl).read() == before and len(DA.read_jsonl(jsonl)) == dcfg.num_prompts
  assert again[("random", "greedy")]["mean_tv"] == s["mean_tv"]


def top_p_probs(z, top_p):
  """Numpy reference of process_logits' softmax + nucleus filter (no top-k), renormalised."""
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  order = np.argsort(-p, axis=-1, kind="stable")
  ps = np.take_along_axis(p, order, -1)
  before = np.cumsum(ps, -1) - ps
  keep_sorted = before < top_p
  keep = np.zeros_like(keep_sorted)
  np.put_along_axis(keep, order, keep_sorted, -1)
  q = np.where(keep, p, 0.0)
  return q / q.sum(-1, keepdims=True)


def test_depth_metrics_match_readouts(run):
  """The jitted per-depth metrics equal TV / argmax computed from api.readouts, also when sampling."""
  model = run["model"]
  rec = depth_record(run, 1)
  prompt, gen = rec["prompt"], rec["tokens"]
  logits = loopspec_jax.readouts(model, prompt + gen)[:, len(prompt) - 1 : len(prompt) - 1 + len(gen)]
  setting = {"temperature": 0.8, "top_p": 0.9}
  m = DA.depth_metrics(model, prompt, gen, setting, n_pos=run["dcfg"].max_new_tokens)
  p = top_p_probs(logits.astype(np.float64) / setting["temperature"], setting["top_p"])
  np.testing.assert_allclose(m["tv"], 0.5 * np.abs(p - p[-1]).sum(-1), atol=2e-5)
  np.testing.assert_array_equal(m["agree"], (logits.argmax(-1) == logits[-1].argmax(-1)).astype(float))
  logq = np.log(np.maximum(p, DA.KL_EPS))
  kl = np.sum(np.where(p[-1] > 0, p[-1] * (np.log(np.maximum(p[-1], DA.KL_EPS)) - logq), 0.0), -1)
  np.testing.assert_allclose(m["kl"], kl, atol=2e-4)  # p_r filtered to 0 where p_R > 0: the eps guard
  np.testing.assert_allclose(np.sum(m["agree"], 1), rec["agree"])  # greedy agreement is the same argmax test


def test_sweep_killed_and_resumed(run):
  """The interrupted run kept its rows; the resumed run added the rest once; the torn line is gone."""
  scfg = run["scfg"]
  rows = DA.read_jsonl(run["jsonl"])
  specs = sweep.method_specs(scfg, run["model"].config.recurrence)
  assert len(run["partial"]) == 2 and run["partial"][0]["method"] == "ar"
  keys = [x["key"] for x in rows]
  assert len(keys) == len(set(keys)) == 1 + len(specs)
  assert rows[:2] == run["partial"]
  assert open(run["jsonl"]).read().endswith("}\n") and "torn" not in open(run["jsonl"]).read()
  assert {x["label"] for x in rows} == {"ar"} | {sweep_grid.row_label(m) for m in specs}
  assert [sweep_grid.row_label(m) for m in specs] == ["loopspec(d1=1,d2=4)", "chain(d1=2,gamma=2)"]
  before = open(run["jsonl"]).read()
  again = sweep.run_sweep(scfg, run["model"])  # nothing left to do
  assert open(run["jsonl"]).read() == before
  assert [x["key"] for x in again["rows"]] == keys


def test_sweep_rows_and_table(run):
  rows = run["result"]["rows"]
  r = run["model"].config.recurrence
  ls = [x for x in rows if x["method"] == "loopspec"]
  ch = [x for x in rows if x["method"] == "chain"]
  assert ls and ch
  for x in ls + ch:
    assert x["identical_to_ar"] is True  # greedy: lossless
    assert x["wall_clock_ratio"] > 0 and x["decode_seconds_median"] > 0
  for x in ls:
    n, c = x["tokens"], x["commits"]
    rej1 = c["second"] + c["restart"]
    assert x["mean_accepted_length"] == pytest.approx(
        r / theory.expected_cost(r, x["d1"], x["d2"], rej1 / n, None if x["d2"] is None else c["restart"] / n)
    )
    assert x["predicted_gamma"] == pytest.approx(x["mean_accepted_length"])  # no skipped spawns here
    assert x["p_restart"] == c["restart"] / n and 0 <= x["gate_open_rate"] <= 1
    eps2 = run["summaries"][("random", "greedy")]["mean_tv"][x["d2"] - 1]
    assert x["eps2"] == pytest.approx(eps2) and x["theorem1_applies"] and x["theorem1"]["holds"]
  for x in ch:  # gamma on LoopSpec's scale (R * tokens / sequential steps); tokens per verify pass beside it
    assert 1.0 <= x["tokens_per_round"] <= x["draft_len"] + 1
    assert x["mean_accepted_length"] == pytest.approx(
        theory.chain_accepted_length(r, x["d1"], x["draft_len"], x["tokens"], x["rounds"])
    )
  pred = run["result"]["predictions"][("random", "greedy")]
  assert pred is not None and pred["best_feasible"]
  table = open(os.path.join(run["scfg"].out_dir, "sweep.md")).read()
  assert "**measured best**" in table and "predicted best" in table and "(d1*, d2*)" in table


@pytest.mark.slow  # executes the whole notebook (~12 s)
def test_notebook_executes(run, monkeypatch):
  nbformat = pytest.importorskip("nbformat")
  from nbconvert.preprocessors import ExecutePreprocessor

  figs = run["out"] / "figures"
  monkeypatch.setenv("SWEEP_JSONL", run["jsonl"])
  monkeypatch.setenv("DEPTHS_JSON", run["scfg"].depths_json)
  monkeypatch.setenv("FIG_DIR", str(figs))
  nb = nbformat.read(os.path.join(_ROOT, "notebooks", "sweep_analysis.ipynb"), as_version=4)
  ExecutePreprocessor(kernel_name="python3", timeout=600).preprocess(nb, {"metadata": {"path": _ROOT}})
  names = sorted(os.listdir(figs))
  for kind in ("depth_tv", "heatmaps", "gamma_pred", "chain", "commits", "wall_clock"):
    assert f"{kind}_random_greedy.png" in names, names
    assert os.path.getsize(figs / f"{kind}_random_greedy.png") > 1000
  model = run["scfg"].model  # one model: the per-model figures are named after it
  for name in (f"depth_curves_{model}.png", f"gamma_grid_{model}.png"):
    assert name in names and os.path.getsize(figs / name) > 1000, names


def test_replay_equals_the_engine(run):
  """Greedy replay from the depth agreement commits exactly what the engine committed (LoopSpec and chain)."""
  engine = {x["label"]: x for x in run["result"]["rows"] if x["method"] != "ar"}
  replay = {x["label"]: x for x in run["replay"]["rows"]}
  r = run["model"].config.recurrence
  assert len([x for x in replay.values() if x["method"] == "loopspec"]) == len(theory.feasible_configs(r, True))
  assert engine and set(engine) <= set(replay)
  for label, x in engine.items():
    y = replay[label]
    assert y["commits"] == x["commits"], label
    assert y["per_prompt"] == x["per_prompt"], label
    assert y["mean_accepted_length"] == pytest.approx(x["mean_accepted_length"], rel=1e-12), label
    if x["method"] == "chain":
      assert y["rounds"] == x["rounds"]
  assert os.path.exists(os.path.join(run["scfg"].out_dir, "replay.md"))


def test_interleaved_wall_clock(run):
  """Rows measured after the interruption pair each timed pass with an AR pass taken just before it."""
  rows = [x for x in run["result"]["rows"] if x["method"] != "ar"]
  late = [x for x in rows if x["key"] not in {p["key"] for p in run["partial"]}]
  assert late
  for x in late:
    assert len(x["ar_decode_seconds_interleaved"]) == len(x["decode_seconds_all"]) == run["scfg"].repeats
    assert x["wall_clock_ratio"] == pytest.approx(np.median(x["wall_clock_ratios_paired"]))
    assert x["wall_clock_ratio_reference"] > 0


def test_row_labels_and_per_prompt_counts():
  """Row labels keep the keys of rows written before methods were objects (d2=None, the drafter's config name);
  per-prompt counts come from each prompt's DecodeStats; draft and lookup are the separate drafters."""
  assert sweep_grid.row_label(methods.AR()) == "ar"
  assert sweep_grid.row_label(methods.LoopSpec(d1=2, d2=None, lane_capacity=64)) == "loopspec(d1=2,d2=None)"
  assert sweep_grid.row_label(methods.Chain(d1=2, gamma=4)) == "chain(d1=2,gamma=4)"
  assert (
      sweep_grid.row_label(methods.Draft(gamma="auto"), "tiny-raven-draft")
      == "draft(draft_model=tiny-raven-draft,gamma=auto)"
  )
  assert sweep_grid.row_label(methods.Lookup(ngram=3, gamma=4)) == "lookup(ngram=3,gamma=4)"
  assert {name for name, c in methods.REGISTRY.items() if c.separate_drafter} == {"draft", "lookup"}
  settings = {"recurrence": 4, "gamma": 2, "gamma_max": 2, "draft_layer_calls": 1.0, "verify_layer_calls": 4.0}
  rows = {"tokens": [6], "rounds": [3], "accepted": [3], "first": [3], "drafted": [6], "examined": [5], "restart": [3]}
  one = DecodeStats("draft", settings, rows, {"iterations": 3, "draft_steps": 6})
  assert sweep_stats.per_prompt_counts([one, one]) == [[6, 3, 3, 6, 5]] * 2
  agg = DecodeStats.total([one, one]).summary()
  assert agg["tokens_per_round"] == 2.0 and agg["alpha"] == pytest.approx(0.6) and agg["mean_gamma"] == 2.0
  assert agg["draft_cost_share"] == pytest.approx(12 / (12 + 24))
  m = methods.Draft(gamma=2)
  assert sweep_stats.gamma_standard_error(m, 4, [[6, 3, 3, 6, 5], [6, 2, 4, 4, 4]]) == pytest.approx(0.5)


def test_standard_errors_and_fit_quality():
  """Cluster standard errors, the jackknife, the fit-quality numbers and the fitted curve's gamma on known inputs."""
  # Two prompts of 10 positions with rates 0.2 and 0.6: pooled 0.4, residuals -2 and +2.
  se = DA.ratio_standard_error([[2.0], [6.0]], [10, 10])
  assert se[0] == pytest.approx(math.sqrt(2 / 1 * (4 + 4)) / 20)
  assert DA.ratio_standard_error([[3.0]], [10])[0] == 0.0  # one prompt: no spread to measure
  assert sweep.jackknife_se([1.0, 1.0, 1.0]) == 0.0
  assert sweep.jackknife_se([0.0, 2.0]) == pytest.approx(1.0)
  d = np.arange(1, 9, dtype=float)
  q = theory.power_law_fit_quality(d, 0.3 * d**-1.5, 0.3, 1.5)
  assert q["r2"] == pytest.approx(1.0) and q["rmse_log"] == pytest.approx(0.0, abs=1e-12)
  assert q["points"] == 8 and q["min_ratio"] == pytest.approx(1.0)
  r, beta, alpha = 32, 0.2, 1.0
  c = theory.curve_cost(r, 2, 8, beta, alpha)
  assert c == pytest.approx(2 + 6 * 0.1 + 24 * 0.025)
  assert theory.curve_gamma(r, 2, 8, beta, alpha) == pytest.approx(r / c)
  assert theory.curve_gamma(r, 2, None, beta, alpha) == pytest.approx(r / (2 + 30 * 0.1))
  # The fitted curve's point estimate is never below Theorem 2's guaranteed R / J.
  for d1, d2 in theory.feasible_configs(r, include_single=True):
    assert theory.curve_gamma(r, d1, d2, beta, alpha) >= theory.predicted_gamma_bound(r, d1, d2, beta, alpha) - 1e-12


def test_replay_counts_by_hand():
  """replay_loopspec_counts / replay_chain_counts on a hand-made agreement table (R = 4)."""
  # positions:        0  1  2  3  4  5
  agree = np.array(
      [
          [1, 0, 0, 1, 1, 0],  # depth 1
          [1, 1, 0, 1, 1, 0],  # depth 2
          [1, 1, 1, 1, 1, 0],  # depth 3
          [1, 1, 1, 1, 1, 1],  # depth 4 = R
      ],
      bool,
  )
  assert DA.replay_loopspec_counts(agree, 1, 2) == {"first": 3, "second": 1, "restart": 2, "n": 6, "reject_first": 3}
  assert DA.replay_loopspec_counts(agree, 1, 3)["second"] == 2
  assert DA.replay_loopspec_counts(agree, 1, None)["restart"] == 3
  # chain at depth 1, 2 drafts per round: [0] accepted + 1 -> i=2; [2] rejected -> i=3; [3, 4] accepted + 1
  # (position 5) -> i=6: 3 rounds, 3 accepted drafts.
  assert DA.replay_chain_counts(agree, 1, 2) == {"n": 6, "rounds": 3, "accepted": 3}


@pytest.mark.slow
def test_bundled_model_pipeline(tmp_path):
  """The issue-13 pipeline on the bundled tiny-raven (sweeps/bundled.py:ci): depth curve on one GSM8K prompt,
  two engine configurations with interleaved AR timing, the greedy replay of every feasible pair, and the
  engine's commits equal to the replay's."""
  dcfg = depths_config.get_config("bundled_ci")
  dcfg.out_dir = str(tmp_path / "depths")
  dcfg.progress = False
  scfg = bundled_config.get_config("ci")
  scfg.out_dir = str(tmp_path / "sweep")
  scfg.depths_json = str(tmp_path / "depths" / "depths_{task}_{sampling}.json")
  scfg.progress = False
  model = loopspec_jax.load(dcfg.model)
  summary = measure_depths.run_depths(dcfg, model)[("gsm8k", "greedy")]
  assert summary["positions"] == dcfg.max_new_tokens and summary["agreement"][-1] == 1.0
  assert os.path.exists(os.path.join(dcfg.out_dir, "depth_fits.md"))
  res = sweep.run_sweep(scfg, model)
  rows = {x["label"]: x for x in res["rows"]}
  assert set(rows) == {"ar", "loopspec(d1=2,d2=8)", "loopspec(d1=2,d2=None)"}
  rcfg = scfg.copy_and_resolve_references()
  rcfg.configs = ""
  replay = {x["label"]: x for x in sweep.replay_rows(rcfg, model)["rows"]}
  assert len(replay) == len(theory.feasible_configs(32, include_single=True))
  for label, x in rows.items():
    if x["method"] == "ar":
      continue
    assert x["identical_to_ar"] is True
    assert len(x["ar_decode_seconds_interleaved"]) == scfg.repeats
    y = replay[label]
    assert x["commits"]["first"] == y["commits"]["first"], label  # first proposals never depend on lane space
    if x["skipped_spawns"] == 0:
      assert x["commits"] == y["commits"], label
  assert "measured best by gamma" in res["table"]
  # Theorem 2's line appears exactly when the depth curve had two depths above the TV floor to fit.
  assert ("Theorem 2 from" in res["table"]) == (summary["theorem2"] is not None)


@pytest.mark.slow  # compiles draft and lookup decoders for a sweep (~18 s)
def test_sweep_draft_and_lookup_rows(tmp_path):
  """A sweep with draft-model and prompt-lookup rows (the target's own weights at R = 1 as the separate drafter):
  their rows carry tokens per verify pass, acceptance, alpha, the draft cost share and the wall-clock ratio, the
  table compares them with AR, and a rerun skips every row."""
  scfg = sweep_config.get_config("tiny")
  scfg.out_dir = str(tmp_path / "sweep")
  scfg.depths_json = ""
  scfg.progress = False
  scfg.max_new_tokens = 8
  scfg.d1s, scfg.configs, scfg.chain_d1 = "0", "", None  # no LoopSpec pair (no d1 = 0) and no chain: baselines only
  scfg.draft_model, scfg.draft_gammas = "shallow", "2"
  scfg.lookup_ngram, scfg.lookup_gammas = 2, "2"
  scfg.interleave_ar = True
  model = numpy_model(scfg.model, scfg.contraction, scfg.seed)
  drafter = dataclasses.replace(model, config=model.config.replace(recurrence=1), source="shallow")
  res = sweep.run_sweep(scfg, model, draft_model=drafter)
  rows = {x["label"]: x for x in res["rows"]}
  assert set(rows) == {"ar", "draft(draft_model=shallow,gamma=2)", "lookup(ngram=2,gamma=2)"}
  for label, x in rows.items():
    if x["method"] == "ar":
      continue
    assert x["identical_to_ar"] is True, label  # greedy: lossless
    assert x["wall_clock_ratio"] > 0 and len(x["ar_decode_seconds_interleaved"]) == scfg.repeats
    n, rounds = x["tokens"], x["rounds"]
    assert n == scfg.max_new_tokens * scfg.num_prompts and 1 <= rounds <= n
    assert x["tokens_per_round"] == x["mean_accepted_length"] == pytest.approx(n / rounds)
    assert x["commits"]["first"] == n - rounds  # every pass commits its accepted drafts plus one target token
    assert x["acceptance_rate"] == pytest.approx(x["commits"]["first"] / max(x["drafted"], 1))
    assert x["draft_len"] == 2 and x["mean_gamma"] <= 2
    assert x["per_prompt"][0][:3] == [n, rounds, x["commits"]["first"]]
  dr = rows["draft(draft_model=shallow,gamma=2)"]
  assert dr["drafted"] > 0 and 0 <= dr["alpha"] <= 1 and 0 < dr["draft_cost_share"] < 1
  assert dr["draft_model"] == "shallow"
  assert rows["lookup(ngram=2,gamma=2)"]["draft_cost_share"] == 0.0 and rows["lookup(ngram=2,gamma=2)"]["ngram"] == 2
  table = open(os.path.join(scfg.out_dir, "sweep.md")).read()
  assert table == res["table"] + "\n"
  assert "| draft shallow, gamma=2 |" in table and "| lookup ngram=2, gamma=2 |" in table
  assert "tokens / verify pass" in table and "draft cost share" in table
  jsonl = os.path.join(scfg.out_dir, "sweep.jsonl")
  before = open(jsonl).read()
  again = sweep.run_sweep(scfg, model, draft_model=drafter)  # resumed: every key is there
  assert open(jsonl).read() == before
  assert [x["key"] for x in again["rows"]] == [x["key"] for x in res["rows"]]
