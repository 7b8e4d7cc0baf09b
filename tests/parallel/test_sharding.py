"""Sharded decoding on 8 simulated CPU devices: outputs equal one device's, layouts follow the declared axes
and the rules, each configuration traces once, and the memory plan equals the real per-device bytes.

The 8 devices need XLA_FLAGS before jax initialises its backend, but a pytest session shares one process
whose other modules initialise jax first; so the device checks run in subprocesses (this file run as a
script with --worker, two at once, see WORKERS) and report JSON that the tests below assert on. The rule
functions and the reading of declared axes are checked in-process.
"""

import json
import time

import jax
from jax.sharding import AxisType, PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import pytest

import helpers  # tests/ is also the worker script's directory
from loopspec_jax import api
from loopspec_jax.decoding.stats import DecodeStats
from loopspec_configs.mesh import cpu8, v4_8, v5e_8, v5e_16
from loopspec_configs.models import model_config
from loopspec_jax.decoding import autoregressive, chain, common
from loopspec_jax.decoding.loopspec import decoder as loopspec_decoder
from loopspec_jax.decoding.loopspec import state as loopspec
from loopspec_experiments import plan_memory
from loopspec_jax.models import looped
from loopspec_jax.parallel import heads as heads_lib
from loopspec_jax.parallel import rules
from loopspec_jax.parallel import sharding

MESHES = [None, (8, 1), (2, 4), (1, 8)]  # pure data, mixed, pure model parallel
FAMILIES = {
    # model config spec, LoopSpec settings, chain settings, mesh of the sampled run and of the plan check
    # huginn on (1, 8): 4 heads / 4 KV heads do not divide 8 (zero-padded to 8), MLP 48 and vocab 64 do.
    # ouro on (2, 4): 4 heads, MLP and vocab split, 2 KV heads each stored twice (4); 3 requests padded to 4.
    "huginn": ("huginn:tiny", {"d1": 2, "d2": 4}, {"d1": 1, "gamma": 2}, (1, 8)),
    "ouro": ("ouro:tiny", {"d1": 1, "d2": 2}, {"d1": 1, "gamma": 2}, (2, 4)),
}
N_NEW = 8
SAMPLING = {"temperature": 1.0, "top_p": 0.9, "seed": 7}
WORKER_TIMEOUT_S = 900
# 8 host devices; LLVM at -O0 compiles the ~70 programs in about 60% of the time (outputs are compared
# within one process, so codegen flags cannot hide a difference).
XLA_FLAGS = (
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true"
)


# ---------------------------------------------------------------------------------------------------
# Worker (runs in a subprocess with 8 CPU devices)
# ---------------------------------------------------------------------------------------------------
# Two workers share the two CPU cores evenly: huginn's greedy sweep, layouts, traces and plan check in one;
# ouro's, plus huginn's sampled runs (compared within that process), in the other.
WORKERS = {"a": [("huginn", "greedy")], "b": [("ouro", "greedy"), ("ouro", "sampled"), ("huginn", "sampled")]}


def _worker(name: str, out_path: str):
  assert jax.device_count() == 8, jax.devices()
  report = {}
  rec = helpers.record_sharded_calls()  # every sharded program run here, its traces and compiles
  for family, part in WORKERS[name]:
    report.setdefault(family, {"timings": {}, "cpu_s": {}})
    _family_part(family, part, report[family], rec)
  with open(out_path, "w") as f:
    json.dump(report, f)


_PLANS = {}


