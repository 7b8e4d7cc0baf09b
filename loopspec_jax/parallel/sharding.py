"""Sharded decoding over a ('data', 'model') device mesh, driven by one table of logical axis rules.

Every array dimension of the parameters and of the decode state has a *logical* name (batch, heads,
kv_heads, mlp, embed, vocab, lanes, layers, ...). `RULES` maps those names to mesh axes, as MaxText does
(configs/mesh/ holds ml_collections versions): attention heads, KV heads, MLP width and vocabulary over
`model`; requests (batch) over `data`; everything else replicated.

Fallback: a dimension whose mesh axes do not divide it is replicated instead of sharded. Fused head
dimensions (wq's H*D, wk's KV*D, ...) are checked in whole heads, so a shard never splits a head; e.g.
Huginn-0125 has 55 heads, so on a model axis of 2, 4 or 8 its attention weights and KV caches are
replicated while its MLP (17920 wide) and vocabulary (65536) are sharded. A mesh axis is used at most once
per array (a later dimension mapped to the same axis is replicated).

Decode entry points run as `jax.jit` with explicit in/out shardings and donated state, under
`jax.set_mesh(mesh)`, on inputs placed up front; `entry(fn, mesh)` returns that sharded version of one of
`ENTRY_POINTS` (built once per function, mesh, rules and static arguments, then cached) and `fn` itself when
mesh is None, so the single-device path is unchanged.
"""
from __future__ import annotations

import collections
import dataclasses
import inspect
import math
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

DATA, MODEL = "data", "model"
MESH_AXES = (DATA, MODEL)

# logical axis -> mesh axis (None: replicated). The single source of truth; configs/mesh/ copies it.
RULES = (
    ("batch", DATA),  # requests
    ("heads", MODEL),  # attention heads (wq / wo / qk_bias / q_norm, in whole heads)
    ("kv_heads", MODEL),  # KV heads (wk / wv / k_norm, KV caches, speculative KV)
    ("mlp", MODEL),  # MLP width
    ("vocab", MODEL),  # embedding rows, LM head columns, lane distributions q1 / q2
    ("embed", None),  # hidden size
    ("layers", None),  # stacked layers of a block stack
    ("slots", None),  # (recurrent step, layer) cache slots
    ("length", None),  # cache / token positions
    ("lanes", None),  # LoopSpec lanes per request
    ("head_dim", None),
    ("qk", None),  # the q/k pair of Huginn's qk_bias
    ("key", None),  # the two words of a raw PRNG key
)

_LAYER_AXES = {
    "wq": ("layers", "embed", "heads"), "wk": ("layers", "embed", "kv_heads"),
    "wv": ("layers", "embed", "kv_heads"), "wo": ("layers", "heads", "embed"),
    "w_gate": ("layers", "embed", "mlp"), "w_up": ("layers", "embed", "mlp"), "w_down": ("layers", "mlp", "embed"),
    "qk_bias": ("layers", "qk", "heads", "head_dim"), "q_norm": ("layers", "heads"),
    "k_norm": ("layers", "kv_heads"),
}
_TOP_AXES = {
    "embed": ("vocab", "embed"), "lm_head": ("embed", "vocab"), "final_norm": ("embed",),
    "adapter": ("embed", "embed"), "w": ("embed", None), "b": (None,),  # w / b: Ouro's exit gate
}
_STACKS = ("prelude", "core", "coda")

# Decode state (AR DecodeState, ChainState, LoopSpecState with its LaneTable and stats, SamplingParams).
_CACHE_AXES = ("slots", "batch", "kv_heads", "length", "head_dim")  # committed KV [n_slots, B, KV, T, D]
_SPEC_AXES = ("slots", "batch", "kv_heads", "lanes", "head_dim")  # speculative KV [n_slots, B, KV, N, D]
_STATE_AXES = {
    "tokens": ("batch", "length"), "anc": ("batch", "lanes", "lanes"), "s": ("batch", "lanes", "embed"),
    "e": ("batch", "lanes", "embed"), "q1": ("batch", "lanes", "vocab"), "q2": ("batch", "lanes", "vocab"),
    "base_key": ("key",),
}
# Any other state leaf: [] scalars, [B] per-request values, [B, N] lane fields.
_STATE_BY_NDIM = {0: (), 1: ("batch",), 2: ("batch", "lanes")}


