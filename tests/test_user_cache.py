"""The user cache of the console scripts (loopspec_jax/user_cache.py): plans on disk, the compile cache folder,
and what the entry points do with compile seconds and bad settings."""

import json
import os

import jax
import pytest

import loopspec_jax as lj
from loopspec_jax import methods
from loopspec_jax import planner
from loopspec_jax import user_cache
from loopspec_jax.decoding import compile_clock
from loopspec_jax.experiment import timing
from loopspec_experiments import common
from loopspec_experiments import generate


@pytest.fixture
def plan_folder(tmp_path):
  """Plans kept under tmp_path/plans for the test (the library default is memory only)."""
  user_cache._STATE["plans"] = str(tmp_path / "plans")
  yield tmp_path / "plans"
  user_cache.disable_plans()


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv(user_cache.ENV, str(tmp_path / "c"))
  assert user_cache.cache_dir() == str(tmp_path / "c")
  monkeypatch.setenv(user_cache.ENV, "off")
  assert user_cache.cache_dir() is None and user_cache.enable() is None
  monkeypatch.delenv(user_cache.ENV)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert user_cache.cache_dir() == str(tmp_path / "xdg" / "loopspec_jax")


def test_enable_sets_the_compilation_cache(tmp_path):
  old = jax.config.jax_compilation_cache_dir
  try:
    assert user_cache.enable(str(tmp_path)) == str(tmp_path)
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax") and (tmp_path / "jax").is_dir()
  finally:
    jax.config.update("jax_compilation_cache_dir", old)
    user_cache.disable_plans()


def test_plans_survive_the_process_and_only_stable_keys_are_written(plan_folder):
  model = lj.load("tiny-raven")
  key = planner.plan_key(model, [[1, 2, 3]], 8, True, lj.Auto())
  assert user_cache.key_text(key) is not None
  plan = {"choice": "chain:d1=2,gamma=4", "top": [{"x_ar": 1.5}]}
  planner.PLANS[key] = (lj.Chain(d1=2, gamma=4), plan)
  fresh = user_cache.PlanStore(salt=planner.PLANS._salt)  # what the next process sees
  assert key in fresh
  method, got = fresh[key]
  assert method == lj.Chain(d1=2, gamma=4) and got["choice"] == plan["choice"] and "from_disk" in got
  assert key not in user_cache.PlanStore(salt="other code")  # another planner's plans are never read
  random_model = common.resolve_model("random:huginn:tiny", contraction=0.05, seed=0)
  unstable = planner.plan_key(random_model, [[1, 2, 3]], 8, True, lj.Auto())
  assert user_cache.key_text(unstable) is None
  n = len(os.listdir(plan_folder))
  planner.PLANS[unstable] = (lj.AR(), {"choice": "ar"})
  assert len(os.listdir(plan_folder)) == n and unstable in planner.PLANS  # memory only
  planner.clear_plans()


def test_a_damaged_plan_file_is_a_miss(plan_folder):
  store = user_cache.PlanStore(salt="t")
  key = ("k", ("source", "/x"))
  store[key] = (lj.AR(), {"choice": "ar"})
  (path,) = [plan_folder / f for f in os.listdir(plan_folder)]
  path.write_text("{not json")
  assert key not in user_cache.PlanStore(salt="t")
  path.write_text(json.dumps({"key": repr(key), "method": {"class": "os:system", "args": {}}, "plan": {}}))
  assert key not in user_cache.PlanStore(salt="t")  # only the package's own method classes are built


def test_chain_and_loopspec_take_the_family_depths_when_none_are_given():
  model = lj.load("tiny-raven")  # huginn, R = 32
  assert methods.build_checked("chain", model) == lj.Chain(d1=2, gamma=methods.DEFAULT_CHAIN_GAMMA)
  assert methods.build_checked("loopspec", model) == lj.LoopSpec(d1=2, d2=8)
  assert methods.build_checked("loopspec:d1=4", model) == lj.LoopSpec(d1=4)  # given d1: single proposal
  assert methods.build_checked("loopspec", lj.load("tiny-ouro")) == lj.LoopSpec(d1=1, d2=2)
  with pytest.raises(ValueError, match="d1"):
    methods.build_checked("chain:d1=40", model)


def test_a_bad_setting_is_one_line_not_a_traceback(capsys):
  def main(argv):
    raise ValueError("chain needs an integer draft depth 1 <= d1 < R=32, got 40")

  with pytest.raises(SystemExit) as e:
    common.main_with_clear_errors(main)(["x"])
  err = capsys.readouterr().err.strip()
  assert e.value.code == 2 and len(err.splitlines()) == 1 and "error: chain needs" in err and "--config" in err


def test_a_persistent_cache_hit_counts_its_read_not_the_compile_it_saved():
  """jax's cache events (time a hit saved, its retrieval inside the backend-compile span) add nothing."""
  before = compile_clock.seconds()
  jax.monitoring.record_event_duration_secs("/jax/compilation_cache/compile_time_saved_sec", 30.0)
  jax.monitoring.record_event_duration_secs("/jax/compilation_cache/cache_retrieval_time_sec", 0.2)
  assert compile_clock.seconds() == before
  jax.monitoring.record_event_duration_secs("/jax/core/compile/backend_compile_duration", 0.25)
  assert compile_clock.seconds() == pytest.approx(before + 0.25)


def test_compile_seconds_are_counted_apart():
  before = compile_clock.seconds()
  jax.jit(lambda x: x * 3 + 1)(jax.numpy.ones(7)).block_until_ready()
  assert compile_clock.seconds() > before
  line = generate.speed_line(
      {
          "tokens_generated": 8,
          "decode_seconds": 0.5,
          "tokens_per_second": 16.0,
          "prefill_seconds": 0.1,
          "compile_seconds": 12.0,
      }
  )
  assert "16.0 tokens/s" in line and "compiling took 12.0 s more (not counted" in line


def test_warmup_note_says_what_the_first_call_did():
  res = lj.GenerateResult(
      [[1]],
      {
          "compile_seconds": 3.2,
          "plan": {"cached": False, "plan_seconds": 4.0, "picks": ["ar", "lookup:gamma=4"], "choice": "ar"},
      },
  )
  note = timing.warmup_note(res, 9.0)
  assert note == "9.0 s (3.2 s compiling), planned in 4.0 s: picked ar then lookup:gamma=4"
  assert timing.warmup_note(lj.GenerateResult([[1]], {"compile_seconds": 0.0}), 0.2) == "0.2 s"