def _family_part(family: str, part: str, report: dict, rec: dict):
  spec, ls_kw, ch_kw, special = FAMILIES[family]
  cfg = model_config(spec)
  model = api.from_config(cfg, 0, contraction=0.05)
  v = cfg.vocab_size
  prompts = [[int(t) for t in (np.arange(n) * m + 3) % v] for n, m in ((5, 7), (11, 13), (3, 5))]  # B=3: padded
  methods = {"ar": {}, "chain": ch_kw, "loopspec": ls_kw}

  def mesh_of(shape):
    if shape is not None and shape not in _PLANS:
      _PLANS[shape] = sharding.plan(sharding.make_mesh(shape))
    return None if shape is None else _PLANS[shape]

  def run(shape, method, **kw):
    t0, c0 = time.perf_counter(), time.process_time()
    res = api.generate(
        model, prompts, max_new_tokens=N_NEW, method=method, mesh=mesh_of(shape), **methods[method], **kw
    )
    report["timings"][f"{shape} {method} {kw}"] = round(time.perf_counter() - t0, 2)
    report["cpu_s"][f"{shape} {method} {kw}"] = round(time.process_time() - c0, 2)
    assert len(res.tokens) == len(prompts) and res.stats["batch"] == len(prompts)
    assert res.stats["tokens_generated"] == sum(len(t) for t in res.tokens)
    return res.tokens

  def n_configs():  # the configurations of this model's sharded programs (their cfg: its head layout there)
    return len({c["config"] for c in rec["calls"] if heads_lib.base_config(c["kwargs"]["cfg"]) == cfg})

  if part == "sampled":
    before, traces0 = n_configs(), rec["traces"]
    report["sampled"] = {f"{shape}|{m}": run(shape, m, **SAMPLING) for shape in (None, special) for m in methods}
    report["sampled_new_configs"] = n_configs() - before
    report["sampled_traces"] = rec["traces"] - traces0
    return

  report["greedy"] = {f"{shape}|{m}": run(shape, m) for shape in MESHES for m in methods}
  # Layouts: parameters placed by the rules; the decode state of the last sharded calls (mesh `special`).
  mesh = mesh_of(special)
  params = sharding.shard_params(model.params, cfg, mesh)
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  report["param_specs"] = {jax.tree_util.keystr(p): _spec(x) for p, x in flat}
  report["param_shard_shapes"] = {jax.tree_util.keystr(p): list(x.addressable_shards[0].data.shape) for p, x in flat}
  traces0, compiles0 = rec["traces"], rec["compiles"]
  report["rerun_tokens"] = run(special, "loopspec")  # again, with parameters already placed: no retrace
  report["rerun_traces"], report["rerun_compiles"] = rec["traces"] - traces0, rec["compiles"] - compiles0
  last = {c["name"]: c["out"] for c in rec["calls"]}  # the shardings of each entry's last result
  report["state_specs"] = {
      name: {
          jax.tree_util.keystr(p): helpers.sharding_spec(s)
          for p, s in jax.tree_util.tree_flatten_with_path(
              tree, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
          )[0]
      }
      for name, tree in last.items()
  }
  report["state_meshes"] = {
      name: list(jax.tree_util.tree_leaves(tree)[0].mesh.shape.values()) for name, tree in last.items()
  }
  report["traces"], report["compiles"] = traces0, compiles0  # the greedy sweep's (before the rerun)
  report["n_configs"] = n_configs()

  # Memory plan vs the real per-device bytes of the greedy LoopSpec state of that run (same shapes and the same
  # decoder as `generate` builds: the compiled prefill and initial state are reused).
  padded, rid, n = sharding.pad_requests(prompts, None, mesh)
  tp, total = common.buckets([len(p) for p in padded], N_NEW, cfg)
  prompt_arr, len_arr = common.batch_prompts(padded, tp)
  sp = common.make_sampling_params(len(padded), N_NEW, 0.0, 0, 1.0, 0, None, rid)
  d1, d2 = ls_kw["d1"], ls_kw.get("d2")
  cap = loopspec.default_capacity(cfg.recurrence, d1, d2)
  dec = plan_memory.make_decoder(cfg, "loopspec", d1, d2, cap, greedy=True)
  traces0 = rec["traces"]
  cache, tokens = common.prefill_for(  # model.params as the runs above passed them: their programs are reused
      dec, model.params, prompt_arr, len_arr, sp, cfg=cfg, total=total, random_init=False, mesh=mesh
  )
  st = sharding.entry(dec.init, mesh)(cache, tokens, len_arr, sp, **dec.init_kw)
  report["plan_extra_traces"] = rec["traces"] - traces0
  sp_placed = sharding.place(sp, rules.state_shardings(sp, cfg, mesh))
  real = {
      "params": params,  # as shard_params (and load(..., mesh=)) place them: heads laid out for the mesh
      "committed_kv": st.cache,
      "spec_kv": st.spec,
      "lanes": st.lanes,
      "other": (st.replace(cache=None, spec=None, lanes=None), sp_placed),
  }
  per_device = {}
  for cat, tree in real.items():
    by_dev = {}
    for x in jax.tree_util.tree_leaves(tree):
      for shard in x.addressable_shards:
        by_dev[shard.device.id] = by_dev.get(shard.device.id, 0) + shard.data.nbytes
    per_device[cat] = sorted(set(by_dev.values()))
  report["real_bytes_per_device"] = per_device
  row = plan_memory.plan_row(cfg, len(prompts), total, special, "loopspec", rules.RULES, d1, d2, cap, greedy=True)
  report["plan_row"] = {k: row[k] for k in real} | {"total": row["total"], "padded_batch": row["padded_batch"]}