# ---------------------------------------------------------------------------------------------------
# Meshes and rules
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
  return normalize_rules(cd.rules)


def normalize_rules(rules) -> tuple:
  if rules is None:
    return RULES
  items = rules.items() if isinstance(rules, dict) else rules
  out = []
  for name, axis in items:
    if isinstance(axis, (list, tuple)):
      axis = tuple(axis) if len(axis) != 1 else axis[0]
    if axis == "" or axis == "none":
      axis = None
    out.append((str(name), axis))
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class MeshPlan:
  """A mesh (auto-sharded axes named from 'data', 'model') and its logical axis rules; hashable."""
  mesh: Mesh
  rules: tuple = RULES

  @property
  def axis_sizes(self) -> dict:
    return dict(self.mesh.shape)

  @property
  def data_size(self) -> int:
    return self.axis_sizes.get(DATA, 1)


def plan(mesh, rules=None) -> MeshPlan:
  """Normalises a jax Mesh (or a MeshPlan) and rules into a MeshPlan with auto-sharded axes."""
  if isinstance(mesh, MeshPlan):
    return mesh if rules is None else MeshPlan(mesh.mesh, normalize_rules(rules))
  if not isinstance(mesh, Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
  bad = [a for a in mesh.axis_names if a not in MESH_AXES]
  if bad:
    raise ValueError(f"mesh axes must be named from {MESH_AXES}; got {mesh.axis_names}")
  if any(t != AxisType.Auto for t in mesh.axis_types):  # jax.make_mesh defaults to Explicit axes
    mesh = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))
  return MeshPlan(mesh, normalize_rules(rules))


# ---------------------------------------------------------------------------------------------------
# Logical axes -> partition specs
# ---------------------------------------------------------------------------------------------------
def _units(name, dim: int, cfg) -> int:
  """How many indivisible units a dimension holds: whole heads for (fused) head dims, else its size."""
  if cfg is not None and name == "heads" and dim % cfg.num_heads == 0:
    return cfg.num_heads
  if cfg is not None and name == "kv_heads" and dim % cfg.num_kv_heads == 0:
    return cfg.num_kv_heads
  return dim


def logical_spec(axes, shape, axis_sizes: dict, rules=RULES, cfg=None) -> P:
  """PartitionSpec of an array with logical `axes`: each dim goes to its rule's mesh axes if they divide it."""
  if len(axes) != len(shape):
    raise ValueError(f"logical axes {axes} do not match shape {shape}")
  table = dict(rules)
  used, out = set(), []
  for name, dim in zip(axes, shape):
    target = table.get(name) if name is not None else None
    targets = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
    targets = tuple(a for a in targets if a in axis_sizes)
    size = math.prod(axis_sizes[a] for a in targets)
    if not targets or _units(name, dim, cfg) % size or used.intersection(targets):
      out.append(None)  # fallback: replicated
      continue
    used.update(targets)
    out.append(targets[0] if len(targets) == 1 else targets)
  return P(*out)


