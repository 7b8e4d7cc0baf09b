"""Logical axes -> mesh axes: the rules table, the parameter axis table, the fallback pre-pass, flax's mapping.

Every array dimension of the parameters and of the decode state has a *logical* name (batch, heads,
kv_heads, mlp, embed, vocab, lanes, layers, ...). Decode-state dataclasses declare them on their fields
(`parallel.logical.axes_field`; read here with `logical.map_with_axes`, nothing is guessed from names or
ranks); parameters (plain dicts) get theirs from a table by parameter path (`param_axes`). `RULES` maps
logical names to mesh axes in order of precedence, and flax's logical partitioning
(`flax.linen.logical_to_mesh_axes` / `logical_to_mesh_sharding`, as MaxText uses it) turns a tuple of
logical names into a PartitionSpec / NamedSharding: attention heads, KV heads, MLP width and vocabulary over
`model`; requests (batch) over `data`; everything else replicated; a mesh axis shards at most one dimension
of an array (the dimension whose rule comes first wins). configs/mesh/ builds its ml_collections configs
from `RULES`. A `MeshPlan` is a mesh with its rules (`plan` normalises both).

Fallback (`fit_rules`, a pre-pass before flax's mapping, per array): a rule whose mesh axes do not divide its
dimension is dropped for that array, so the dimension is replicated (or takes a later rule of the same
name). Fused head dimensions (wq's H*D, wk's KV*D, ...) are checked in whole heads, so a shard never splits
a head (heads the model axis does not divide are laid out first: `parallel/heads.py`).

Shardings are built at call time from the arrays' (or ShapeDtypeStructs') shapes: a few flax calls per leaf,
cheap next to a decode call, so nothing here is cached.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import types

import flax.linen as nn
import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
import numpy as np

from loopspec_jax.parallel import logical

DATA, MODEL = "data", "model"
MESH_AXES = (DATA, MODEL)

# logical axis -> mesh axis (None: replicated), in order of precedence (flax's rule semantics). The single
# source of truth; configs/mesh/ builds from it.
RULES = (
    ("batch", DATA),  # requests
    ("heads", MODEL),  # attention heads (wq / wo / qk_bias / q_norm, in whole heads)
    ("kv_heads", MODEL),  # KV heads (wk / wv / k_norm, KV caches, speculative KV)
    ("mlp", MODEL),  # MLP width
    ("vocab", MODEL),  # embedding rows, LM head columns, lane distributions q1 / q2
    ("embed", None),  # hidden size
    ("layers", None),  # stacked layers of a block stack
    ("groups", None),  # recurrent-step blocks of a core KV buffer (models/kvcache.py)
    ("readouts", None),  # readout depths of a coda KV buffer
    ("length", None),  # cache / token positions
    ("lanes", None),  # LoopSpec lanes per request
    ("head_dim", None),
    ("qk", None),  # the q/k pair of Huginn's qk_bias
    ("key", None),  # the two words of a raw PRNG key
)

# Parameter axes: a table by path (parameters are plain dicts). Layers of a block stack ('prelude', 'core',
# 'coda') are stacked on a leading 'layers' axis.
_LAYER_AXES = {
    "wq": ("layers", "embed", "heads"),
    "wk": ("layers", "embed", "kv_heads"),
    "wv": ("layers", "embed", "kv_heads"),
    "wo": ("layers", "heads", "embed"),
    "w_gate": ("layers", "embed", "mlp"),
    "w_up": ("layers", "embed", "mlp"),
    "w_down": ("layers", "mlp", "embed"),
    "qk_bias": ("layers", "qk", "heads", "head_dim"),
    "q_norm": ("layers", "heads"),
    "k_norm": ("layers", "kv_heads"),
}
_TOP_AXES = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "final_norm": ("embed",),
    "adapter": (None, "embed"),  # [2E, E]: Raven's adapter of concat(state, embedding)
    "w": ("embed", None),
    "b": (None,),  # w / b: Ouro's exit gate
}
STACKS = ("prelude", "core", "coda")
# Kinds of parameter trees (all laid out by the table above) -> the static argument holding each one's config:
# the decoded model's, and the separate drafter's of method='draft' (its own head count, so its own layout).
PARAM_KINDS = types.MappingProxyType({"params": "cfg", "draft_params": "dcfg"})


# ---------------------------------------------------------------------------------------------------
# Rules and mesh plans
# ---------------------------------------------------------------------------------------------------
def normalize_rules(rules) -> tuple:
  """Rules (a dict or pairs; None: `RULES`) as a hashable tuple of (logical name, mesh axis / axes / None);
  "" and "none" spell None, a one-element list a single axis."""
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


def rule_size(name: str, axis_sizes: dict, rules) -> int:
  """Devices the first rule of `name` that names an axis of this mesh spreads it over (1: replicated)."""
  for rule_name, target in rules:
    if rule_name == name:
      targets = [a for a in mesh_axes(target) if a in axis_sizes]
      if targets:
        return math.prod(axis_sizes[a] for a in targets)
  return 1


# ---------------------------------------------------------------------------------------------------
# Logical axes -> partition specs (flax's mapping after the fallback pre-pass)
# ---------------------------------------------------------------------------------------------------
def _units(name, dim: int, cfg) -> int:
  """How many indivisible units a dimension holds: whole heads for (fused) head dims, else its size."""
  if cfg is not None and name == "heads" and dim % cfg.num_heads == 0:
    return cfg.num_heads
  if cfg is not None and name == "kv_heads" and dim % cfg.num_kv_heads == 0:
    return cfg.num_kv_heads
  return dim


def mesh_axes(target) -> tuple:
  return () if target is None else ((target,) if isinstance(target, str) else tuple(target))


def fit_rules(axes, shape, axis_sizes: dict, rules=RULES, cfg=None) -> tuple:
  """The fallback pre-pass: (logical names, rules) of one array for `nn.logical_to_mesh_axes`.

  Keeps the rules of the array's names whose mesh axes (restricted to those of the mesh) divide the
  dimension, counted in whole heads for head dims; drops the others, so such a dimension is replicated
  unless a later rule of its name fits. Names left without a sharding rule become None (flax then leaves
  them unsharded, and an unsharded name may repeat, e.g. an [E, E] matrix).
  """
  if len(axes) != len(shape):
    raise ValueError(f"logical axes {axes} do not match shape {tuple(shape)}")
  dims = {name: dim for name, dim in zip(axes, shape) if name is not None}
  kept = []
  for name, target in rules:
    if name not in dims:
      continue
    targets = tuple(a for a in mesh_axes(target) if a in axis_sizes)
    if targets and _units(name, dims[name], cfg) % math.prod(axis_sizes[a] for a in targets):
      continue  # fallback: this rule would split the dimension unevenly (or mid-head)
    kept.append((name, None if not targets else targets[0] if len(targets) == 1 else targets))
  sharded = {name for name, target in kept if target is not None}
  return tuple(n if n in sharded else None for n in axes), tuple(kept)


def logical_spec(axes, shape, axis_sizes: dict, rules=RULES, cfg=None) -> P:
  """PartitionSpec of an array of `shape` with logical `axes`: `fit_rules`, then flax's rule resolution."""
  names, fitted = fit_rules(axes, shape, axis_sizes, rules, cfg)
  return nn.logical_to_mesh_axes(names, fitted)