def _spec(x):
  return helpers.sharding_spec(x.sharding)


# ---------------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reports():
  """Runs the workers concurrently; returns {family: merged report}."""
  result = {}
  for rep_by_family in helpers.run_workers(__file__, WORKERS, XLA_FLAGS, WORKER_TIMEOUT_S).values():
    for fam, rep in rep_by_family.items():
      merged = result.setdefault(fam, {"timings": {}, "cpu_s": {}})
      for k, val in rep.items():
        if isinstance(val, dict) and k in ("timings", "cpu_s"):
          merged[k].update(val)
        else:
          merged[k] = val
  return result


@pytest.mark.slow  # the 8-device workers (~3 minutes); test_head_padding runs sharded decoding by default
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_identical_on_every_mesh(reports, family):
  g = reports[family]["greedy"]
  for method in ("ar", "chain", "loopspec"):
    ref = g["None|ar"]
    for shape in MESHES:
      assert g[f"{shape}|{method}"] == ref, f"{family} {method} on mesh {shape}"
  assert len({tuple(t) for t in g["None|ar"]}) > 1  # the requests really differ


@pytest.mark.slow  # the 8-device workers (~3 minutes); test_head_padding runs sharded decoding by default
@pytest.mark.parametrize("family", list(FAMILIES))
def test_sampled_identical_for_the_same_seed(reports, family):
  s, special = reports[family]["sampled"], FAMILIES[family][3]
  for method in ("ar", "chain", "loopspec"):
    assert s[f"{special}|{method}"] == s[f"None|{method}"], f"{family} {method} sampled on mesh {special}"
  assert s["None|ar"] != reports[family]["greedy"]["None|ar"]  # really sampled


def _expect(dim_units, size):
  return "model" if dim_units % size == 0 else None


