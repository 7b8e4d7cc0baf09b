"""Memory plan per device: parameters, committed KV, speculative KV and lane state over a (data, model) mesh.

Sizes come from `jax.eval_shape` of the real state (parameters: `looped.abstract_params`; the cache and the
decode state: the prefill and `initial_state` of the decoder `generate` builds, sampling mode), laid out as
`loopspec_jax.parallel.sharding` lays them out (the axes the state's dataclasses declare, the rules, and the
fallback: a sharded dim holds shape / mesh-axis size per device; dims the mesh does not divide are
replicated), so nothing is allocated and planning 8 or 16 devices works on one CPU. Heads the model axis
does not divide are laid out as `generate` lays them out (`sharding.padded_config`: Huginn-0125's 55 heads
become 56 on a model axis of 2, 4 or 8, so its attention weights and KV caches shard). Activations and XLA
workspace are not counted: keep some headroom below the flagged limit. With `largest_batch_models`, a second
table gives the largest batch that fits per (model, mesh, method).

  loopspec-plan-memory --config.models=huginn:0125,ouro:2p6b --config.dtype=bfloat16 --config.context=4096 \
      --config.meshes=1x8,2x4 --config.batches=1,2,4,8 --config.device_memory_gib=16 \
      --config.largest_batch_models=huginn:0125,ouro:1p4b,ouro:2p6b

Settings: configs/plan_memory.py.
"""

from __future__ import annotations

import dataclasses
import functools
import os

from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags

from loopspec_configs import models as model_configs
from loopspec_configs.mesh import _base as mesh_configs
from loopspec_jax.decoding import autoregressive as ar
from loopspec_jax.decoding import common as common_dec
from loopspec_jax.decoding.loopspec import decoder as loopspec_decoder
from loopspec_jax.decoding.loopspec import state as loopspec
from loopspec_experiments import common
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import sharding

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("plan_memory.py"), "Memory plan settings.", flag_values=FLAGS
)

GIB = 1024**3
_SPLIT = ("cache", "spec", "lanes")  # decode-state fields with a category of their own


def model_config(spec: str, dtype: str, context: int):
  """The ModelConfig of a spec like "huginn:0125" in `dtype`, its context at least `context`."""
  cfg = model_configs.model_config(spec)
  return cfg.replace(dtype=dtype, max_len=max(cfg.max_len, context))


def make_decoder(cfg, method: str, d1=None, d2=None, capacity=None, greedy: bool = False):
  """The decoder `generate` would build for this method (by default sampling: the larger, worst-case state,
  whose LoopSpec lanes hold [B, N, V] distributions q1 / q2; greedy ones are [B, N, 0])."""
  if method == "ar":
    return ar.make_decoder(cfg, greedy=greedy, random_init=False)
  return loopspec_decoder.make_decoder(cfg, greedy=greedy, random_init=False, d1=d1, d2=d2, lane_capacity=capacity)


def abstract_states(
    cfg, batch: int, context: int, method: str, d1=None, d2=None, capacity=None, greedy: bool = False
) -> dict:
  """ShapeDtypeStruct trees by category: params, committed_kv, spec_kv, lanes, other.

  The shapes are those of the decoder's own prefill and initial state (`jax.eval_shape`, nothing allocated):
  committed_kv is the state's `cache` (a KVCache), spec_kv its `spec` (a SpecKV) and lanes its `lanes` (a
  LaneTable; LoopSpec only, else {}); other is (the state with those fields set to None, the sampling
  parameters). Every category stays a tree of the decoders' dataclasses, so their declared logical axes
  lay it out (`sharding.per_device_bytes(tree, "state", ...)`).
  """
  dec = make_decoder(cfg, method, d1, d2, capacity, greedy)
  params = M.abstract_params(cfg)
  sp = jax.eval_shape(lambda: common_dec.make_sampling_params(batch, 1, 1.0, 0, 1.0, 0, None))
  prompt = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  lengths = jax.ShapeDtypeStruct((batch,), jnp.int32)
  prefill = functools.partial(
      common_dec.prefill_state,
      cfg=cfg,
      readout_depths=dec.readout_depths,
      total_len=context + dec.extra_positions,
      random_init=False,
      cache_group=dec.cache_group,
  )
  cache, tokens = jax.eval_shape(prefill, params, prompt, lengths, sp)
  st = jax.eval_shape(functools.partial(dec.init, **dec.init_kw), cache, tokens, lengths, sp)
  split = [f.name for f in dataclasses.fields(st) if f.name in _SPLIT]
  parts = {name: getattr(st, name) for name in split}
  return {
      "params": params,
      "committed_kv": parts["cache"],
      "spec_kv": parts.get("spec", {}),
      "lanes": parts.get("lanes", {}),
      "other": (st.replace(**{name: None for name in split}), sp),
  }