def shard_shape(shape, spec: P, axis_sizes: dict) -> tuple:
  """The per-device shape of an array of `shape` laid out by `spec`."""
  out = []
  for i, dim in enumerate(shape):
    entry = spec[i] if i < len(spec) else None
    names = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
    out.append(dim // math.prod(axis_sizes[a] for a in names))
  return tuple(out)


def _key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def param_axes(path, leaf) -> tuple:
  """Logical axes of one parameter from its path in the tree of `model.param_shapes`."""
  names = [_key_name(k) for k in path]
  last = names[-1]
  if names[0] in _STACKS:
    if last.startswith("norm_"):
      return ("layers", "embed")
    if last in _LAYER_AXES:
      return _LAYER_AXES[last]
  elif last in _TOP_AXES:
    return _TOP_AXES[last]
  raise KeyError(f"no logical axes for parameter {'/'.join(names)}")


def state_axes(path, leaf) -> tuple:
  """Logical axes of one decode-state leaf (cache / spec entries by their store, the rest by field name)."""
  names = [_key_name(k) for k in path]
  if names and names[0] == "cache" and leaf.ndim == 5:
    return _CACHE_AXES
  if names and names[0] == "spec" and leaf.ndim == 5:
    return _SPEC_AXES
  if names and names[-1] in _STATE_AXES:
    return _STATE_AXES[names[-1]]
  if leaf.ndim in _STATE_BY_NDIM:
    return _STATE_BY_NDIM[leaf.ndim]
  raise KeyError(f"no logical axes for state leaf {'/'.join(names)} of shape {leaf.shape}")


def tree_specs(tree, kind, axis_sizes: dict, rules=RULES, cfg=None):
  """PartitionSpecs of a tree of arrays (or ShapeDtypeStructs): kind 'params', 'state', 'cache' (a
  committed KV store), 'spec' (a speculative KV store) or a tuple of logical axes (every leaf)."""
  if kind == "params":
    fn = param_axes
  elif kind == "state":
    fn = state_axes
  elif kind in ("cache", "spec"):
    fn = lambda path, leaf: _CACHE_AXES if kind == "cache" else _SPEC_AXES
  else:
    fn = lambda path, leaf: tuple(kind)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: logical_spec(fn(path, x), x.shape, axis_sizes, rules, cfg), tree)


def tree_shardings(tree, kind, mesh_plan: MeshPlan, cfg=None):
  specs = tree_specs(tree, kind, mesh_plan.axis_sizes, mesh_plan.rules, cfg)
  return jax.tree_util.tree_map(lambda s: NamedSharding(mesh_plan.mesh, s), specs,
                                is_leaf=lambda x: isinstance(x, P))


def param_shardings(params, cfg, mesh, rules=None):
  return tree_shardings(params, "params", plan(mesh, rules), cfg)


def state_shardings(state, cfg, mesh, rules=None):
  return tree_shardings(state, "state", plan(mesh, rules), cfg)


def per_device_bytes(tree, kind, axis_sizes: dict, rules=RULES, cfg=None) -> int:
  """Bytes one device holds of a tree (arrays or ShapeDtypeStructs) laid out by the rules."""
  specs = jax.tree_util.tree_leaves(tree_specs(tree, kind, axis_sizes, rules, cfg), is_leaf=lambda x: isinstance(x, P))
  leaves = jax.tree_util.tree_leaves(tree)
  return int(sum(math.prod(shard_shape(x.shape, s, axis_sizes)) * np.dtype(x.dtype).itemsize
                 for x, s in zip(leaves, specs)))


# ---------------------------------------------------------------------------------------------------
# Placement and host transfer (single- or multi-process)
# ---------------------------------------------------------------------------------------------------
def _place(x, sharding):
  if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
    return jax.device_put(x, sharding)
  host = np.asarray(x)  # every process holds the same value: build the global array from it
  return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def place(tree, shardings):
  """device_put of a tree onto a matching tree of NamedShardings (also across processes)."""
  return jax.tree_util.tree_map(_place, tree, shardings)


def shard_params(params, cfg, mesh, rules=None):
  """Places the parameters on the mesh as the rules say (`load(..., mesh=)` calls this)."""
  return place(params, param_shardings(params, cfg, mesh, rules))


def to_host(tree, skip=("cache", "spec")):
  """With several processes, gathers the leaves the host reads (not KV stores) into full local arrays."""
  if jax.process_count() == 1:
    return tree
  from jax.experimental import multihost_utils

  def one(path, x):
    if path and _key_name(path[0]) in skip or not isinstance(x, jax.Array) or x.is_fully_addressable:
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
  """Removes the dummy requests (indices >= n) from a GenerateResult; stats count real tokens only."""
  if len(result.tokens) == n:
    return result
  dropped = sum(len(t) for t in result.tokens[n:])
  stats = dict(result.stats)
  stats["padded_batch"] = len(result.tokens)
  stats["batch"] = n
  stats["tokens_generated"] = stats["tokens_generated"] - dropped
  if "decode_seconds" in stats:
    stats["tokens_per_second"] = stats["tokens_generated"] / max(stats["decode_seconds"], 1e-9)
  if isinstance(stats.get("per_request"), dict):
    stats["per_request"] = {k: v[:n] for k, v in stats["per_request"].items()}
  return dataclasses.replace(result, tokens=result.tokens[:n], stats=stats)


