"""Attention heads a mesh axis does not divide: repeated (GQA) or zero-padded so that they shard (exactly).

`sharding.padded_config` lays the heads out for a mesh and `sharding.pad_params` the parameters; a padded
head has zero q / k / v projections (and zero q/k bias), so it attends uniformly to zero values and adds
nothing through its zero rows of wo; OLMo's full-width q/k norms average over the real entries only.

In-process (one device): the layouts chosen for the real configs, and for every family the logits of the
padded model equal the unpadded ones (a control without the q/k-norm correction differs). On 8 simulated
devices (a subprocess, as in tests/parallel/test_sharding.py): a tiny Huginn-style model with 3 heads gives the
unsharded greedy tokens for AR, chain and LoopSpec on (1, 8) (3 -> 8 heads, parameters padded inside the
programs) and on (2, 4) (3 -> 4, parameters placed padded by `shard_params`, as `load(..., mesh=)` does), its
KV caches are sharded over 'model' (one head per device on (1, 8)), and the compiled SPMD HLO of its AR loop
holds the cache and the attention weights as per-device one-head buffers and gathers no cache.
"""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers  # tests/ is also the worker script's directory
from loopspec_jax import api
from loopspec_configs.models import model_config
from loopspec_jax.models import looped
from loopspec_jax.parallel import sharding

XLA_FLAGS = (
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true"
)
WORKER_TIMEOUT_S = 900
N_NEW = 8
METHODS = {"ar": {}, "chain": {"d1": 1, "gamma": 2}, "loopspec": {"d1": 2, "d2": 4}}
# A Huginn-style model whose 3 heads divide no model axis of 8 devices; MLP 48 and vocab 64 do.
HUGINN3 = dict(num_heads=3, num_kv_heads=3)


def _sizes(data, model):
  return {"data": data, "model": model}


# ---------------------------------------------------------------------------------------------------
# Layouts (no devices needed)
# ---------------------------------------------------------------------------------------------------
def test_layouts_of_the_real_configs():
  huginn = model_config("huginn:0125")
  for m in (2, 4, 8):
    cfg = sharding.padded_config(huginn, _sizes(8 // m, m))
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_padding, cfg.kv_repeat) == (56, 56, 1, 1)
  assert sharding.padded_config(huginn, _sizes(1, 16)).num_heads == 64
  assert sharding.padded_config(huginn, _sizes(8, 1)) is huginn  # nothing to shard over: unchanged
  # GQA with fewer KV heads than devices: KV heads repeated, query heads split between the copies, no padding.
  llama = model_config("raven_llama:tinyllama")  # 32 heads, 4 KV heads
  cfg = sharding.padded_config(llama, _sizes(1, 8))
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_padding, cfg.kv_repeat) == (32, 8, 0, 2)
  for spec in ("ouro:2p6b", "raven_llama:3p2_1b", "raven_olmo:2_1b"):  # heads divide 8 already
    cfg = model_config(spec)
    assert sharding.padded_config(cfg, _sizes(1, 8)) is cfg and sharding.padded_config(cfg, _sizes(2, 4)) is cfg
  # A laid-out config is only padded further, and base_config undoes any layout.
  c56 = sharding.padded_config(huginn, _sizes(1, 8))
  assert sharding.padded_config(c56, _sizes(1, 4)) is c56 and sharding.padded_config(c56, _sizes(1, 1)) is c56
  assert sharding.padded_config(c56, _sizes(1, 16)).head_padding == 9
  assert sharding.base_config(c56) == huginn == sharding.base_config(sharding.padded_config(c56, _sizes(1, 16)))
  assert sharding.base_config(sharding.padded_config(llama, _sizes(1, 8))) == llama
  # Rules that replicate heads leave them alone.
  rules = tuple((n, None if n in ("heads", "kv_heads") else a) for n, a in sharding.RULES)
  assert sharding.padded_config(huginn, _sizes(1, 8), rules) is huginn


