"""The library's experiment harness (loopspec_jax/experiment/): settings values, result files, the host,
model resolution, prompt sets and benchmark timing. Fast: fake `generate` calls, no compiles."""

import json
import os
import types

import ml_collections
import numpy as np
import pytest

import loopspec_jax
from loopspec_jax import methods
from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding.stats import DecodeStats
from loopspec_jax.experiment import depths
from loopspec_jax.experiment import files
from loopspec_jax.experiment import host
from loopspec_jax.experiment import models
from loopspec_jax.experiment import prompts
from loopspec_jax.experiment import settings
from loopspec_jax.experiment import timing


# ---------------------------------------------------------------------------------------------------
# settings, files, host
# ---------------------------------------------------------------------------------------------------
def test_settings_values_spell_none_once():
  assert settings.parse_optional_int("none") is None and settings.parse_optional_int(" 4 ") == 4
  assert settings.parse_optional_int(None) is None and settings.parse_optional_int(3) == 3
  with pytest.raises(ValueError, match="integer or 'none'"):
    settings.parse_optional_int("4.5")
  assert settings.parse_number("0.25") == 0.25 and settings.parse_number("7") == 7
  assert settings.parse_number("none") is None
  with pytest.raises(ValueError, match="number or 'none'"):
    settings.parse_number("x")
  assert settings.split_list("a, b,,c ") == ["a", "b", "c"] and settings.split_list((1, " x")) == ["1", "x"]


def test_files_are_written_whole_with_numpy_values(tmp_path, capsys):
  path = tmp_path / "sub" / "x.json"
  files.atomic_write_json(str(path), {"a": np.int64(3), "b": np.float32(0.5), "c": np.arange(2)})
  assert json.loads(path.read_text()) == {"a": 3, "b": 0.5, "c": [0, 1]}
  assert os.listdir(path.parent) == ["x.json"]  # no temporary file left beside it
  with pytest.raises(TypeError):
    files.json_default(object())
  files.write_report(str(tmp_path), "bench", {"rows": []}, "| table |\n\n")
  assert (tmp_path / "bench.md").read_text() == "| table |\n"
  assert json.loads((tmp_path / "bench.json").read_text()) == {"rows": []}
  assert "wrote" in capsys.readouterr().out and files.is_main_process()


def test_host_cache_sizes(tmp_path):
  assert [host._cache_bytes(t) for t in ("32K", "8M\n", "1G", "512", "n/a")] == [32 << 10, 8 << 20, 1 << 30, 512, None]
  for i, text in enumerate(("48K", "2048K", "32768K", "bogus")):
    (tmp_path / f"index{i}").mkdir()
    (tmp_path / f"index{i}" / "size").write_text(text + "\n")
  assert host.last_level_cache_bytes(pattern=str(tmp_path / "index*" / "size")) == 32 << 20
  assert host.last_level_cache_bytes(default=7, pattern=str(tmp_path / "none*")) == 7
  assert "CPU cores, jax" in host.machine_description() and host.cpu_model()


# ---------------------------------------------------------------------------------------------------
# models and prompts
# ---------------------------------------------------------------------------------------------------
def _lookup(spec: str) -> ModelConfig:
  from loopspec_configs.models import model_config  # the caller's table (tests may read configs/)

  return model_config(spec)


def test_random_models_need_the_callers_config_table():
  with pytest.raises(ValueError, match="model_config"):
    models.resolve_model("random:ouro:tiny")
  model = models.resolve_model("random:ouro:tiny", model_config=_lookup, dtype="float32")
  assert (model.config.family, model.config.recurrence, model.config.dtype) == ("ouro", 4, "float32")
  cfg = models.model_config_at("huginn:tiny", "bfloat16", 256, _lookup)
  assert (cfg.dtype, cfg.max_len) == ("bfloat16", 256)
  bundled = models.model_config_at("bundled:tiny-raven", "float32", 128)  # bundled: no table needed
  assert bundled.max_len == 128 and bundled.family


def test_model_identity_keeps_contraction_of_random_models_only():
  cfg = ml_collections.ConfigDict(dict(model="random:huginn:tiny", contraction=0.05, seed=3))
  assert models.model_identity(cfg) == {"model": "random:huginn:tiny", "contraction": 0.05, "seed": 3}
  cfg.model = "tiny-raven"
  assert models.model_identity(cfg)["contraction"] is None


def _text_model(max_len: int):
  """A model stand-in whose tokenizer maps each character to one id."""
  cfg = types.SimpleNamespace(max_len=max_len, vocab_size=50)
  return types.SimpleNamespace(config=cfg, encode=lambda text: [ord(c) % 50 for c in text])