def logical_sharding(axes, shape, mesh_plan: MeshPlan, cfg=None) -> NamedSharding:
  """NamedSharding of an array of `shape` with logical `axes` on the plan's mesh (see `logical_spec`)."""
  names, fitted = fit_rules(axes, shape, mesh_plan.axis_sizes, mesh_plan.rules, cfg)
  return nn.logical_to_mesh_sharding(P(*names), mesh_plan.mesh, fitted)


def shard_shape(shape, spec: P, axis_sizes: dict) -> tuple:
  """The per-device shape of an array of `shape` laid out by `spec`."""
  out = []
  for i, dim in enumerate(shape):
    entry = spec[i] if i < len(spec) else None
    out.append(dim // math.prod(axis_sizes[a] for a in mesh_axes(entry)))
  return tuple(out)


def key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def layer_axes(name: str):
  """Logical axes of a block stack's parameter `name` ('wq', ...: [layers, ...]); None for one the table lacks."""
  return ("layers", "embed") if name.startswith("norm_") else _LAYER_AXES.get(name)


def param_axes(path, leaf) -> tuple:
  """Logical axes of one parameter from its path in the tree of `model.param_shapes`."""
  del leaf
  names = [key_name(k) for k in path]
  last = names[-1]
  if names[0] in STACKS:
    if last.startswith("norm_"):
      return ("layers", "embed")
    if last in _LAYER_AXES:
      return _LAYER_AXES[last]
  elif last in _TOP_AXES:
    return _TOP_AXES[last]
  raise KeyError(f"no logical axes for parameter {'/'.join(names)}")


def tree_axes(tree, kind):
  """Logical axes of every leaf of a tree of arrays (or ShapeDtypeStructs), in a tree of the same structure
  whose leaves are `P(*names)` (logical names, not yet mesh axes). kind: 'params' or another of `PARAM_KINDS`
  (the table by path), 'state' (the axes its dataclasses declare), 'replicated' (no leaf sharded), or a tuple of
  logical names (every leaf)."""
  if isinstance(kind, str) and kind in PARAM_KINDS:
    return jax.tree_util.tree_map_with_path(lambda path, x: P(*param_axes(path, x)), tree)
  if kind == "state":
    return logical.map_with_axes(lambda axes, x: P(*axes), tree)
  if kind == "replicated":  # every leaf whole on every device (a draft head's parameters)
    return jax.tree_util.tree_map(lambda x: P(*(None,) * len(x.shape)), tree)
  if isinstance(kind, str):
    raise ValueError(
        f"unknown tree kind {kind!r} ({', '.join(PARAM_KINDS)}, state, replicated, or a tuple of logical axes)"
    )
  return jax.tree_util.tree_map(lambda x: P(*kind), tree)


def _map_axes(fn, tree, kind):
  """fn(logical axes, leaf) over the leaves of `tree` (axes as `tree_axes` gives them)."""
  names = tree_axes(tree, kind)
  return jax.tree_util.tree_map(lambda x, a: fn(tuple(a), x), tree, names)


def tree_specs(tree, kind, axis_sizes: dict, rules=RULES, cfg=None):
  """PartitionSpecs (mesh axes) of a tree of arrays (or ShapeDtypeStructs); kind as in `tree_axes`."""
  return _map_axes(lambda axes, x: logical_spec(axes, x.shape, axis_sizes, rules, cfg), tree, kind)


def tree_shardings(tree, kind, mesh_plan: MeshPlan, cfg=None):
  """NamedShardings of a tree of arrays (or ShapeDtypeStructs) on the plan's mesh; kind as in `tree_axes`."""
  return _map_axes(lambda axes, x: logical_sharding(axes, x.shape, mesh_plan, cfg), tree, kind)


def param_shardings(params, cfg, mesh, rules=None):
  return tree_shardings(params, "params", plan(mesh, rules), cfg)


def state_shardings(state, cfg, mesh, rules=None):
  return tree_shardings(state, "state", plan(mesh, rules), cfg)


def per_device_bytes(tree, kind, axis_sizes: dict, rules=RULES, cfg=None) -> int:
  """Bytes one device holds of a tree (arrays or ShapeDtypeStructs) laid out by the rules."""
  specs = jax.tree_util.tree_leaves(tree_specs(tree, kind, axis_sizes, rules, cfg), is_leaf=lambda x: isinstance(x, P))
  leaves = jax.tree_util.tree_leaves(tree)
  return int(
      sum(math.prod(shard_shape(x.shape, s, axis_sizes)) * np.dtype(x.dtype).itemsize for x, s in zip(leaves, specs))
  )


# ---------------------------------------------------------------------------------------------------
# Per-shard ops while a sharded program is traced
# ---------------------------------------------------------------------------------------------------
_TRACING = contextvars.ContextVar("loopspec_tracing_mesh_plan", default=None)


@contextlib.contextmanager
def tracing(mesh_plan: MeshPlan):
  """The plan of the sharded program being traced (`sharding.run_sharded`), for `per_shard`."""
  token = _TRACING.set(mesh_plan)
  try:
    yield
  finally:
    _TRACING.reset(token)


def per_shard(fn, x, axes):
  """fn(x) for an fn that keeps shape and values (a layout pin): on each device's shard of x when a sharded
  program is being traced (its spec from the logical `axes` by the plan's rules), else on x.

  A layout pin (`with_layout_constraint`, a custom call) carries no sharding, so the SPMD partitioner
  replicates its operand: inside a decode loop on a mesh, an all-gather of every pinned KV slot and weight
  stack per step. Pinned per shard (`jax.shard_map` with the array's own spec) nothing moves. Any spec gives
  the same values (fn is an identity on values), so a spec that differs from the array's costs a reshard,
  never a wrong result."""
  plan = _TRACING.get()
  if plan is None:
    return fn(x)
  spec = logical_spec(axes, x.shape, plan.axis_sizes, plan.rules)
  if all(s is None for s in spec):
    return fn(x)
  return jax.shard_map(fn, mesh=plan.mesh, in_specs=spec, out_specs=spec)(x)


def per_shard_call(fn, args, axes, *, unsharded=(), required=()):
  """fn(*args) on each device's shards of args (each spec from its logical `axes` by the plan's rules) when a
  sharded program is being traced, else on the arrays; the result has args[0]'s shape and spec. For a
  computation that is local to a shard, such as a cache write (each device writes its own requests' positions
  into its own heads). `unsharded`: logical names the computation indexes globally (a cache's positions): if
  the plan shards one of them, fn runs on the whole arrays instead; `required`: names that must be sharded (over
  more than one device) for the per-shard form to be used. Per-shard pins (`per_shard`) inside fn pin the local
  shard."""
  plan = _TRACING.get()
  if plan is None:
    return fn(*args)
  specs = tuple(logical_spec(a, x.shape, plan.axis_sizes, plan.rules) for a, x in zip(axes, args))
  split = lambda entry: entry is not None and math.prod(plan.axis_sizes[m] for m in mesh_axes(entry)) > 1
  sharded = {name for a, spec in zip(axes, specs) for name, s in zip(a, spec) if name is not None and split(s)}
  if not sharded or sharded & set(unsharded) or not set(required) <= sharded:
    return fn(*args)

  def local(*xs):
    token = _TRACING.set(None)
    try:
      return fn(*xs)
    finally:
      _TRACING.reset(token)

  return jax.shard_map(local, mesh=plan.mesh, in_specs=specs, out_specs=specs[0])(*args)
