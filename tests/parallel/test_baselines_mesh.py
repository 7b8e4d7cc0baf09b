"""The classic speculative baselines on a mesh: `method="draft"` and `method="lookup"` on 8 simulated devices.

On meshes (2, 4) and (1, 8) (axes data, model) their greedy tokens equal the one-device tokens and AR's, and
their sampled tokens (temperature 1, top_p 0.9) equal the one-device sampled tokens of the same seed. The
target is huginn:tiny (4 heads: as they are on (2, 4), zero-padded to 8 on (1, 8)). The drafter of those runs
is a random R = 1 model with 3 heads, which divide no model axis: they are laid out in the drafter's own head
layout (`sharding.padded_config(dcfg, mesh)`: 3 -> 4 on (2, 4), where the target needs no padding; 3 -> 8 on
(1, 8)), and decoding must stay exact. On (2, 4) it is placed by `sharding.shard_model` (as `load(..., mesh=)`
does); on (1, 8) its parameters are laid out inside the programs. It mostly disagrees with the target (greedy:
every draft rejected; sampled: some accepted). gamma="auto" runs on (1, 8) with the target's own weights at
R = 1 as the drafter (drafts mostly accepted, so fully accepted rounds and the drafter-cache restore at p0 - 1
run sharded). Also: the drafter's parameters and KV cache are sharded over 'model' (the cache over 'data'
too), and a second call of one configuration does not retrace.

The 8 devices need XLA_FLAGS before jax initialises its backend, so the runs happen in subprocesses (this file
run as a script with --worker, one per mesh, run at once as in tests/parallel/test_sharding.py) that report JSON; every
worker runs with the same flags, so one-device and sharded floats come from the same compiler settings.

The file runs with `-m slow` (three 8-device workers take ~90 s of CPU; the default suite stays near its budget);
lookup runs through chain's sharded entry kinds, which the default suite covers; draft adds the drafter's kind.
"""

import dataclasses
import time

import jax
import numpy as np
import pytest

import helpers  # tests/ is also the worker script's directory
from loopspec_jax import api
from loopspec_configs.models import model_config
from loopspec_jax.parallel import sharding

pytestmark = pytest.mark.slow

XLA_FLAGS = (
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true"
)
WORKER_TIMEOUT_S = 600
N_NEW = 8
MESHES = ((2, 4), (1, 8))
WORKERS = {"one": None, "a": (2, 4), "b": (1, 8)}  # worker name -> its mesh shape (None: one device)
# The batch of test_baselines.py (3 requests: padded to 4 on a data axis of 2) and prompts with repeats (lookup).
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43, 44]]
REPEATS = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 8, 5, 6, 7], [40, 41, 40, 41, 40]]
SAMPLING = {"temperature": 1.0, "top_p": 0.9, "seed": 7}
ODD = dict(num_heads=3, num_kv_heads=3, recurrence=1)  # the 3-head drafter's config overrides of huginn:tiny
DRAFT_LOOP = "loopspec_jax.decoding.draft.decode_loop"


# ---------------------------------------------------------------------------------------------------
# Worker (a subprocess with 8 CPU devices)
# ---------------------------------------------------------------------------------------------------
def _worker(name: str, out_path: str):
  from loopspec_jax.decoding import adaptive

  assert jax.device_count() == 8, jax.devices()
  rec = helpers.record_sharded_calls()  # every sharded program run here, its traces and compiles
  adaptive.AUTO_MAX_GAMMA = 3  # a cheaper compile of gamma="auto"; the rule is the same
  shape = WORKERS[name]
  c0 = time.process_time()
  cfg, dcfg = model_config("huginn:tiny"), model_config("huginn:tiny", **ODD)
  # Weights drawn with numpy (eager jax.random would compile a kernel per parameter shape).
  target = api.LoopedModel(cfg, helpers.numpy_params(cfg, 0.05, seed=0))
  odd = api.LoopedModel(dcfg, jax.tree_util.tree_map(np.asarray, helpers.numpy_params(dcfg, None, seed=1)))
  mesh = None if shape is None else sharding.plan(sharding.make_mesh(shape))
  if shape == (2, 4):
    odd = sharding.shard_model(odd, mesh)  # placed in its padded layout (on the host), as load(..., mesh=) does
  report = {"tokens": {}, "stats": {}, "timings": {}}

  def run(label, prompts, **kw):
    t0 = time.perf_counter()
    res = api.generate(target, prompts, max_new_tokens=N_NEW, mesh=mesh, **kw)
    report["timings"][f"{shape}|{label}"] = round(time.perf_counter() - t0, 2)
    report["tokens"][label] = res.tokens
    report["stats"][label] = {k: res.stats.get(k) for k in ("batch", "tokens_generated", "acceptance_rate")}

  if shape is None:
    run("ar", PROMPTS)
    run("ar_repeats", REPEATS)
  run("draft", PROMPTS, method="draft", draft_model=odd, gamma=2)
  if shape is not None:
    last = [c for c in rec["calls"] if c["name"] == DRAFT_LOOP][-1]
    st, args = last["out"], last["in"]
    report["dcache"] = helpers.sharding_spec(st.dcache.core[0][0])  # [G, B, KV, T, D]
    report["cache"] = helpers.sharding_spec(st.cache.core[0][0])
    dparams = args[3]  # (params, state, sp, dparams) as placed for the program
    report["dparams"] = {k: helpers.sharding_spec(dparams["core"][k]) for k in ("wq", "wk", "wo", "w_gate")}
    report["dparams"]["embed"] = helpers.sharding_spec(dparams["embed"])
  run("lookup", REPEATS, method="lookup", gamma=2)
  run("draft_sampled", PROMPTS, method="draft", draft_model=odd, gamma=2, **SAMPLING)
  run("lookup_sampled", REPEATS, method="lookup", gamma=2, **SAMPLING)
  if shape == (1, 8):
    good = dataclasses.replace(target, config=cfg.replace(recurrence=1), source="shallow1")
    run("draft_auto", PROMPTS, method="draft", draft_model=good, gamma="auto")
  if shape == (2, 4):
    # The same configuration again (other prompts, same shapes and bucket): no retrace of the draft programs.
    traces = rec["traces"]
    run("draft_again", REPEATS, method="draft", draft_model=odd, gamma=2)
    report["retraces"] = rec["traces"] - traces  # of any sharded program (prefill, draft init and loop)
  if shape is not None:
    loops = [c["kwargs"] for c in rec["calls"] if c["name"] == DRAFT_LOOP]
    report["loop_heads"] = sorted({(kw["cfg"].num_heads, kw["dcfg"].num_heads) for kw in loops})
  helpers.write_worker_report(report, rec, c0, out_path, programs=shape is not None)