@pytest.mark.slow  # the 8-device workers (~3 minutes); test_head_padding runs sharded decoding by default
@pytest.mark.parametrize("family", list(FAMILIES))
def test_parameters_sharded_as_the_rules_say(reports, family):
  rep = reports[family]
  spec, _, _, (data, model) = FAMILIES[family]
  cfg = heads_lib.padded_config(model_config(spec), {"data": data, "model": model})  # heads as laid out
  specs, shapes = rep["param_specs"], rep["param_shard_shapes"]
  heads, kv, mlp, vocab = (
      _expect(cfg.num_heads, model),
      _expect(cfg.num_kv_heads, model),
      _expect(cfg.intermediate_size, model),
      _expect(cfg.vocab_size, model),
  )
  assert specs["['core']['wq']"] == [None, None, heads]
  assert specs["['core']['wk']"] == [None, None, kv]
  assert specs["['core']['wo']"] == [None, heads, None]
  assert specs["['core']['w_gate']"] == [None, None, mlp]
  assert specs["['core']['w_down']"] == [None, mlp, None]
  assert specs["['core']['norm_1']"] == [None, None]
  assert specs["['embed']"] == [vocab, None]
  if not cfg.tie_embeddings:
    assert specs["['lm_head']"] == [None, vocab]
  h, e, i = cfg.num_heads * cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
  assert shapes["['core']['wq']"] == [cfg.n_core, e, h // model if heads else h]
  assert shapes["['core']['w_gate']"] == [cfg.n_core, e, i // model if mlp else i]
  # Heads no mesh axis divides are laid out so that they shard (tests/parallel/test_head_padding.py): huginn's 4 heads
  # zero-padded to 8, ouro's 2 KV heads each stored twice.
  assert mlp == vocab == heads == kv == "model"
  assert (cfg.head_padding, cfg.kv_repeat) == ((4, 1) if family == "huginn" else (0, 2))


_PREFILL = "loopspec_jax.decoding.common.prefill_state"
_LOOPS = {m: f"loopspec_jax.decoding.{m}.decode_loop" for m in ("autoregressive", "chain")}
_LOOPS["loopspec"] = "loopspec_jax.decoding.loopspec.tick.decode_loop"


@pytest.mark.slow  # the 8-device workers (~3 minutes); test_head_padding runs sharded decoding by default
@pytest.mark.parametrize("family", list(FAMILIES))
def test_decode_state_sharded_as_declared(reports, family):
  """Every leaf of the recorded states (prefill's cache, each decode loop's state) lies as its dataclass field
  declares, mapped by the rules: per-buffer KV [G | nR, B, KV, T | N, D], lanes [B, N, ...], counters [B]."""
  rep = reports[family]
  cfg = model_config(FAMILIES[family][0])
  st, meshes = rep["state_specs"], rep["state_meshes"]

  def expect(name):  # (batch, kv_heads, vocab) mesh axes on the mesh the entry last ran on
    data, model = meshes[name]
    kv = heads_lib.padded_config(cfg, {"data": data, "model": model}).num_kv_heads
    return "data", _expect(kv, model), _expect(cfg.vocab_size, model)

  b, kv, _ = expect(_PREFILL)
  pre = st[_PREFILL]  # (cache, tokens) of LoopSpec's prefill (the last one run)
  assert pre["[0].core[0][0]"] == [None, b, kv, None, None]  # [G, B, KV, T, D]
  if cfg.is_raven:  # Ouro has no prelude and coda stacks
    assert pre["[0].prelude[0][0]"] == [b, kv, None, None]  # [B, KV, T, D]
    assert pre["[0].coda[0][1]"] == [None, b, kv, None, None]  # [n_readouts, B, KV, T, D]
  assert pre["[1]"] == [b, None]  # tokens [B, T]
  for name in _LOOPS.values():
    b, kv, vocab = expect(name)
    dec = st[name]
    assert dec[".cache.core[0][0]"] == [None, b, kv, None, None]
    assert dec[".tokens"] == [b, None]
    assert dec[".done"] == [b]
    assert dec[".iterations"] == []
  b, kv, vocab = expect(_LOOPS["loopspec"])
  dec = st[_LOOPS["loopspec"]]
  assert dec[".spec.core[0][1]"] == [None, b, kv, None, None]  # speculative KV [G, B, KV, N, D]
  assert dec[".lanes.q1"] == [b, None, vocab]  # greedy: [B, N, 0]
  assert dec[".lanes.anc"] == [b, None, None]
  assert dec[".lanes.s"] == [b, None, None]
  assert dec[".stats.ticks"] == [b]
  assert dec[".limit"] == [b]


@pytest.mark.slow  # the 8-device workers (~3 minutes); test_head_padding runs sharded decoding by default
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_configuration_traces_once(reports, family):
  """jax.jit's own cache holds the sharded programs: `sharding.run_sharded` is traced and compiled once per
  configuration (entry, static arguments, input avals), counted by jax.monitoring events in the worker."""
  rep = reports[family]
  # meshes x 3 methods x (prefill (one per readout set), initial state, greedy decode loop).
  assert rep["n_configs"] == (len(MESHES) - 1) * 3 * 3
  assert rep["traces"] == rep["compiles"] == rep["n_configs"]  # counted before the rerun and the sampled runs
  assert rep["rerun_traces"] == rep["rerun_compiles"] == 0 and rep["plan_extra_traces"] == 0  # reused
  assert rep["rerun_tokens"] == rep["greedy"]["None|ar"]
  # The sampled runs add 3 sampled decode loops and LoopSpec's sampled initial state (its lanes hold [B, N, V]
  # distributions) on a mesh the greedy runs used (ouro), or 3 x 3 configurations in a fresh process (huginn).
  assert rep["sampled_new_configs"] == rep["sampled_traces"] == (4 if family == "ouro" else 9)


@pytest.mark.slow  # the 8-device workers (~3 minutes); test_head_padding runs sharded decoding by default
@pytest.mark.parametrize("family", list(FAMILIES))
def test_plan_memory_matches_real_bytes(reports, family):
  rep = reports[family]
  real, plan = rep["real_bytes_per_device"], rep["plan_row"]
  for cat, values in real.items():
    assert len(values) == 1, f"{cat}: devices hold different amounts {values}"
    assert plan[cat] == values[0], (cat, plan[cat], values[0])
  assert plan["total"] == sum(v[0] for v in real.values())


# ---------------------------------------------------------------------------------------------------
# In-process checks of the rules and of the declared axes (no devices needed)
# ---------------------------------------------------------------------------------------------------
def test_logical_spec_fallback_and_whole_heads():
  cfg = model_config("huginn:0125")
  sizes = {"data": 2, "model": 4}
  # 55 heads do not divide over 4 devices: replicated, although 55 * 96 = 5280 would split (mid-head).
  assert rules.logical_spec(("layers", "embed", "heads"), (4, 5280, 5280), sizes, cfg=cfg) == P(None, None, None)
  assert rules.logical_spec(("layers", "embed", "mlp"), (4, 5280, 17920), sizes, cfg=cfg) == P(None, None, "model")
  assert rules.logical_spec(("batch", "length"), (3, 8), sizes) == P(None, None)  # 3 requests: replicated
  assert rules.logical_spec(("batch", "length"), (4, 8), sizes) == P("data", None)
  assert rules.logical_spec((), (), sizes) == P()
  # A mesh axis is used once per array (the first rule wins); custom rules can move an axis.
  custom = rules.normalize_rules({"heads": "model", "vocab": "model", "embed": None})
  assert rules.logical_spec(("heads", "vocab"), (8, 8), sizes, custom) == P("model", None)
  assert rules.logical_spec(("vocab", "heads"), (8, 8), sizes, custom) == P(None, "model")
  # When the first rule's dimension does not divide, the axis goes to the next one that does.
  assert rules.logical_spec(("heads", "vocab"), (6, 8), sizes, custom) == P(None, "model")
  # A later rule of the same name is the fallback of an earlier one; axes missing from the mesh are ignored.
  custom = (("batch", ("data", "model")), ("batch", "data"), ("mlp", ("model", "pipe")))
  assert rules.logical_spec(("batch", "mlp"), (8, 12), sizes, custom) == P(("data", "model"), None)
  assert rules.logical_spec(("batch", "mlp"), (6, 12), sizes, custom) == P("data", "model")
  # Unsharded names may repeat ([E, E]); the mapping is flax's.
  assert rules.logical_spec(("embed", "embed"), (8, 8), sizes) == P(None, None)
  names, fitted = rules.fit_rules(("batch", "heads", "head_dim"), (4, 55, 96), sizes, cfg=cfg)
  assert names == ("batch", None, None) and fitted == (("batch", "data"), ("head_dim", None))
  assert rules.shard_shape((4, 8, 12), P("data", None, "model"), sizes) == (2, 8, 3)


def _abstract_states(cfg, batch=4, total=32):
  """{method: eval_shape of its (cache, tokens) prefill and its initial state} for AR, chain and LoopSpec."""
  decoders = {
      "ar": autoregressive.make_decoder(cfg, greedy=False, random_init=False),
      "chain": chain.make_decoder(cfg, greedy=False, random_init=False, d1=1, gamma=2),
      "loopspec": loopspec_decoder.make_decoder(cfg, greedy=False, random_init=False, d1=2, d2=4, lane_capacity=None),
  }
  sp = jax.eval_shape(lambda: common.make_sampling_params(batch, 1, 1.0, 0, 1.0, 0, None))
  prompt, lengths = jax.ShapeDtypeStruct((batch, 8), jnp.int32), jax.ShapeDtypeStruct((batch,), jnp.int32)
  out = {}
  for method, dec in decoders.items():
    prefill = lambda *a, dec=dec: common.prefill_state(
        *a,
        cfg=cfg,
        readout_depths=dec.readout_depths,
        total_len=total + dec.extra_positions,
        random_init=False,
        cache_group=dec.cache_group,
    )
    cache, tokens = jax.eval_shape(prefill, looped.abstract_params(cfg), prompt, lengths, sp)
    out[method] = (cache, jax.eval_shape(lambda *a, dec=dec: dec.init(*a, **dec.init_kw), cache, tokens, lengths, sp))
  return out, sp


def test_state_axes_are_the_declared_ones():
  """Every decoder's state and the sampling parameters are covered by declarations; every declared name is a
  rule of RULES (a misspelt name would silently replicate); a leaf outside any declaration raises, naming it."""
  cfg = model_config("huginn:tiny")
  states, sp = _abstract_states(cfg)
  known = {name for name, _ in rules.RULES}
  for method, tree in states.items():
    axes = jax.tree_util.tree_leaves(rules.tree_axes((tree, sp), "state"), is_leaf=lambda x: isinstance(x, P))
    assert len(axes) == len(jax.tree_util.tree_leaves((tree, sp)))
    names = {n for a in axes for n in a if n is not None}
    assert names <= known, (method, names - known)
  cache, st = states["loopspec"]
  axes = rules.tree_axes(st, "state")
  assert tuple(axes.cache.core[0][1]) == ("groups", "batch", "kv_heads", "length", "head_dim")
  assert tuple(axes.spec.coda[0][0]) == ("readouts", "batch", "kv_heads", "lanes", "head_dim")
  assert tuple(axes.lanes.anc) == ("batch", "lanes", None) and tuple(axes.iterations) == ()
  assert tuple(axes.stats.live_max) == ("batch",)
  assert tuple(rules.tree_axes(sp, "state").base_key) == ("key",)
  # Nothing is guessed: a plain array (or a dict of them) has no declaration.
  with pytest.raises(ValueError, match=r"no logical axes declared for leaf \[0\]\['done'\]"):
    rules.tree_axes(({"done": st.done}, sp), "state")
  with pytest.raises(ValueError, match=r"LaneTable.alive declares logical axes \('batch', 'lanes'\)"):
    rules.tree_axes(st.replace(lanes=st.lanes.replace(alive=jax.ShapeDtypeStruct((4,), bool))), "state")


def test_plan_accepts_explicit_meshes_and_rejects_other_axes():
  mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
  p = sharding.plan(mesh)
  assert all(t == AxisType.Auto for t in p.mesh.axis_types) and p.rules == rules.RULES
  assert sharding.plan(p) is p
  with pytest.raises(ValueError, match="named"):
    sharding.plan(jax.make_mesh((1,), ("x",)))


def test_pad_and_drop_requests():
  p = sharding.plan(sharding.make_mesh((1, 1), devices=jax.devices()[:1]))
  assert sharding.pad_requests([[1, 2], [3]], None, p) == ([[1, 2], [3]], None, 2)
  prompts, rid, n = sharding.pad_requests([[1, 2], [3]], [5, 9], type("Plan", (), {"data_size": 4})())
  assert prompts == [[1, 2], [3], [0], [0]] and rid == [5, 9, 10, 11] and n == 2
  counts = DecodeStats(
      "ar", {"recurrence": 4}, {"tokens": [2, 1, 1, 1], "restart": [2, 1, 1, 1]}, {"decode_seconds": 1.0}
  )
  res = api.GenerateResult([[1, 2], [3], [4], [5]], counts.summary(), counts)
  out = sharding.drop_padding(res, 2)
  assert out.tokens == [[1, 2], [3]] and out.stats["tokens_generated"] == 3 and out.stats["padded_batch"] == 4
  assert out.stats["batch"] == 2 and out.stats["tokens_per_second"] == 3.0
  assert out.counts.per_request["restart"] == [2, 1] and out.counts.totals["padded_requests"] == 2


def test_mesh_configs_build_rules():
  assert tuple(v4_8.get_config().mesh_shape) == (2, 2)
  assert tuple(v5e_8.get_config().mesh_shape) == (2, 4)
  assert tuple(v5e_16.get_config().mesh_shape) == (4, 4)
  assert tuple(cpu8.get_config("8x1").mesh_shape) == (8, 1)
  assert tuple(v5e_8.get_config("1x8").mesh_shape) == (1, 8)
  assert sharding.rules_from_config(v5e_8.get_config()) == rules.RULES
  with pytest.raises(ValueError, match="DATAxMODEL"):
    cpu8.get_config("8,1")


if __name__ == "__main__":
  helpers.worker_main(_worker)
