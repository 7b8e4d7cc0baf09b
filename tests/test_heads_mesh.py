"""The head methods on a mesh: `method="medusa"`, `"eagle"` and `"mtp"` (randomly initialised heads for the
fixture huginn:tiny) on a (2, 4) mesh of 8 simulated CPU devices.

Their greedy tokens equal one-device AR's token for token and their sampled tokens (T = 1, top-k 20) equal
one-device AR's sampled tokens of the same seed, for the 3-request batch of different lengths (padded to 4 on
the data axis of 2). The tree state and each head's own state (Medusa's feature, EAGLE's head cache and
pending rows, MTP's feature) are sharded as declared: requests over 'data'; the head's parameters replicated.
The default suite checks the declarations on abstract states (no devices needed); the 8-device workers run
with `-m slow` (subprocesses: XLA_FLAGS must be set before jax starts, as in tests/test_tree_mesh.py).
"""

import time

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import pytest

import head_helpers as H
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
WORKER_TIMEOUT_S = 1500
N_NEW = 8
WORKERS = {"one": None, "a": (2, 4)}  # worker name -> its mesh shape (None: one device)
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43, 44]]
SAMPLING = {"temperature": 1.0, "top_k": 20, "seed": 3}
CONTRACTION = 0.05


def _model():
  cfg = model_config("huginn:tiny")
  return api.LoopedModel(cfg, helpers.numpy_params(cfg, CONTRACTION, seed=0))


def test_head_entry_points_are_declared_and_their_states_covered():
  """medusa / eagle / mtp init and loop are sharded entry points (the loop's head parameters replicated);
  every leaf of their initial states has declared logical axes, all of them names of the rules, requests
  first in the head's own state."""
  model = _model()
  cfg = model.config
  known = {name for name, _ in rules.RULES}
  sp = jax.eval_shape(lambda: common.make_sampling_params(4, 1, 1.0, 0, 1.0, 0, None))
  prompt, lengths = jax.ShapeDtypeStruct((4, 8), jnp.int32), jax.ShapeDtypeStruct((4,), jnp.int32)
  for kind in H.KINDS:
    m = methods.build(kind, heads=H.random_heads(kind, model), **H.ENVELOPES[kind])
    dec = m.make_decoder(cfg, greedy=False, random_init=False)
    assert all(sharding.entry_name(f) in sharding.ENTRY_POINTS for f in (dec.init, dec.loop)), kind
    assert sharding.entry_point(dec.loop).kinds[-1] == "replicated", kind  # the head's parameters: replicated
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
    assert len(axes) == len(jax.tree_util.tree_leaves((st, sp))), kind
    assert {n for a in axes for n in a if n is not None} <= known, kind
    extra = jax.tree_util.tree_leaves(rules.tree_axes(st, "state").extra, is_leaf=lambda x: isinstance(x, P))
    assert extra and all(tuple(a)[0] == "batch" for a in extra), (kind, extra)


@pytest.mark.slow  # 76 s wall (25 s CPU) at load 13 on the 2-core host: five decoder compiles
def test_head_methods_on_a_target_with_padded_heads_equal_ar():
  """A target laid out for a model axis its heads do not divide (3 heads padded to 4, as on a (2, 4) mesh, here
  on one device): the heads keep the trained layout (their parameters are replicated, never padded), so EAGLE's
  head block and cache and MTP's block trace with the unpadded config and decode AR's tokens. They used to
  fail at compile (EAGLE: a reshape of 3 heads into 4; MTP: refused, its block shapes against the padded
  ones); checked on the (2, 4) mesh of 8 simulated devices by hand (`sharding.shard_params` placement)."""
  cfg = model_config("huginn:tiny", num_heads=3, num_kv_heads=3)
  model = api.LoopedModel(cfg, helpers.numpy_params(cfg, CONTRACTION, seed=0))
  to = sharding.padded_config(cfg, {"data": 2, "model": 4})
  assert to.num_heads == 4 and to.head_padding == 1
  padded = api.LoopedModel(to, sharding.pad_params(model.params, cfg, to))
  want = api.generate(model, PROMPTS[:2], max_new_tokens=4, method="ar").tokens
  for kind in ("eagle", "mtp"):
    got = api.generate(padded, PROMPTS[:2], max_new_tokens=4, **H.spec_kwargs(kind, model))
    assert got.tokens == want, kind


# ---------------------------------------------------------------------------------------------------
# Worker (a subprocess with 8 CPU devices)
# ---------------------------------------------------------------------------------------------------
def _worker(name: str, out_path: str):
  assert jax.device_count() == 8, jax.devices()
  rec = helpers.record_sharded_calls()
  shape = WORKERS[name]
  c0 = time.process_time()
  target = _model()
  mesh = None if shape is None else sharding.plan(sharding.make_mesh(shape))
  report = {"tokens": {}, "stats": {}, "timings": {}, "extra": {}}

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
    for kind in H.KINDS:
      kw = H.spec_kwargs(kind, target)
      run(kind, **kw)
      run(kind + "_sampled", **kw, **SAMPLING)
      last = [c for c in rec["calls"] if c["name"] == f"loopspec_jax.decoding.tree.{kind}.decode_loop"][-1]
      first_leaf = jax.tree_util.tree_leaves(last["out"].extra)[0]
      report["extra"][kind] = helpers.sharding_spec(first_leaf)
  helpers.write_worker_report(report, rec, c0, out_path, programs=shape is not None)


@pytest.fixture(scope="module")
def reports():
  return helpers.mesh_reports(__file__, WORKERS, XLA_FLAGS, WORKER_TIMEOUT_S)


@pytest.mark.slow
def test_greedy_and_sampled_tokens_on_a_2x4_mesh_equal_ar(reports):
  one, got = reports[None]["tokens"], reports[(2, 4)]["tokens"]
  assert len({tuple(t) for t in one["ar"]}) > 1 and all(len(t) == N_NEW for t in one["ar"])
  for kind in H.KINDS:
    assert got[kind] == one["ar"], kind
    assert got[kind + "_sampled"] == one["ar_sampled"] != one["ar"], kind
  stats = reports[(2, 4)]["stats"]
  assert all(stats[k]["method"] == k and stats[k]["tau"] >= 1.0 for k in H.KINDS), stats
  assert all(s["batch"] == len(PROMPTS) and s["tokens_generated"] == N_NEW * len(PROMPTS) for s in stats.values())


@pytest.mark.slow
def test_head_state_sharded_as_declared_and_traced_once(reports):
  rep = reports[(2, 4)]
  assert all(rep["extra"][k][0] == "data" for k in H.KINDS), rep["extra"]
  traces, compiles, configs = rep["programs"]
  assert traces == compiles == configs, rep


if __name__ == "__main__":
  helpers.worker_main(_worker)