# ---------------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reports():
  """Runs the workers at once; returns {mesh shape or None: report}."""
  return helpers.mesh_reports(__file__, WORKERS, XLA_FLAGS, WORKER_TIMEOUT_S)


@pytest.mark.parametrize("shape", MESHES, ids=str)
def test_greedy_tokens_equal_one_device_and_ar(reports, shape):
  one, got = reports[None]["tokens"], reports[shape]["tokens"]
  assert len({tuple(t) for t in one["ar"]}) > 1 and all(len(t) == N_NEW for t in one["ar"])
  assert got["draft"] == one["draft"] == one["ar"]
  assert got["lookup"] == one["lookup"] == one["ar_repeats"]
  stats = reports[shape]["stats"]
  assert stats["draft"]["batch"] == len(PROMPTS) and stats["draft"]["tokens_generated"] == N_NEW * len(PROMPTS)
  assert stats["lookup"]["acceptance_rate"] > 0, stats  # lookup found and verified matches


@pytest.mark.parametrize("shape", MESHES, ids=str)
def test_sampled_tokens_equal_one_device(reports, shape):
  one, got = reports[None]["tokens"], reports[shape]["tokens"]
  for label in ("draft_sampled", "lookup_sampled"):
    assert got[label] == one[label], label
    assert all(len(t) == N_NEW for t in one[label])
  assert one["draft_sampled"] != one["ar"]  # really sampled
  assert reports[shape]["stats"]["draft_sampled"]["acceptance_rate"] > 0  # accepted drafts and rejections


def test_auto_gamma_on_a_mesh(reports):
  rep = reports[(1, 8)]
  assert rep["tokens"]["draft_auto"] == reports[None]["tokens"]["ar"]
  assert rep["stats"]["draft_auto"]["acceptance_rate"] > 0.8  # fully accepted rounds: the p0 - 1 restore ran


def test_drafter_and_its_cache_are_sharded(reports):
  for shape in MESHES:
    rep = reports[shape]
    # The drafter's KV cache [G, B, KV, T, D] lies like the target's: requests over 'data', KV heads over 'model'.
    assert rep["dcache"][1:3] == rep["cache"][1:3] == ["data", "model"], rep
    d = rep["dparams"]
    assert d["w_gate"] == [None, None, "model"] and d["embed"] == ["model", None], d
  # (2, 4): placed in the padded layout (3 -> 4 heads), attention weights sharded too.
  d = reports[(2, 4)]["dparams"]
  assert d["wq"] == d["wk"] == [None, None, "model"] and d["wo"] == [None, "model", None], d
  # (1, 8): 3 heads arrive in their own layout (replicated: 3 does not divide 8), laid out inside the program.
  assert reports[(1, 8)]["dparams"]["wq"] == [None, None, None]
  # The loops ran on the laid-out configs: (target heads, drafter heads).
  assert reports[(2, 4)]["loop_heads"] == [[4, 4]], reports[(2, 4)]["loop_heads"]
  assert reports[(1, 8)]["loop_heads"] == [[8, 8]], reports[(1, 8)]["loop_heads"]


def test_no_retrace_for_the_same_configuration(reports):
  assert reports[(2, 4)]["retraces"] == 0
  assert reports[(2, 4)]["tokens"]["draft_again"] == reports[None]["tokens"]["ar_repeats"]
  for shape in MESHES:
    traces, compiles, configs = reports[shape]["programs"]
    assert traces == compiles == configs, reports[shape]  # each sharded configuration traced and compiled once


if __name__ == "__main__":
  helpers.worker_main(_worker)
