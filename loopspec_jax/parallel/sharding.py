"""Sharded decoding over a ('data', 'model') device mesh: meshes, placement, request padding, entry points.

The layout is declared, not computed here: every array dimension has a logical name (`parallel/logical.py`
for the decode state, the parameter table of `parallel/rules.py`), `rules.RULES` maps names to mesh axes
through flax's logical mapping, and heads a mesh axis does not divide are laid out first
(`parallel/heads.py`). This module builds meshes (`make_mesh`, `mesh_from_config`), places trees
(`place`, `shard_params`, `shard_model`; also across processes), gathers what the host reads (`to_host`),
pads the batch to the data axis (`pad_requests`, `drop_padding`) and runs the decode entry points sharded.

Entry points (prefill, each method's initial state and decode loop; each declares its argument kinds where it
is defined, `@entry.program(entry.LOOP)`, or `@entry.declare(...)` under its own jax.jit, see
`parallel/entry.py`) run as
`jax.jit(run_sharded, in_shardings=..., out_shardings=..., donate_argnums=..., static_argnums=...)`, under
`jax.set_mesh(mesh)`, on inputs placed up front: `entry(fn, mesh)` returns that sharded version of `fn`
(`fn` itself when mesh is None, so the single-device path is unchanged). The shardings are built at each call
from the arguments' shapes and the declared axes (`program`); `run_sharded` is one module-level function
whose static arguments are the entry's function, its static keyword arguments, the parameter layouts and the
mesh plan, so jax.jit's own cache (keyed on the function, its static arguments and the input avals and
shardings) keeps one trace and one compile per configuration: nothing here caches. An entry point may take
several parameter trees, each with its own config (`rules.PARAM_KINDS`: 'params' with `cfg`, 'draft_params'
with `dcfg`, the separate drafter of method='draft'); each is laid out and sharded by the same rules in its
own config's head layout. A dimension that still does not divide (e.g. 3 requests on a data axis of 2) falls
back to replication.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, Callable

import jax
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh
import numpy as np

from loopspec_jax.parallel import entry as entry_lib
from loopspec_jax.parallel.entry import EntryPoint
from loopspec_jax.parallel import heads
from loopspec_jax.parallel import rules as rules_lib
from loopspec_jax.parallel.rules import MeshPlan, PARAM_KINDS, plan, tree_shardings

# Re-exported: the names of rules.py / heads.py that callers read as `sharding.X` (experiments/plan_memory.py,
# api.py, tests/parallel/test_head_padding.py, tests/experiments/test_plan_memory.py). New code imports those modules.
MESH_AXES, RULES = rules_lib.MESH_AXES, rules_lib.RULES
per_device_bytes, shard_shape, tree_specs = rules_lib.per_device_bytes, rules_lib.shard_shape, rules_lib.tree_specs
base_config, pad_params, padded_config = heads.base_config, heads.pad_params, heads.padded_config


# ---------------------------------------------------------------------------------------------------
# Meshes
# ---------------------------------------------------------------------------------------------------
def make_mesh(shape=(1, 1), devices=None) -> Mesh:
  """A ('data', 'model') mesh of `shape` over the first data * model devices (auto-sharded axes)."""
  shape = tuple(int(s) for s in shape)
  if len(shape) != 2:
    raise ValueError(f"mesh shape must be (data, model), got {shape}")
  devices = jax.devices() if devices is None else list(devices)
  n = math.prod(shape)
  if n > len(devices):
    raise ValueError(f"mesh {shape} needs {n} devices; {len(devices)} available")
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 2, devices=devices[:n])


def mesh_from_config(cd, devices=None) -> Mesh:
  """The mesh of a configs/mesh/ ConfigDict (its `mesh_shape`)."""
  return make_mesh(tuple(cd.mesh_shape), devices)


def rules_from_config(cd) -> tuple:
  """The rules of a configs/mesh/ ConfigDict as a hashable tuple of (logical, mesh axis or None)."""
  return rules_lib.normalize_rules(cd.rules)


# ---------------------------------------------------------------------------------------------------
# Placement and host transfer (single- or multi-process)
# ---------------------------------------------------------------------------------------------------
def _place(x, sharding):
  if isinstance(x, jax.ShapeDtypeStruct):  # an abstract value (a compile-only target): nothing is placed
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
    return jax.device_put(x, sharding)
  host = np.asarray(x)  # every process holds the same value: build the global array from it
  return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def place(tree, shardings):
  """device_put of a tree onto a matching tree of NamedShardings (also across processes). Abstract leaves
  (`jax.ShapeDtypeStruct`) get the sharding and stay abstract, so a `program` built from abstract values
  lowers for a device topology without a device (`Program.lower`, `analysis/aot.py`)."""
  return jax.tree_util.tree_map(_place, tree, shardings)


def shard_params(params, cfg, mesh, rules=None):
  """Places the parameters on the mesh as the rules say, in the head layout of `padded_config(cfg, mesh)`
  (`load(..., mesh=)` calls this and keeps that config as the model's): heads the model axis does not divide
  are repeated or zero-padded first (`pad_params`), so attention weights and KV caches shard too."""
  mesh_plan = plan(mesh, rules)
  cfg_to = padded_config(cfg, mesh_plan)
  params = pad_params(params, cfg, cfg_to)
  return place(params, tree_shardings(params, "params", mesh_plan, cfg_to))


def shard_model(model, mesh, rules=None):
  """`model` (a LoopedModel) with its parameters placed by `shard_params` and its config in the same head layout
  (`padded_config`), so the decoders see the padded head count the parameters have."""
  cfg_to = padded_config(model.config, plan(mesh, rules))
  return dataclasses.replace(model, config=cfg_to, params=shard_params(model.params, model.config, mesh, rules))


def to_host(tree, skip=("cache", "spec")):
  """With several processes, gathers the leaves the host reads (not KV stores) into full local arrays."""
  if jax.process_count() == 1:
    return tree

  def one(path, x):
    if path and rules_lib.key_name(path[0]) in skip or not isinstance(x, jax.Array) or x.is_fully_addressable:
      return x
    return multihost_utils.process_allgather(x, tiled=True)

  return jax.tree_util.tree_map_with_path(one, tree)


# ---------------------------------------------------------------------------------------------------
# Request padding
# ---------------------------------------------------------------------------------------------------
def pad_requests(prompts: list, request_ids, mesh_plan: MeshPlan):
  """Pads the batch to a multiple of the data-axis size with one-token dummy requests (dropped later).

  Returns (prompts, request_ids or None, number of real requests)."""
  n = len(prompts)
  d = mesh_plan.data_size
  n_pad = -n % d
  if n_pad == 0:
    return prompts, request_ids, n
  if request_ids is None:
    rid = list(range(n + n_pad))
  else:
    rid = [int(r) for r in np.asarray(request_ids).reshape(-1)]
    rid = rid + [max(rid) + 1 + i for i in range(n_pad)]
  return prompts + [[0]] * n_pad, rid, n


def drop_padding(result, n: int):
  """Removes the dummy requests (indices >= n) from a GenerateResult: its counts keep the first n requests'
  per-request counters (`DecodeStats.drop_requests`), and its figures are derived from those."""
  if len(result.tokens) == n:
    return result
  counts = result.counts.drop_requests(n)
  stats = dict(counts.summary(), padded_batch=len(result.tokens))
  return dataclasses.replace(result, tokens=result.tokens[:n], stats=stats, counts=counts)


# ---------------------------------------------------------------------------------------------------
# The sharded decode entry points
# ---------------------------------------------------------------------------------------------------
_N_STATIC = 4  # run_sharded's static arguments: (fn, static keyword items, parameter layouts, mesh plan)


def entry_name(fn) -> str:
  return f"{fn.__module__}.{fn.__name__}"


def is_entry_point(fn) -> bool:
  """Whether `fn` declares how it runs sharded (`entry.declare`), i.e. runs on a mesh."""
  return entry_lib.declared(fn) is not None


def entry_point(fn) -> EntryPoint:
  """The EntryPoint `fn` (a jitted decode function or its Python function) declares where it is defined
  (`@entry.program(...)`, or `@entry.declare(...)` under its jax.jit); a KeyError naming it when it declares
  none."""
  ep = entry_lib.declared(fn)
  if ep is None:
    raise KeyError(
        f"{entry_name(fn)} is not a sharded decode entry point: declare one with "
        "@loopspec_jax.parallel.entry.program(...) (or entry.declare(...) under its jax.jit)"
    )
  return ep


def _lay_out(x, layout, mesh_plan: MeshPlan):
  """Parameters in their config's head layout laid out for the mesh's (inside the program), then constrained
  to the shardings the rules give them there. layout: (kind, config as given, laid-out config)."""
  kind, cfg, cfg_to = layout
  x = pad_params(x, cfg, cfg_to)
  return jax.lax.with_sharding_constraint(x, tree_shardings(x, kind, mesh_plan, cfg_to))


def run_sharded(fn: Callable, static: tuple, layouts: tuple, mesh_plan: MeshPlan, *arrays):
  """The traced body of every sharded program: `fn(*arrays, **dict(static))`, after laying out the parameter
  trees whose `layouts` entry is not None (`_lay_out`). One module-level function, so that every `jax.jit`
  built around it by `program` shares jax.jit's own trace and compile cache."""
  arrays = tuple(x if lay is None else _lay_out(x, lay, mesh_plan) for x, lay in zip(arrays, layouts))
  with rules_lib.tracing(mesh_plan):  # layout pins per shard (`rules.per_shard`)
    return fn(*arrays, **dict(static))


def _bind(fn, mesh_plan: MeshPlan, ep: EntryPoint, args, kwargs):
  """(array arguments, static keyword items with configs laid out for the mesh, per-array parameter layouts
  or None, per-array config its shardings follow) of one call of entry point `fn`."""
  bound = inspect.signature(getattr(fn, "__wrapped__", fn)).bind(*args, **kwargs)
  bound.apply_defaults()
  values = list(bound.arguments.items())
  arrays = tuple(v for _, v in values[: len(ep.kinds)])
  static = values[len(ep.kinds) :]
  # Configs (cfg, and dcfg for a drafter) in the head layout of this mesh (themselves when heads divide).
  base = {k: v for k, v in static if k in PARAM_KINDS.values()}
  laid = {k: padded_config(v, mesh_plan) for k, v in base.items()}
  static = tuple((k, laid.get(k, v)) for k, v in static)
  layouts, cfgs = [], []
  for x, kind in zip(arrays, ep.kinds):
    c = PARAM_KINDS.get(kind, "cfg") if isinstance(kind, str) else "cfg"  # the state follows the model's
    # Parameters still in their config's head layout (not placed by `shard_params`): laid out in the program.
    pad = kind in PARAM_KINDS and laid.get(c) != base.get(c) and not heads.params_match(x, laid[c])
    layouts.append((kind, base[c], laid[c]) if pad else None)
    cfgs.append(base.get(c) if pad else laid.get(c))
  return arrays, static, tuple(layouts), tuple(cfgs)


@dataclasses.dataclass(frozen=True)
class Program:
  """One sharded call of an entry point, ready to run: `jitted(*args)` under `jax.set_mesh(mesh_plan.mesh)`.

  jitted: `jax.jit(run_sharded, static_argnums=(0, 1, 2, 3), in_shardings=..., out_shardings=...,
  donate_argnums=...)`; args: its static arguments (the entry's Python function, its static keyword items,
  the parameter layouts, the mesh plan), then the array arguments placed on their input shardings. A Program
  is built per call and dropped; the compiled program lives in jax.jit's cache."""

  name: str
  jitted: Any
  args: tuple
  mesh_plan: MeshPlan
  gather: bool  # the output is a decode state the host reads: `to_host` it

  @property
  def kwargs(self) -> dict:
    """The static keyword arguments the entry runs with (its configs in the mesh's head layout)."""
    return dict(self.args[1])

  @property
  def arrays(self) -> tuple:
    return self.args[_N_STATIC:]

  def lower(self):
    """The lowered program (`jax.stages.Lowered`), from placed or abstract arguments; compiles nothing."""
    with jax.set_mesh(self.mesh_plan.mesh):
      return self.jitted.lower(*self.args)

  def __call__(self):
    with jax.set_mesh(self.mesh_plan.mesh):
      out = self.jitted(*self.args)
    return to_host(out) if self.gather else out


def program(fn, mesh, *args, **kwargs) -> Program:
  """The sharded program of one call `fn(*args, **kwargs)` of an entry point on `mesh` (a Mesh or MeshPlan).

  Input shardings come from the arguments' declared axes (`EntryPoint.kinds`); output shardings are an
  input's (`out` an index) or read off the output's abstract value, `jax.jit(...).eval_shape` with the same
  input shardings, which shares the call's trace. Places the arrays; compiles nothing until called."""
  mesh_plan, ep = plan(mesh), entry_point(fn)
  arrays, static, layouts, cfgs = _bind(fn, mesh_plan, ep, args, kwargs)
  in_sh = tuple(tree_shardings(x, k, mesh_plan, c) for x, k, c in zip(arrays, ep.kinds, cfgs))
  statics = (getattr(fn, "__wrapped__", fn), static, layouts, mesh_plan)
  jit = lambda **kw: jax.jit(
      run_sharded,
      static_argnums=tuple(range(_N_STATIC)),
      in_shardings=in_sh,
      donate_argnums=tuple(_N_STATIC + i for i in ep.donate),
      **kw,
  )
  with jax.set_mesh(mesh_plan.mesh):
    placed = place(arrays, in_sh)
    if isinstance(ep.out, int):
      out_sh = in_sh[ep.out]
    else:
      shapes = jit().eval_shape(*statics, *placed)
      cfg = dict(static).get("cfg")
      kinds = ep.out if isinstance(ep.out, tuple) else None
      out_sh = (
          tuple(tree_shardings(x, k, mesh_plan, cfg) for x, k in zip(shapes, kinds))
          if kinds
          else tree_shardings(shapes, ep.out, mesh_plan, cfg)
      )
  return Program(entry_name(fn), jit(out_shardings=out_sh), statics + placed, mesh_plan, isinstance(ep.out, int))


def entry(fn, mesh, rules=None):
  """`fn` (a declared entry point, `entry.declare`) when mesh is None, else its sharded version with the same
  signature: each call builds its `program` (shardings from the arguments' shapes) and runs it."""
  if mesh is None:
    return fn
  mesh_plan = plan(mesh, rules)
  entry_point(fn)  # an unknown function fails here, before any argument is looked at

  def call(*args, **kwargs):
    return program(fn, mesh_plan, *args, **kwargs)()

  call.__name__ = f"sharded_{fn.__name__}"
  return call