def test_padded_parameter_shapes_and_errors():
  cfg = model_config("huginn:tiny", **HUGINN3)
  to = sharding.padded_config(cfg, _sizes(1, 8))
  params = looped.abstract_params(cfg)
  padded = sharding.pad_params(params, cfg, to)
  assert jax.tree_util.tree_structure(padded) == jax.tree_util.tree_structure(looped.abstract_params(to))
  for a, b in zip(jax.tree_util.tree_leaves(padded), jax.tree_util.tree_leaves(looped.abstract_params(to))):
    assert a.shape == b.shape and a.dtype == b.dtype
  assert sharding.pad_params(params, cfg, cfg) is params
  with pytest.raises(ValueError, match="q / k widths"):
    sharding.pad_params(padded, cfg, to)  # already laid out
  # Parameter bytes of the padding: 8/3 of the attention weights here; Huginn-0125: 56/55 (+1.8%).
  h = model_config("huginn:0125")
  h56 = sharding.padded_config(h, _sizes(1, 8))
  attn = lambda c: 4 * c.hidden_size * c.num_heads * c.head_dim
  assert round(attn(h56) / attn(h) - 1, 4) == 0.0182


@pytest.mark.parametrize("spec", ["huginn:tiny", "ouro:tiny", "raven_llama:tiny", "raven_olmo:tiny"])
def test_padding_is_exact_for_every_family(spec):
  """Logits at depths 1 and 2 of the model laid out for a model axis of 8 (MHA: 4 -> 8 heads; GQA 4 / 2: KV
  heads stored twice, then padded to 8 / 8) equal the unpadded ones (up to float summation order); OLMo
  without the q/k-norm correction does not."""
  cfg = model_config(spec, recurrence=2)  # the layout acts inside every block; depth does not matter here
  model = api.from_config(cfg, 0, contraction=0.05)
  to = sharding.padded_config(cfg, _sizes(1, 8))
  assert to.num_kv_heads == 8 and to.head_padding > 0
  params = sharding.pad_params(model.params, cfg, to)
  tokens, lengths = jnp.asarray([[3, 5, 7, 9, 11, 2]]), jnp.asarray([6])
  depths = (1, cfg.recurrence)
  forward = jax.jit(looped.forward_depths, static_argnums=(3, 4))
  ref = forward(model.params, tokens, lengths, depths, cfg)
  out = forward(params, tokens, lengths, depths, to)
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=2e-5)
  np.testing.assert_array_equal(np.argmax(out, -1), np.argmax(ref, -1))
  if cfg.qk_norm:  # control: averaging the q/k norms over the padded width changes the outputs
    bad = forward(params, tokens, lengths, depths, to.replace(head_padding=0, kv_repeat=1))
    assert float(jnp.max(jnp.abs(bad - ref))) > 1e-3


