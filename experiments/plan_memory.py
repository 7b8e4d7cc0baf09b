"""Memory plan per device: parameters, committed KV, speculative KV and lane state over a (data, model) mesh.

Sizes come from `jax.eval_shape` of the real state (parameters: `model.abstract_params`; AR: the decode
state around `kvcache.empty_cache`; LoopSpec: `loopspec.initial_state`) laid out by the logical axis rules
of `loopspec_jax.sharding` (a sharded dim holds shape / mesh-axis size per device; dims the mesh does not
divide are replicated), so nothing is allocated and planning 8 or 16 devices works on one CPU. Activations
and XLA workspace are not counted: keep some headroom below the flagged limit.

  python -m experiments.plan_memory --models=huginn_0125,ouro_2p6b --dtype=bfloat16 --context=4096 \
      --meshes=1x8,2x4 --batches=1,2,4,8 --device_memory_gib=16
"""
from __future__ import annotations

import functools
import importlib
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from experiments import common
from loopspec_jax import api
from loopspec_jax import autoregressive as ar
from loopspec_jax import kvcache
from loopspec_jax import loopspec
from loopspec_jax import model as M
from loopspec_jax import sharding
from loopspec_jax.config import from_config_dict


def define_flags():
  """Defines the flags (at run time, so that importing this module in tests defines none)."""
  flags.DEFINE_list("models", ["huginn_0125", "ouro_2p6b"], "configs/models module names (name[:overrides])")
  flags.DEFINE_string("dtype", "bfloat16", "parameter / cache dtype")
  flags.DEFINE_integer("context", 4096, "context length (cache positions) per request")
  flags.DEFINE_list("meshes", ["1x8", "2x4"], "mesh shapes DATAxMODEL")
  flags.DEFINE_list("batches", ["1", "2", "4", "8"], "requests per batch (padded to the data axis)")
  flags.DEFINE_list("methods", ["ar", "loopspec"], "ar and/or loopspec")
  flags.DEFINE_integer("d1", 0, "LoopSpec draft depth (0: max(1, R // 8))")
  flags.DEFINE_integer("d2", 0, "LoopSpec second-proposal depth (0: none)")
  flags.DEFINE_integer("lane_capacity", 0, "LoopSpec lanes per request (0: the default for d1, d2)")
  flags.DEFINE_float("device_memory_gib", 16.0, "memory per device; larger plans are flagged")
  flags.DEFINE_string("mesh_config", None, "configs/mesh module whose rules to use, e.g. v5e_8 (default: "
                      "sharding.RULES)")
  flags.DEFINE_string("out_dir", None, "write plan_memory.md / .json here (process 0 only)")


GIB = 1024 ** 3


def model_config(spec: str, dtype: str, context: int):
  name, _, arg = spec.partition(":")
  cfg = from_config_dict(importlib.import_module(f"configs.models.{name}").get_config(arg or None))
  return cfg.replace(dtype=dtype, max_len=max(cfg.max_len, context))


def abstract_states(cfg, batch: int, context: int, method: str, d1=None, d2=None, capacity=None) -> dict:
  """ShapeDtypeStruct trees by category: params, committed_kv, spec_kv, lanes, other."""
  params = M.abstract_params(cfg)
  sp = jax.eval_shape(lambda: api.sampling_params(batch, 1, 0.0, 0, 1.0, 0, None))
  tokens = jax.ShapeDtypeStruct((batch, context), jnp.int32)
  lengths = jax.ShapeDtypeStruct((batch,), jnp.int32)
  if method == "ar":
    layout = M.SlotLayout(cfg, 1)
    st = jax.eval_shape(lambda: ar.DecodeState(
        cache=kvcache.empty_cache(cfg, layout, batch, context), tokens=jnp.zeros((batch, context), jnp.int32),
        length=jnp.zeros((batch,), jnp.int32), n_new=jnp.zeros((batch,), jnp.int32),
        done=jnp.zeros((batch,), bool), iterations=jnp.int32(0)))
    rest = {k: getattr(st, k) for k in ("tokens", "length", "n_new", "done", "iterations")}
    return {"params": params, "committed_kv": st.cache, "spec_kv": {}, "lanes": {}, "other": (rest, sp)}
  readouts = (d1, cfg.recurrence) if d2 is None else (d1, d2, cfg.recurrence)
  layout = M.SlotLayout(cfg, len(readouts))
  cache = jax.eval_shape(lambda: kvcache.empty_cache(cfg, layout, batch, context))
  init = functools.partial(loopspec.initial_state, cfg=cfg, capacity=capacity, readouts=readouts)
  st = jax.eval_shape(init, cache, tokens, lengths, sp)
  rest = {k: getattr(st, k) for k in ("tokens", "length", "n_new", "done", "limit", "stats", "iterations")}
  return {"params": params, "committed_kv": st.cache, "spec_kv": st.spec, "lanes": st.lanes, "other": (rest, sp)}