def plan_row(
    cfg,
    batch: int,
    context: int,
    mesh_shape: tuple,
    method: str,
    rules=sharding.RULES,
    d1=None,
    d2=None,
    capacity=None,
    memory_gib: float = 16.0,
    greedy: bool = False,
) -> dict:
  """Bytes per device of every category of one configuration (batch padded to the data axis).

  The heads are laid out as `generate` and `load(..., mesh=)` lay them out on this mesh
  (`sharding.padded_config`: repeated or zero-padded until the model axis divides them); `heads` records the
  (query, KV) head counts used, `attention_overhead` their extra attention weights / KV in total.
  """
  axis_sizes = dict(zip(sharding.MESH_AXES, mesh_shape))
  padded = -(-batch // axis_sizes["data"]) * axis_sizes["data"]
  laid = sharding.padded_config(cfg, axis_sizes, rules)
  trees = abstract_states(laid, padded, context, method, d1, d2, capacity, greedy)
  row = {"batch": batch, "padded_batch": padded, "mesh": tuple(mesh_shape), "method": method}
  row["heads"] = (laid.num_heads, laid.num_kv_heads)
  row["attention_overhead"] = laid.num_heads / cfg.num_heads - 1
  for cat, tree in trees.items():
    kind = "params" if cat == "params" else "state"  # the state's dataclasses declare their axes
    row[cat] = sharding.per_device_bytes(tree, kind, axis_sizes, rules, laid)
  row["total"] = sum(row[c] for c in trees)
  row["fits"] = row["total"] <= memory_gib * GIB
  return row


def largest_batch(
    cfg,
    context: int,
    mesh_shape: tuple,
    method: str,
    rules=sharding.RULES,
    d1=None,
    d2=None,
    capacity=None,
    memory_gib: float = 16.0,
    greedy: bool = False,
    limit: int = 1 << 16,
) -> dict:
  """The plan row of the largest batch (a multiple of the data axis, at most `limit`) that fits `memory_gib`
  per device, or of the smallest batch with `fits` False when none does.

  Every leaf of the decode state holds the batch (or none of it), so the bytes per device are affine in the
  batch: two plans (data and 2 x data requests) give the answer, a third confirms it.
  """
  data = int(mesh_shape[0])
  row = lambda b: plan_row(cfg, b, context, mesh_shape, method, rules, d1, d2, capacity, memory_gib, greedy)
  one, two = row(data), row(2 * data)
  if not one["fits"]:
    return one
  per_group = two["total"] - one["total"]  # bytes per device of `data` more requests
  groups = int((memory_gib * GIB - one["total"]) // per_group) + 1 if per_group else limit // data
  groups = max(1, min(groups, limit // data))
  best = row(groups * data)
  while not best["fits"] and groups > 1:  # never taken while the bytes are affine
    groups -= 1
    best = row(groups * data)
  return best


def method_settings(cfg, method: str, d1=None, d2=None, capacity=None):
  """(label, d1, d2, capacity) of a method for this model's recurrence (None: defaults)."""
  if method == "ar":
    return "ar", None, None, None
  d1 = d1 or max(1, cfg.recurrence // 8)
  d2 = d2 or None
  loopspec.validate(cfg, d1, d2, capacity or None)
  cap = capacity or loopspec.default_capacity(cfg.recurrence, d1, d2)
  label = f"loopspec(d1={d1}{'' if d2 is None else f',d2={d2}'},N={cap})"
  return label, d1, d2, cap


def _heads(r) -> str:
  h, kv = r["heads"]
  return f"{h}" if h == kv else f"{h}/{kv}"


def markdown(rows: list, memory_gib: float) -> str:
  g = lambda b: f"{b / GIB:.2f}"
  lines = [
      "| model | mesh (data,model) | heads (q/kv) | batch | method | params | committed KV | spec KV | lanes | other | "
      f"total GiB/device | fits {memory_gib:g} GiB |",
      "|" + "---|" * 12,
  ]
  for r in rows:
    lines.append(
        f"| {r['model']} | {r['mesh'][0]}x{r['mesh'][1]} | {_heads(r)} | {r['batch']}"
        f"{'' if r['padded_batch'] == r['batch'] else ' (pad ' + str(r['padded_batch']) + ')'} | "
        f"{r['label']} | {g(r['params'])} | {g(r['committed_kv'])} | {g(r['spec_kv'])} | {g(r['lanes'])} | "
        f"{g(r['other'])} | {g(r['total'])} | {'yes' if r['fits'] else '**NO**'} |"
    )
  return "\n".join(lines)


def largest_markdown(rows: list, memory_gib: float) -> str:
  """The largest batch per (model, mesh, method) that fits `memory_gib` per device."""
  lines = [
      f"| model | mesh (data,model) | heads (q/kv) | head overhead | method | largest batch | GiB/device at it |",
      "|" + "---|" * 7,
  ]
  for r in rows:
    batch = r["batch"] if r["fits"] else f"none ({r['batch']}: {r['total'] / GIB:.2f} GiB)"
    lines.append(
        f"| {r['model']} | {r['mesh'][0]}x{r['mesh'][1]} | {_heads(r)} | {100 * r['attention_overhead']:+.1f}% | "
        f"{r['label']} | {batch} | {r['total'] / GIB:.2f} |"
    )
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# The plan beside the TPU compiler's memory analysis (`loopspec-aot` rows, or a compile here with libtpu)
# ---------------------------------------------------------------------------------------------------
def aot_method(spec: str):
  """(method, d1, d2) of a `loopspec-aot` method spec the planner covers ('ar', 'loopspec:d1=2,d2=8'), else
  None (the planner plans AR and LoopSpec only)."""
  name, _, args = spec.partition(":")
  kw = dict(a.split("=", 1) for a in args.split(",") if a)
  if name == "ar" and not kw:
    return "ar", None, None
  if name == "loopspec" and set(kw) <= {"d1", "d2"}:
    return "loopspec", int(kw.get("d1", 0)) or None, int(kw["d2"]) if "d2" in kw else None
  return None


def compare_row(aot_row: dict, dtype: str = "bfloat16", tolerance: float = 0.10):
  """A `loopspec-aot` row (one decode loop compiled for a TPU: per-device `argument_bytes`, `temp_bytes`,
  `hbm_bytes`, `fits`) beside the plan of the same configuration (greedy, as the loop was compiled; cache
  of the row's context), or None for a method the planner does not cover. `ratio` is the compiler's HBM
  over the plan's total, `agrees` whether it is within `tolerance` (the plan counts neither activations nor
  XLA's workspace, so it is a lower bound)."""
  parsed = aot_method(aot_row["method"])
  if parsed is None or aot_row.get("hbm_bytes") is None:
    return None
  method, d1, d2 = parsed
  cfg = model_configs.model_config(aot_row["model"]).replace(dtype=dtype, max_len=int(aot_row["context"]))
  mesh = mesh_configs.parse_shape(aot_row["mesh"])
  d1 = d1 or (max(1, cfg.recurrence // 8) if method == "loopspec" else None)
  cap = loopspec.default_capacity(cfg.recurrence, d1, d2) if method == "loopspec" else None
  plan = plan_row(
      cfg, int(aot_row["batch"]), int(aot_row["context"]), mesh, method, d1=d1, d2=d2, capacity=cap, greedy=True
  )
  ratio = aot_row["hbm_bytes"] / plan["total"]
  keys = ("model", "method", "target", "mesh", "batch", "context", "compiled", "fits")
  out = {k: aot_row[k] for k in keys}
  out.update({f"compiler_{k}": aot_row[k] for k in ("argument_bytes", "temp_bytes", "hbm_bytes")})
  out.update(plan_bytes=plan["total"], ratio=ratio, agrees=bool(abs(ratio - 1.0) <= tolerance))
  return out


def compile_aot_row(model: str, method: str, target: str, mesh: str, batch: int, context: int, dtype: str) -> dict:
  """The memory fields of a `loopspec-aot` row of one configuration, compiled here (needs libtpu:
  `aot.tpu_unavailable`)."""
  from loopspec_jax.analysis import aot  # noqa: PLC0415 (only with libtpu)

  cfg = model_configs.model_config(model).replace(dtype=dtype, max_len=context)
  r = aot.compile_loop(cfg, method, target, tuple(mesh_configs.parse_shape(mesh)), batch=batch)
  row = {"model": model, "method": method, "target": r.target, "mesh": mesh, "batch": batch, "context": context}
  row.update(compiled=r.compiled, error=r.error, fits=r.memory.get("fits"))
  return {**row, **{k: r.memory.get(k) for k in ("argument_bytes", "temp_bytes", "hbm_bytes")}}


def comparison_markdown(rows: list) -> str:
  """The plan beside the compiler, GB = 1e9 bytes per device."""
  gb, lines = common.gb, []
  for r in rows:
    fits = {True: "yes", False: "no", None: "-"}[r["fits"]] + ("" if r["compiled"] else " (refused)")
    cells = [r[k] for k in ("model", "method", "target", "mesh", "batch", "context")]
    cells += [gb(r["plan_bytes"]), gb(r["compiler_argument_bytes"])]
    cells += [gb(r["compiler_temp_bytes"]), gb(r["compiler_hbm_bytes"]), f"{r['ratio']:.2f}"]
    lines.append(cells + ["yes" if r["agrees"] else "no", fits])
  header = (
      "model | method | target | mesh | batch | context | plan GB | compiler arguments GB | compiler temporaries GB"
      " | compiler HBM GB | HBM / plan | within 10% | fits (compiler)"
  )
  return common.md_table(header, lines)


def compiler_comparison(f) -> str:
  """The plans beside the compiler's figures: every AR / LoopSpec row of `f.aot_rows` (a `loopspec-aot`
  rows.jsonl), and with `f.aot_compile` each (model, mesh, batch, method) of the settings compiled here for
  `f.aot_target`. Writes plan_vs_compiler.md / .json to out_dir."""
  import json  # noqa: PLC0415

  aot_rows = []
  if f.aot_rows:
    with open(f.aot_rows) as fh:
      aot_rows = [json.loads(line) for line in fh if line.strip()]
  if f.aot_compile:
    for spec in common.split_list(f.models):
      cfg = model_config(spec, f.dtype, f.context)
      for method in common.split_list(f.methods):
        _, d1, d2, _ = method_settings(cfg, method, f.d1, f.d2)
        text = "ar" if method == "ar" else f"loopspec:d1={d1}" + ("" if d2 is None else f",d2={d2}")
        for mesh in common.split_list(f.meshes):
          for b in common.split_list(f.batches):
            aot_rows.append(compile_aot_row(spec, text, f.aot_target, mesh, int(b), f.context, f.dtype))
  rows = [r for r in (compare_row(a, f.dtype) for a in aot_rows) if r is not None]
  text = comparison_markdown(rows)
  if f.out_dir and common.is_main_process():
    common.atomic_write_text(os.path.join(f.out_dir, "plan_vs_compiler.md"), text + "\n")
    common.atomic_write_json(os.path.join(f.out_dir, "plan_vs_compiler.json"), {"rows": rows})
  return text


def main(argv):
  del argv
  f = _CONFIG.value
  if f.aot_rows or f.aot_compile:
    return print(compiler_comparison(f))
  rules = sharding.RULES
  if f.mesh_config:
    rules = sharding.rules_from_config(mesh_configs.resolve(f.mesh_config))
  meshes = [mesh_configs.parse_shape(m) for m in common.split_list(f.meshes)]
  rows = []
  for spec in common.split_list(f.models):
    cfg = model_config(spec, f.dtype, f.context)
    for mesh_shape in meshes:
      for method in common.split_list(f.methods):
        label, d1, d2, cap = method_settings(cfg, method, f.d1, f.d2, f.lane_capacity)
        for b in common.split_list(f.batches):
          row = plan_row(cfg, int(b), f.context, mesh_shape, method, rules, d1, d2, cap, f.device_memory_gib)
          rows.append({"model": spec, "label": label, **row})
  table = markdown(rows, f.device_memory_gib)
  header = (
      f"dtype {f.dtype}, context {f.context}, {f.device_memory_gib:g} GiB per device; activations and "
      "workspace not counted"
  )
  text = header + "\n\n" + table
  largest = []
  if f.largest_batch_models:
    for spec in common.split_list(f.largest_batch_models):
      cfg = model_config(spec, f.dtype, f.context)
      for mesh_shape in meshes:
        for method in common.split_list(f.methods):
          label, d1, d2, cap = method_settings(cfg, method, f.d1, f.d2, f.lane_capacity)
          row = largest_batch(cfg, f.context, mesh_shape, method, rules, d1, d2, cap, f.device_memory_gib)
          largest.append({"model": spec, "label": label, **row})
    text += "\n\nLargest batch per mesh\n\n" + largest_markdown(largest, f.device_memory_gib)
  print(text)
  if f.out_dir and common.is_main_process():
    common.atomic_write_text(os.path.join(f.out_dir, "plan_memory.md"), text + "\n")
    common.atomic_write_json(os.path.join(f.out_dir, "plan_memory.json"), {"rows": rows, "largest": largest})


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