# ---------------------------------------------------------------------------------------------------
# 8 simulated devices (a subprocess)
# ---------------------------------------------------------------------------------------------------
def _worker(name: str, out_path: str):
  del name  # one worker
  from loopspec_jax.decoding import autoregressive, common

  assert jax.device_count() == 8, jax.devices()
  rec = helpers.record_sharded_calls()  # every sharded program run here, its traces and compiles
  cfg = model_config("huginn:tiny", **HUGINN3)
  model = api.from_config(cfg, 0, contraction=0.05)
  v = cfg.vocab_size
  prompts = [[int(t) for t in (np.arange(n) * m + 3) % v] for n, m in ((5, 7), (11, 13), (3, 5), (6, 3))]
  plans = {shape: sharding.plan(sharding.make_mesh(shape)) for shape in ((1, 8), (2, 4))}
  # (2, 4): parameters placed padded, with their config, as load(..., mesh=) does.
  placed = api.LoopedModel(
      sharding.padded_config(cfg, plans[(2, 4)]), sharding.shard_params(model.params, cfg, plans[(2, 4)])
  )
  report = {"tokens": {}, "cache": {}}
  for shape, mdl in ((None, model), ((1, 8), model), ((2, 4), placed)):
    mesh = None if shape is None else plans[shape]
    for method, kw in METHODS.items():
      res = api.generate(mdl, prompts, max_new_tokens=N_NEW, method=method, mesh=mesh, **kw)
      report["tokens"][f"{shape}|{method}"] = res.tokens
      if shape is None:
        continue
      loop = {
          "ar": "autoregressive.decode_loop",
          "chain": "chain.decode_loop",
          "loopspec": "loopspec.tick.decode_loop",
      }[method]
      st = [c["out"] for c in rec["calls"] if c["name"] == f"loopspec_jax.decoding.{loop}"][-1]
      report["cache"][f"{shape}|{method}"] = [None if e is None else str(e) for e in st.cache.core[0][0].spec]
  report["kv_heads"] = {
      f"{c['mesh']}|{c['name'].split('.')[-2]}": c["kwargs"]["cfg"].num_kv_heads for c in rec["calls"]
  }
  report["programs"] = [rec["traces"], rec["compiles"], len({c["config"] for c in rec["calls"]})]
  # The compiled, SPMD-partitioned HLO of the AR loop on (1, 8): per-device cache buffers and collectives.
  mesh = plans[(1, 8)]
  dec = autoregressive.make_decoder(cfg, greedy=True, random_init=False)
  padded, rid, _ = sharding.pad_requests(prompts, None, mesh)
  tp, total = common.buckets([len(p) for p in padded], N_NEW, cfg)
  prompt_arr, len_arr = common.batch_prompts(padded, tp)
  sp = common.make_sampling_params(len(padded), N_NEW, 0.0, 0, 1.0, 0, None, rid)
  cache, tokens = common.prefill_for(
      dec, model.params, prompt_arr, len_arr, sp, cfg=cfg, total=total, random_init=False, mesh=mesh
  )
  state = sharding.entry(dec.init, mesh)(cache, tokens, len_arr, sp, **dec.init_kw)
  report["cache_global"] = list(state.cache.core[0][0].shape)
  params = sharding.shard_params(model.params, cfg, mesh)  # placed padded, as load(..., mesh=) does
  prog = sharding.program(dec.loop, mesh, params, state, sp, **dec.loop_kw)
  with jax.set_mesh(mesh.mesh):
    hlo = prog.jitted.lower(*prog.args).compile().as_text()
  report["hlo_collectives"] = re.findall(r"= (\w+\[[\d,]*\]\S*) (all-gather|all-to-all|collective-permute)\(", hlo)
  report["hlo_entry_params"] = re.findall(r"(\w+\[[\d,]*\])\S* parameter\(", hlo.split("ENTRY")[-1])
  with open(out_path, "w") as f:
    json.dump(report, f)


@pytest.fixture(scope="module")
def report():
  return helpers.run_workers(__file__, ["main"], XLA_FLAGS, WORKER_TIMEOUT_S)["main"]


@pytest.mark.slow  # one 8-device worker run (~55 s) shared by the three
def test_sharded_greedy_tokens_identical(report):
  toks = report["tokens"]
  ref = toks["None|ar"]
  assert len({tuple(t) for t in ref}) > 1
  for key, got in toks.items():
    assert got == ref, key


@pytest.mark.slow  # one 8-device worker run (~55 s) shared by the three
def test_kv_cache_sharded_over_model(report):
  for key, spec in report["cache"].items():
    assert spec[1:3] == ["data", "model"], (key, spec)  # [G, B, KV, T, D]: requests / KV heads
  # Every sharded program ran with 3 heads laid out as 8 on (1, 8) and 4 on (2, 4): one head per device.
  assert set(report["kv_heads"].items()) == {(k, 8 if k.startswith("(1, 8)") else 4) for k in report["kv_heads"]}
  traces, compiles, configs = report["programs"]
  assert traces == compiles == configs  # every sharded configuration traced and compiled once


@pytest.mark.slow  # one 8-device worker run (~55 s) shared by the three
def test_compiled_hlo_holds_one_head_per_device(report):
  g, b, kv, t, d = report["cache_global"]
  assert kv == 8  # 3 heads padded to 8
  per_device = f"[{g},{b},1,{t},{d}]"
  assert sum(p.endswith(per_device) for p in report["hlo_entry_params"]) >= 2, report["hlo_entry_params"]
  assert "f32[2,32,8]" in report["hlo_entry_params"]  # core wq [L, E, H*D]: one padded head of 8 per device
  full = f"[{g},{b},{kv},{t},{d}]"
  assert not any(p.endswith(full) for p in report["hlo_entry_params"])
  assert not any(shape.split("[")[1].startswith(full[1:]) for shape, _ in report["hlo_collectives"])
  assert not any(
      op in ("all-gather", "all-to-all") and f",{t},{d}]" in shape for shape, op in report["hlo_collectives"]
  )


if __name__ == "__main__":
  helpers.worker_main(_worker)