# ---------------------------------------------------------------------------------------------------
# Sharded jit wrappers of the decode entry points
# ---------------------------------------------------------------------------------------------------
# "module.function" -> (kinds of the leading array arguments, donated argument indices, output shardings:
# the index of the argument whose shardings the output keeps, or kinds of the outputs (of their eval_shape)).
ENTRY_POINTS = {
    "loopspec_jax.decoding.common.prefill_state": (("params", ("batch", "length"), ("batch",), "state"), (),
                                                  ("cache", ("batch", "length"))),
    "loopspec_jax.decoding.autoregressive.decode_loop": (("params", "state", "state"), (1,), 1),
    "loopspec_jax.decoding.chain.decode_loop": (("params", "state", "state"), (1,), 1),
    "loopspec_jax.decoding.loopspec.tick.decode_loop": (("params", "state", "state"), (1,), 1),
    "loopspec_jax.decoding.loopspec.state.initial_state": (("cache", ("batch", "length"), ("batch",), "state"), (0, 1),
                                                           "state"),
    "loopspec_jax.decoding.autoregressive.initial_state": (("cache", ("batch", "length"), ("batch",), "state"), (0, 1),
                                                           "state"),
    "loopspec_jax.decoding.chain.initial_state": (("cache", ("batch", "length"), ("batch",), "state"), (0, 1), "state"),
}

_JITS: dict = {}  # (entry, plan, static args, input shardings) -> (jitted function, output shardings)
TRACES = collections.Counter()  # entry name -> times a sharded wrapper traced its function
LAST_SHARDINGS: dict = {}  # entry name -> shardings of its last result (for inspection and tests)


def entry_name(fn) -> str:
  return f"{fn.__module__}.{fn.__name__}"


def entry(fn, mesh, rules=None):
  """`fn` (one of ENTRY_POINTS) when mesh is None, else its sharded version with the same signature."""
  if mesh is None:
    return fn
  name = entry_name(fn)
  if name not in ENTRY_POINTS:
    raise KeyError(f"{name} is not a sharded decode entry point ({sorted(ENTRY_POINTS)})")
  mesh_plan = plan(mesh, rules)
  raw = getattr(fn, "__wrapped__", fn)
  sig = inspect.signature(raw)

  def call(*args, **kwargs):
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    values = list(bound.arguments.items())
    kinds, donate, out = ENTRY_POINTS[name]
    arrays = tuple(v for _, v in values[:len(kinds)])
    static = tuple(values[len(kinds):])
    cfg = dict(static).get("cfg")
    in_sh = tuple(tree_shardings(a, k, mesh_plan, cfg) for a, k in zip(arrays, kinds))
    leaves, treedef = jax.tree_util.tree_flatten(in_sh)
    key = (name, mesh_plan, static, treedef, tuple(leaves))
    if key not in _JITS:
      fun = lambda *a: raw(*a, **dict(static))
      if isinstance(out, int):
        out_sh = in_sh[out]
      else:
        shapes = jax.eval_shape(fun, *arrays)
        out_sh = (tree_shardings(shapes, out, mesh_plan, cfg) if isinstance(out, str) else
                  tuple(tree_shardings(x, k, mesh_plan, cfg) for x, k in zip(shapes, out)))

      def traced(*a):
        TRACES[name] += 1
        return fun(*a)
      _JITS[key] = (jax.jit(traced, in_shardings=in_sh, out_shardings=out_sh, donate_argnums=donate), out_sh)
    jitted, _ = _JITS[key]
    with jax.set_mesh(mesh_plan.mesh):
      placed = place(arrays, in_sh)
      result = jitted(*placed)
    LAST_SHARDINGS[name] = jax.tree_util.tree_map(lambda x: x.sharding, result)
    return to_host(result) if isinstance(out, int) else result

  call.__name__ = f"sharded_{fn.__name__}"
  return call


def jit_cache_sizes() -> list:
  """(entry name, mesh shape, static args, compiled programs) of every sharded wrapper built so far."""
  return [(name, tuple(mesh_plan.mesh.shape.values()), dict(static), jitted._cache_size())
          for (name, mesh_plan, static, _, _), (jitted, _) in _JITS.items()]