def test_prompt_sets():
  a = prompts.random_prompts(50, 3, 5, seed=1)
  assert a == prompts.random_prompts(50, 3, 5, seed=1) and all(len(p) == 5 and max(p) < 50 for p in a)
  model = _text_model(max_len=4096)
  assert prompts.load_prompt_set("random", model, 3, 5, 1) == a
  demo = prompts.load_prompt_set("demo", model, 2, 0, 0)
  assert demo == [model.encode(t) for t in prompts.DEMO_PROMPTS[:2]]
  full = prompts.load_prompt_set("shakespeare", model, 2, 0, 0)
  cut = prompts.load_prompt_set("shakespeare", _text_model(max_len=20), 2, 0, 0)
  assert [len(p) for p in cut] == [min(10, len(p)) for p in full]  # the last max_len // 2 tokens
  assert all(c == f[-len(c) :] for c, f in zip(cut, full))
  model.tokenizer = "a tokenizer"
  assert prompts.demo_prompt_ids(model) == prompts.load_prompt_set("demo", model, 4, 0, 0)
  model.tokenizer = None  # no tokenizer: four fixed pseudo-prompts of 12 ids
  assert [len(p) for p in prompts.demo_prompt_ids(model)] == [12] * 4


# ---------------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------------
def test_rotation_ratios_labels_and_time_line():
  assert [timing.rotated(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
  assert timing.median_ratio([2.0, 4.0, 9.0], [1.0, 1.0, 1.0]) == 4.0
  parsed = methods.parse_list(["ar", "loopspec:d1=2", "loopspec:d1=2,d2=4"])
  assert timing.row_labels(parsed) == ["ar", "loopspec(d1=2)", "loopspec(d1=2,d2=4)"]
  agg = {"ticks": 10, "tokens": 20, "decode_seconds": 0.05}
  line = timing.time_line("loopspec", agg, {"tokens": 10, "decode_seconds": 0.03})
  assert line == "loopspec: 10 ticks, 2.00 tokens/tick, 5.00 ms/tick (AR: 3.00 ms/token)"


def _fake_generate(calls: list, seconds: dict):
  """`generate` that records (request id, method label, kwargs) and takes `seconds[label]` per prompt."""

  def generate(model, batch, *, max_new_tokens, method, seed, request_ids, **kw):
    label = method.label
    calls.append((request_ids[0], label, kw))
    totals = {"decode_seconds": seconds[label], "iterations": max_new_tokens}
    counts = DecodeStats("ar", {}, {"tokens": [max_new_tokens]}, totals)
    return types.SimpleNamespace(counts=counts, tokens=[[batch[0][0]] * max_new_tokens])

  return generate


def test_benchmark_interleaves_repeats_and_takes_medians(monkeypatch):
  calls = []
  seconds = {"ar": 0.2, "loopspec(d1=2)": 0.1}
  monkeypatch.setattr(loopspec_jax, "generate", _fake_generate(calls, seconds))
  res = timing.benchmark(
      None, [[1], [2]], ["ar", "loopspec:d1=2"], {"temperature": 0.0}, max_new_tokens=3, repeats=2, progress=False
  )
  # warm-up (ar, ls), repeat 0 (ar, ls), repeat 1 rotated (ls, ar); every prompt alone, request id = its index
  ar, ls = "ar", "loopspec(d1=2)"
  assert [l for _, l, _ in calls[::2]] == [ar, ls, ar, ls, ls, ar] and [i for i, _, _ in calls] == [0, 1] * 6
  ls = res["loopspec(d1=2)"]
  assert ls["method"] == "loopspec(d1=2)" and ls["identical_to_ar"] and ls["tokens"] == 6
  assert ls["decode_seconds_all"] == pytest.approx([0.2, 0.2]) and ls["wall_clock_ratio_median"] == pytest.approx(2.0)
  assert ls["prompt_ratios"] == pytest.approx([2.0, 2.0]) and ls["prompt_ratio_min"] == pytest.approx(2.0)
  assert res["ar"]["wall_clock_ratio_median"] == pytest.approx(1.0)
  with pytest.raises(ValueError, match="first method must be 'ar'"):
    timing.benchmark(None, [[1]], ["loopspec:d1=2"], {}, max_new_tokens=1, repeats=1, progress=False)


def test_measure_interleaves_an_ar_pass_before_each_timed_pass(monkeypatch):
  calls = []
  monkeypatch.setattr(loopspec_jax, "generate", _fake_generate(calls, {"ar": 0.3, "chain(d1=1,gamma=2)": 0.1}))
  m = methods.Chain(d1=1, gamma=2)
  kw = dict(max_new_tokens=2, repeats=2, seed=0, eos_id=5)
  agg, times, outputs, ar_times, stats = timing.measure(None, [[1], [2]], m, {}, **kw, interleave_ar=True)
  assert [l for _, l, _ in calls] == ["chain(d1=1,gamma=2)"] * 2 + (["ar"] * 2 + ["chain(d1=1,gamma=2)"] * 2) * 2
  assert all(k == {"eos_id": 5} for _, _, k in calls)
  assert times == pytest.approx([0.2, 0.2]) and ar_times == pytest.approx([0.6, 0.6])
  assert outputs == [[1, 1], [2, 2]] and agg["tokens"] == 4 and len(stats) == 2
  assert timing.measure(None, [[1]], m, {}, **kw)[3] == []  # no AR passes unless asked


def test_decode_interleaved_keeps_each_prompts_median_call(monkeypatch):
  """Per prompt: one untimed call per method, then rounds timing each method once in turn; the call of median
  decode time gives the prompt's tokens and counts."""
  calls, times = [], iter([9.0, 9.0, 0.3, 0.2, 0.1, 0.4, 0.2, 0.6])

  def generate(model, batch, *, max_new_tokens, seed, request_ids, method, **kw):
    calls.append((request_ids[0], method))
    secs = next(times)
    counts = DecodeStats("ar", {}, {"tokens": [max_new_tokens]}, {"decode_seconds": secs, "iterations": 1})
    return types.SimpleNamespace(counts=counts, tokens=[[int(secs * 10)]], stats={"decode_seconds": secs})

  monkeypatch.setattr(loopspec_jax, "generate", generate)
  runs = [("a", dict(method="ar")), ("b", dict(method="loopspec"))]
  out = timing.decode_interleaved(None, [[1]], runs, max_new_tokens=2, seed=0, repeats=3)
  assert calls == [(0, "ar"), (0, "loopspec")] * 4
  assert out["a"][0] == [[2]] and out["b"][0] == [[4]]  # a: 0.3, 0.1, 0.2 -> 0.2; b: 0.2, 0.4, 0.6 -> 0.4
  assert out["a"][1]["decode_seconds"] == pytest.approx(0.2) and out["b"][1]["tokens"] == 2
  note = timing.warmup_note(types.SimpleNamespace(stats={"compile_seconds": 1.5}), 2.0)
  assert note == "2.0 s (1.5 s compiling)"


def _depth_summary() -> dict:
  """A depth summary of R = 4 as `depth_metrics.summarize_depths` shapes it."""
  fit = {"beta": 0.5, "alpha": 1.25, "r2": 0.98, "rmse_log": 0.1}
  return {
      "recurrence": 4,
      "prompts": 2,
      "positions": 16,
      "depths": [1, 2, 3, 4],
      "agreement": [0.5, 0.75, 0.9, 1.0],
      "agreement_se": [0.05, 0.04, 0.02, 0.0],
      "mean_tv": [0.4, 0.2, 0.1, 0.0],
      "mean_kl": [1.0, 0.5, 0.2, 0.0],
      "fits": {"envelope": dict(fit), "least_squares": dict(fit)},
      "theorem2": {"optimal_continuous": [1.5, 2.5], "best_feasible": [2, None], "predicted_gamma_bound": 1.8},
      "meta": {"model": "m", "task": "random", "sampling_name": "greedy"},
  }


def test_depth_tables():
  s = _depth_summary()
  assert depths.summary_path("out", "gsm8k", "greedy", "png") == os.path.join("out", "depths_gsm8k_greedy.png")
  text = depths.format_summary(s, "m / random / greedy")
  assert text.startswith("## m / random / greedy: 16 positions over 2 prompts")
  assert "| 2 | 0.750 | 0.2000 | 0.5000 |" in text and "best feasible (2, None)" in text
  table = depths.fits_markdown([s])
  assert "agree d=4" in table and "agree d=8" not in table  # only depths every summary has
  assert "| m | random | greedy | 2 x 8 | 0.500 ± 0.050 |" in table and "| (1.50, 2.50) | (2, -) |" in table


def test_interleaved_calls_warm_up_then_take_turns():
  order = []
  calls = {k: (lambda k=k: order.append(k) or len(order)) for k in ("a", "b", "c")}
  out = timing.interleaved(calls, repeats=2)
  assert order == ["a", "b", "c"] * 3 and out == {"a": [4, 7], "b": [5, 8], "c": [6, 9]}
  order.clear()
  out = timing.interleaved(calls, repeats=2, rotate=True)
  assert order == ["a", "b", "c", "a", "b", "c", "b", "c", "a"] and out["a"] == [4, 9]
  assert timing.medians({"a": [3.0, 1.0, 2.0]}) == {"a": 2.0}


def test_replace_block_rewrites_only_its_block(tmp_path):
  page = tmp_path / "page.md"
  page.write_text("# title\nhand text\n<!-- gen -->\nold\n<!-- /gen -->\ntail\n")
  files.replace_block(str(page), "gen", "new\nlines\n")
  assert page.read_text() == "# title\nhand text\n<!-- gen -->\nnew\nlines\n<!-- /gen -->\ntail\n"
  with pytest.raises(ValueError, match="no <!-- other -->"):
    files.replace_block(str(page), "other", "x")