def plan_row(cfg, batch: int, context: int, mesh_shape: tuple, method: str, rules=sharding.RULES, d1=None, d2=None,
             capacity=None, memory_gib: float = 16.0) -> dict:
  """Bytes per device of every category of one configuration (batch padded to the data axis)."""
  axis_sizes = dict(zip(sharding.MESH_AXES, mesh_shape))
  padded = -(-batch // axis_sizes["data"]) * axis_sizes["data"]
  trees = abstract_states(cfg, padded, context, method, d1, d2, capacity)
  row = {"batch": batch, "padded_batch": padded, "mesh": tuple(mesh_shape), "method": method}
  kinds = {"params": "params", "committed_kv": "cache", "spec_kv": "spec", "lanes": "state", "other": "state"}
  for cat, tree in trees.items():
    kind = kinds[cat]
    row[cat] = sharding.per_device_bytes(tree, kind, axis_sizes, rules, cfg)
  row["total"] = sum(row[c] for c in trees)
  row["fits"] = row["total"] <= memory_gib * GIB
  return row


def method_settings(cfg, method: str, d1: int = 0, d2: int = 0, capacity: int = 0):
  """(label, d1, d2, capacity) of a method for this model's recurrence (0: defaults)."""
  if method == "ar":
    return "ar", None, None, None
  d1 = d1 or max(1, cfg.recurrence // 8)
  d2 = d2 or None
  loopspec.validate(cfg, d1, d2, capacity or None)
  cap = capacity or loopspec.default_capacity(cfg.recurrence, d1, d2)
  label = f"loopspec(d1={d1}{'' if d2 is None else f',d2={d2}'},N={cap})"
  return label, d1, d2, cap


def markdown(rows: list, memory_gib: float) -> str:
  g = lambda b: f"{b / GIB:.2f}"
  lines = ["| model | mesh (data,model) | batch | method | params | committed KV | spec KV | lanes | other | "
           f"total GiB/device | fits {memory_gib:g} GiB |", "|" + "---|" * 11]
  for r in rows:
    lines.append(f"| {r['model']} | {r['mesh'][0]}x{r['mesh'][1]} | {r['batch']}"
                 f"{'' if r['padded_batch'] == r['batch'] else ' (pad ' + str(r['padded_batch']) + ')'} | "
                 f"{r['label']} | {g(r['params'])} | {g(r['committed_kv'])} | {g(r['spec_kv'])} | {g(r['lanes'])} | "
                 f"{g(r['other'])} | {g(r['total'])} | {'yes' if r['fits'] else '**NO**'} |")
  return "\n".join(lines)


def main(argv):
  del argv
  f = flags.FLAGS
  rules = sharding.RULES
  if f.mesh_config:
    from configs.mesh import _base as mesh_configs
    rules = sharding.rules_from_config(mesh_configs.resolve(f.mesh_config))
  meshes = [tuple(int(x) for x in m.lower().split("x")) for m in f.meshes]
  rows = []
  for spec in f.models:
    cfg = model_config(spec, f.dtype, f.context)
    for mesh_shape in meshes:
      for method in f.methods:
        label, d1, d2, cap = method_settings(cfg, method, f.d1, f.d2, f.lane_capacity)
        for b in f.batches:
          row = plan_row(cfg, int(b), f.context, mesh_shape, method, rules, d1, d2, cap, f.device_memory_gib)
          rows.append({"model": spec, "label": label, **row})
  table = markdown(rows, f.device_memory_gib)
  header = (f"dtype {f.dtype}, context {f.context}, {f.device_memory_gib:g} GiB per device; activations and "
            "workspace not counted")
  print(header + "\n\n" + table)
  if f.out_dir and common.is_main_process():
    common.atomic_write_text(os.path.join(f.out_dir, "plan_memory.md"), header + "\n\n" + table + "\n")
    common.atomic_write_json(os.path.join(f.out_dir, "plan_memory.json"), rows)


def run():
  define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
