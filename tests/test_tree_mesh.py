"""The tree decoders on a mesh: `method="tree"` (and `"chain"` with branch > 1) and `method="lookahead"` on a
(2, 4) mesh of 8 simulated CPU devices.

Their greedy tokens equal one-device AR's token for token and their sampled tokens (T = 1, top-k 20) equal
one-device AR's sampled tokens of the same seed (the verifier emits AR's own draws), for the 3-request batch of
different lengths (padded to 4 on the data axis of 2). The tree state (tree/verify.py's TreeState, lookahead's
window and n-gram pool in its `extra`) is sharded as declared: requests over 'data', the KV cache's heads over
'model'. The default suite checks the declarations on abstract states (no devices needed); the 8-device
workers run with `-m slow` (subprocesses: XLA_FLAGS must be set before jax starts, as in
tests/test_baselines_mesh.py).
"""

import time

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import pytest

import helpers  # tests/ is also the worker script's directory
from loopspec_jax import api
from loopspec_jax import methods
from loopspec_configs.models import model_config
from loopspec_jax.decoding import common
from loopspec_jax.models import looped
from loopspec_jax.parallel import rules
from loopspec_jax.parallel import sharding

XLA_FLAGS = (
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true"
)
WORKER_TIMEOUT_S = 900
N_NEW = 8
WORKERS = {"one": None, "a": (2, 4)}  # worker name -> its mesh shape (None: one device)
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43, 44]]
SAMPLING = {"temperature": 1.0, "top_k": 20, "seed": 3}
TREE = "tree:d1=1,gamma=3,branch=2,tree_nodes=6"
LOOKAHEAD = "lookahead:window=3,ngram=3,guesses=3"
LOOKAHEAD_LOOP = "loopspec_jax.decoding.tree.lookahead.decode_loop"


def test_tree_entry_points_are_declared_and_their_states_covered():
  """tree and lookahead init / loop are sharded entry points; every leaf of their initial states has declared
  logical axes (lookahead's window and pool: requests first), all of them names of the rules."""
  cfg = model_config("huginn:tiny")
  known = {name for name, _ in rules.RULES}
  sp = jax.eval_shape(lambda: common.make_sampling_params(4, 1, 1.0, 0, 1.0, 0, None))
  prompt, lengths = jax.ShapeDtypeStruct((4, 8), jnp.int32), jax.ShapeDtypeStruct((4,), jnp.int32)
  for spec in (TREE, LOOKAHEAD, "chain:d1=1,gamma=3,branch=2,tree_nodes=6"):
    dec = methods.parse(spec).make_decoder(cfg, greedy=False, random_init=False)
    assert all(sharding.entry_name(f) in sharding.ENTRY_POINTS for f in (dec.init, dec.loop)), spec
    prefill = lambda *a, dec=dec: common.prefill_state(
        *a,
        cfg=cfg,
        readout_depths=dec.readout_depths,
        total_len=32 + dec.extra_positions,
        random_init=False,
        cache_group=dec.cache_group,
    )
    cache, tokens = jax.eval_shape(prefill, looped.abstract_params(cfg), prompt, lengths, sp)
    st = jax.eval_shape(lambda *a, dec=dec: dec.init(*a, **dec.init_kw), cache, tokens, lengths, sp)
    axes = jax.tree_util.tree_leaves(rules.tree_axes((st, sp), "state"), is_leaf=lambda x: isinstance(x, P))
    assert len(axes) == len(jax.tree_util.tree_leaves((st, sp))), spec
    assert {n for a in axes for n in a if n is not None} <= known, spec
    if spec == LOOKAHEAD:
      ax = rules.tree_axes(st, "state").extra
      assert tuple(ax.window) == ("batch", None) and tuple(ax.pool) == ("batch", None, None)
      assert tuple(ax.added) == ("batch",)


# ---------------------------------------------------------------------------------------------------
# Worker (a subprocess with 8 CPU devices)
# ---------------------------------------------------------------------------------------------------
def _worker(name: str, out_path: str):
  assert jax.device_count() == 8, jax.devices()
  rec = helpers.record_sharded_calls()
  shape = WORKERS[name]
  c0 = time.process_time()
  cfg = model_config("huginn:tiny")
  target = api.LoopedModel(cfg, helpers.numpy_params(cfg, 0.05, seed=0))
  mesh = None if shape is None else sharding.plan(sharding.make_mesh(shape))
  report = {"tokens": {}, "stats": {}, "timings": {}}

  def run(label, **kw):
    t0 = time.perf_counter()
    res = api.generate(target, PROMPTS, max_new_tokens=N_NEW, mesh=mesh, **kw)
    report["timings"][label] = round(time.perf_counter() - t0, 2)
    report["tokens"][label] = res.tokens
    report["stats"][label] = {k: res.stats.get(k) for k in ("method", "batch", "tokens_generated", "tau")}

  if shape is None:
    run("ar")
    run("ar_sampled", **SAMPLING)
  else:
    run("tree", method=TREE)
    run("chain_tree", method="chain", d1=1, gamma=3, branch=2, tree_nodes=6)  # the same program as "tree"
    run("lookahead", method=LOOKAHEAD)
    run("tree_sampled", method=TREE, **SAMPLING)
    run("lookahead_sampled", method=LOOKAHEAD, **SAMPLING)
    last = [c for c in rec["calls"] if c["name"] == LOOKAHEAD_LOOP][-1]
    st = last["out"]
    report["pool"] = helpers.sharding_spec(st.extra.pool)
    report["window"] = helpers.sharding_spec(st.extra.window)
    report["cache"] = helpers.sharding_spec(st.cache.core[0][0])
  helpers.write_worker_report(report, rec, c0, out_path, programs=shape is not None)


@pytest.fixture(scope="module")
def reports():
  return helpers.mesh_reports(__file__, WORKERS, XLA_FLAGS, WORKER_TIMEOUT_S)


@pytest.mark.slow
def test_greedy_and_sampled_tokens_on_a_2x4_mesh_equal_ar(reports):
  one, got = reports[None]["tokens"], reports[(2, 4)]["tokens"]
  assert len({tuple(t) for t in one["ar"]}) > 1 and all(len(t) == N_NEW for t in one["ar"])
  assert got["tree"] == got["chain_tree"] == got["lookahead"] == one["ar"]
  assert got["tree_sampled"] == got["lookahead_sampled"] == one["ar_sampled"] != one["ar"]
  stats = reports[(2, 4)]["stats"]
  assert stats["chain_tree"]["method"] == "tree" and stats["tree"]["tau"] > 1.0, stats
  assert all(s["batch"] == len(PROMPTS) and s["tokens_generated"] == N_NEW * len(PROMPTS) for s in stats.values())


@pytest.mark.slow
def test_tree_state_sharded_as_declared_and_traced_once(reports):
  rep = reports[(2, 4)]
  assert rep["pool"][0] == rep["window"][0] == "data", rep
  assert rep["cache"][1:3] == ["data", "model"], rep  # [G, B, KV, T, D]: requests over data, KV heads over model
  traces, compiles, configs = rep["programs"]
  assert traces == compiles == configs, rep  # chain with branch reuses the tree's programs


if __name__ == "__main__":
  helpers.worker_main(_worker)
