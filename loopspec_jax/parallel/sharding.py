"""Sharded decoding over a ('data', 'model') device mesh: declared logical axes, one rules table, flax's mapping.

Every array dimension of the parameters and of the decode state has a *logical* name (batch, heads,
kv_heads, mlp, embed, vocab, lanes, layers, ...). Decode-state dataclasses declare them on their fields
(`parallel.logical.axes_field`; read here with `logical.map_with_axes`, nothing is guessed from names or
ranks); parameters (plain dicts) get theirs from a table by parameter path (`param_axes`). `RULES` maps
logical names to mesh axes in order of precedence, and flax's logical partitioning
(`flax.linen.logical_to_mesh_axes` / `logical_to_mesh_sharding`, as MaxText uses it) turns a tuple of
logical names into a PartitionSpec / NamedSharding: attention heads, KV heads, MLP width and vocabulary over
`model`; requests (batch) over `data`; everything else replicated; a mesh axis shards at most one dimension
of an array (the dimension whose rule comes first wins). configs/mesh/ builds its ml_collections configs
from `RULES`.

Fallback (`fit_rules`, a pre-pass before flax's mapping, per array): a rule whose mesh axes do not divide its
dimension is dropped for that array, so the dimension is replicated (or takes a later rule of the same
name). Fused head dimensions (wq's H*D, wk's KV*D, ...) are checked in whole heads, so a shard never splits
a head.

Heads (`padded_config`, `pad_params`): before that, attention heads the model axis does not divide are laid
out so that it does, exactly: GQA KV heads stored r times, then all-zero heads appended (a zero head attends
uniformly to zero values and feeds zero rows of wo). Huginn-0125's 55 heads become 56 on a model axis of 2, 4
or 8 (+1.8% attention weights and KV cache in total), so its attention weights and KV caches shard like its
MLP and vocabulary instead of being replicated. `shard_params` (and so `load(..., mesh=)`, which also keeps
the laid-out config as the model's) places the parameters laid out; the entry points run on the laid-out
config and lay out parameters that were not (inside the program). A dimension that still does not divide
(e.g. 3 requests on a data axis of 2) falls back to replication.

Decode entry points run as `jax.jit` with explicit in/out shardings and donated state, under
`jax.set_mesh(mesh)`, on inputs placed up front; `entry(fn, mesh)` returns that sharded version of one of
`ENTRY_POINTS` (built once per function, mesh, rules and static arguments, then cached) and `fn` itself when
mesh is None, so the single-device path is unchanged. An entry point may take several parameter trees, each
with its own config (`PARAM_KINDS`: 'params' with `cfg`, 'draft_params' with `dcfg`, the separate drafter of
method='draft'); each is laid out and sharded by the same rules in its own config's head layout.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import math

import flax.linen as nn
import jax
from jax.experimental import multihost_utils
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
_STACKS = ("prelude", "core", "coda")
# Kinds of parameter trees (all laid out by the table above) -> the static argument holding each one's config:
# the decoded model's, and the separate drafter's of method='draft' (its own head count, so its own layout).
PARAM_KINDS = {"params": "cfg", "draft_params": "dcfg"}


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


# ---------------------------------------------------------------------------------------------------
# Head layout: heads a mesh axis does not divide are repeated (KV) or zero-padded so that they shard
# ---------------------------------------------------------------------------------------------------
def _axis_sizes(mesh) -> dict:
  if isinstance(mesh, dict):
    return dict(mesh)
  return plan(mesh).axis_sizes


def _rule_size(name: str, axis_sizes: dict, rules) -> int:
  """Devices the first rule of `name` that names an axis of this mesh spreads it over (1: replicated)."""
  for rule_name, target in rules:
    if rule_name == name:
      targets = [a for a in _mesh_axes(target) if a in axis_sizes]
      if targets:
        return math.prod(axis_sizes[a] for a in targets)
  return 1


def padded_config(cfg, mesh, rules=None):
  """`cfg` with its attention heads laid out so that the mesh axes the rules give `kv_heads` and `heads`
  divide them (the config every decoder uses on that mesh; `cfg` itself when they already do).

  Two exact layouts, combined with the fewest heads in total: (1) GQA: every KV head stored r times (r
  dividing the group size H/KV), its query heads split between the copies (`kv_repeat`; e.g. 4 KV heads on a
  model axis of 8: r = 2, no padding); (2) zero KV heads appended, each with its zero query heads, up to the
  next count the axes divide (`head_padding`): a zero head has q = k = 0 (Huginn's q/k bias is padded with
  zeros too), so it attends uniformly to zero values and feeds zero rows of wo; OLMo's full-width q/k norms
  average over the real entries only (`layers.rms_norm`). RoPE acts within a head, so it is unaffected. The
  padded heads cost their share of the attention weights, KV cache and attention flops. Huginn-0125's 55
  heads become 56 on a model axis of 2, 4 or 8 (+1.8% attention weights and KV cache in total, 1/m of them
  per device instead of all). A config laid out for another mesh is only ever padded further (parameters
  placed for it stay valid). `mesh`: a Mesh, a MeshPlan or a dict of axis sizes; `rules`: None for the
  plan's (or `RULES`).
  """
  if cfg is None:
    return None
  if isinstance(mesh, MeshPlan) and rules is None:
    rules = mesh.rules
  rules = normalize_rules(rules)
  sizes = _axis_sizes(mesh)
  mk, mh = _rule_size("kv_heads", sizes, rules), _rule_size("heads", sizes, rules)
  kv, h = cfg.num_kv_heads, cfg.num_heads
  g = h // kv
  if kv % mk == 0 and h % mh == 0:
    return cfg
  # Candidate repeats r (divisors of the group size g; only for a config not yet laid out): KV heads stored r
  # times, then padded to a count kvp the axes divide. The least total (query heads, KV heads) wins.
  repeats = [r for r in range(1, g + 1) if g % r == 0] if cfg.head_padding == 0 and cfg.kv_repeat == 1 else [1]
  best = None
  for r in repeats:
    kvp = kv * r
    while kvp % mk or (kvp * (g // r)) % mh:
      kvp += 1
    cand = (kvp * (g // r), kvp, r)
    best = cand if best is None or cand < best else best
  hp, kvp, r = best
  return cfg.replace(
      num_heads=hp, num_kv_heads=kvp, kv_repeat=cfg.kv_repeat * r, head_padding=cfg.head_padding + kvp - kv * r
  )


def _heads_of(x, axis: int, n: int, d: int):
  """x with its fused head axis `axis` (n heads of d) split into [..., n, d, ...]."""
  shape = list(x.shape)
  return x.reshape(shape[:axis] + [n, d] + shape[axis + 1 :])


def _expand_heads(x, axis: int, n_from: int, repeat: int, n_to: int, d: int):
  """Heads of a fused axis (`axis`, n_from heads of width d) each repeated `repeat` times, then zero heads
  appended up to n_to (numpy arrays stay numpy, so host parameters are laid out on the host)."""
  xp = np if isinstance(x, np.ndarray) else jax.numpy
  axis = axis % x.ndim
  y = _heads_of(x, axis, n_from, d)
  if repeat > 1:
    y = xp.repeat(y, repeat, axis=axis)
  pad = [(0, 0)] * y.ndim
  pad[axis] = (0, n_to - n_from * repeat)
  y = xp.pad(y, pad)
  return y.reshape(x.shape[:axis] + (n_to * d,) + x.shape[axis + 1 :])


def pad_params(params, cfg, cfg_to):
  """Parameters of `cfg` laid out for `cfg_to = padded_config(cfg, ...)`: KV-head columns of wk / wv /
  k_norm repeated, then zero heads appended to wq / wk / wv / q_norm / k_norm / qk_bias and zero rows to wo.
  Works on arrays (numpy stays numpy) and on ShapeDtypeStructs; `cfg_to == cfg` returns `params` itself."""
  if cfg_to == cfg:
    return params
  if jax.tree_util.tree_leaves(params) and isinstance(jax.tree_util.tree_leaves(params)[0], jax.ShapeDtypeStruct):
    return jax.eval_shape(lambda p: pad_params(p, cfg, cfg_to), params)
  if cfg_to.kv_repeat % cfg.kv_repeat or (cfg_to.kv_repeat != cfg.kv_repeat and cfg.head_padding):
    raise ValueError(
        f"cannot lay out {cfg.num_heads} / {cfg.num_kv_heads} heads (kv_repeat {cfg.kv_repeat}, padding "
        f"{cfg.head_padding}) as {cfg_to.num_heads} / {cfg_to.num_kv_heads} (kv_repeat {cfg_to.kv_repeat})"
    )
  rep, d = cfg_to.kv_repeat // cfg.kv_repeat, cfg.head_dim
  q = lambda x, axis: _expand_heads(x, axis, cfg.num_heads, 1, cfg_to.num_heads, d)
  k = lambda x, axis: _expand_heads(x, axis, cfg.num_kv_heads, rep, cfg_to.num_kv_heads, d)
  fused = {"wq": (q, -1), "wk": (k, -1), "wv": (k, -1), "wo": (q, -2), "q_norm": (q, -1), "k_norm": (k, -1)}

  def one_stack(stack):
    out = dict(stack)
    for name, (fn, axis) in fused.items():
      if name in out:
        out[name] = fn(out[name], axis)
    if "qk_bias" in out:  # [L, 2, H, D] (Huginn: MHA, so no repeat): zero heads appended
      b = out["qk_bias"]
      xp = np if isinstance(b, np.ndarray) else jax.numpy
      pad = [(0, 0)] * b.ndim
      pad[-2] = (0, cfg_to.num_heads - cfg.num_heads)
      out["qk_bias"] = xp.pad(b, pad)
    return out

  check_params(params, cfg)
  return {name: one_stack(v) if name in _STACKS else v for name, v in params.items()}


def base_config(cfg):
  """The config as trained: `cfg` with the head layout of `padded_config` undone."""
  if cfg is None or (cfg.head_padding == 0 and cfg.kv_repeat == 1):
    return cfg
  kv = (cfg.num_kv_heads - cfg.head_padding) // cfg.kv_repeat
  h = cfg.num_heads - cfg.head_padding * (cfg.num_heads // cfg.num_kv_heads)
  return cfg.replace(num_kv_heads=kv, num_heads=h, head_padding=0, kv_repeat=1)


def check_params(params, cfg):
  """Raises ValueError unless the attention weights of `params` have the head counts of `cfg`."""
  for name in _STACKS:
    if name in params and "wq" in params[name]:
      wq, wk = params[name]["wq"].shape[-1], params[name]["wk"].shape[-1]
      want = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim)
      if (wq, wk) != want:
        raise ValueError(
            f"parameters have q / k widths {(wq, wk)}, the config {want} ({cfg.num_heads} heads, "
            f"{cfg.num_kv_heads} KV heads of {cfg.head_dim}); heads laid out for another mesh?"
        )


def params_match(params, cfg) -> bool:
  try:
    check_params(params, cfg)
  except ValueError:
    return False
  return True


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


def _mesh_axes(target) -> tuple:
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
    targets = tuple(a for a in _mesh_axes(target) if a in axis_sizes)
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
    out.append(dim // math.prod(axis_sizes[a] for a in _mesh_axes(entry)))
  return tuple(out)


def _key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def param_axes(path, leaf) -> tuple:
  """Logical axes of one parameter from its path in the tree of `model.param_shapes`."""
  del leaf
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


def tree_axes(tree, kind):
  """Logical axes of every leaf of a tree of arrays (or ShapeDtypeStructs), in a tree of the same structure
  whose leaves are `P(*names)` (logical names, not yet mesh axes). kind: 'params' or another of `PARAM_KINDS`
  (the table by path), 'state' (the axes its dataclasses declare), or a tuple of logical names (every leaf)."""
  if isinstance(kind, str) and kind in PARAM_KINDS:
    return jax.tree_util.tree_map_with_path(lambda path, x: P(*param_axes(path, x)), tree)
  if kind == "state":
    return logical.map_with_axes(lambda axes, x: P(*axes), tree)
  if isinstance(kind, str):
    raise ValueError(f"unknown tree kind {kind!r} ({', '.join(PARAM_KINDS)}, state, or a tuple of logical axes)")
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
  """Removes the dummy requests (indices >= n) from a GenerateResult: its counts keep the first n requests'
  per-request counters (`DecodeStats.drop_requests`), and its figures are derived from those."""
  if len(result.tokens) == n:
    return result
  counts = result.counts.drop_requests(n)
  stats = dict(counts.summary(), padded_batch=len(result.tokens))
  return dataclasses.replace(result, tokens=result.tokens[:n], stats=stats, counts=counts)


# ---------------------------------------------------------------------------------------------------
# Sharded jit wrappers of the decode entry points
# ---------------------------------------------------------------------------------------------------
# "module.function" -> (kinds of the leading array arguments, donated argument indices, output shardings:
# the index of the argument whose shardings the output keeps, or kinds of the outputs (of their eval_shape)).
# A kind is one of `PARAM_KINDS` ('params': laid out for the static `cfg`; 'draft_params': for `dcfg`), 'state'
# (declared axes) or a tuple of logical axes (see `tree_axes`); the arguments after the leading arrays are
# static (cfg, dcfg, shape, greedy, cache_group, ...).
_TOKENS, _LENGTHS = ("batch", "length"), ("batch",)
_INIT = (("state", _TOKENS, _LENGTHS, "state"), (0, 1), "state")  # (cache, tokens, lengths, sp) -> state
_LOOP = (("params", "state", "state"), (1,), 1)  # (params, state, sp) -> state
ENTRY_POINTS = {
    "loopspec_jax.decoding.common.prefill_state": (("params", _TOKENS, _LENGTHS, "state"), (), ("state", _TOKENS)),
    "loopspec_jax.decoding.autoregressive.initial_state": _INIT,
    "loopspec_jax.decoding.autoregressive.decode_loop": _LOOP,
    "loopspec_jax.decoding.chain.initial_state": _INIT,
    "loopspec_jax.decoding.chain.decode_loop": _LOOP,
    "loopspec_jax.decoding.loopspec.state.initial_state": _INIT,
    "loopspec_jax.decoding.loopspec.tick.decode_loop": _LOOP,
    # method='draft': the drafter's parameters follow the usual arguments; its KV cache is in the state.
    "loopspec_jax.decoding.draft.initial_state": (_INIT[0] + ("draft_params",), _INIT[1], _INIT[2]),
    "loopspec_jax.decoding.draft.decode_loop": (_LOOP[0] + ("draft_params",), _LOOP[1], _LOOP[2]),
}

_JITS: dict = {}  # (entry, plan, static args, input shardings) -> (jitted function, output shardings)
TRACES = collections.Counter()  # entry name -> times a sharded wrapper traced its function
LAST_SHARDINGS: dict = {}  # entry name -> shardings of its last result (for inspection and tests)
LAST_IN_SHARDINGS: dict = {}  # entry name -> shardings of its last call's array arguments (likewise)


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

  def prepare(*args, **kwargs):  # -> (jitted function, placed arguments, output kind)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    values = list(bound.arguments.items())
    kinds, donate, out = ENTRY_POINTS[name]
    arrays = tuple(v for _, v in values[: len(kinds)])
    static = tuple(values[len(kinds) :])
    # Configs (cfg, and dcfg for a drafter) in the head layout of this mesh (themselves when heads divide).
    base = {k: v for k, v in static if k in PARAM_KINDS.values()}
    laid = {k: padded_config(v, mesh_plan) for k, v in base.items()}
    static = tuple((k, laid.get(k, v)) for k, v in static)
    cfg_to = laid.get("cfg")
    conf = lambda k: PARAM_KINDS.get(k, "cfg")  # the config an argument kind follows (state: the model's)
    # Parameters still in their config's head layout (not placed by `shard_params`) are laid out inside the
    # program.
    pad = tuple(
        k in PARAM_KINDS and laid.get(conf(k)) != base.get(conf(k)) and not params_match(a, laid[conf(k)])
        for a, k in zip(arrays, kinds)
    )
    in_sh = tuple(
        tree_shardings(a, k, mesh_plan, (base if p else laid).get(conf(k))) for a, k, p in zip(arrays, kinds, pad)
    )
    leaves, treedef = jax.tree_util.tree_flatten(in_sh)
    key = (
        name,
        mesh_plan,
        static,
        treedef,
        tuple(leaves),
        pad,
        tuple(base[conf(k)] if p else None for k, p in zip(kinds, pad)),
    )
    if key not in _JITS:

      def lay_out(x, k):  # parameters in their config's laid-out head layout, sharded as the rules say
        x = pad_params(x, base[conf(k)], laid[conf(k)])
        return jax.lax.with_sharding_constraint(x, tree_shardings(x, k, mesh_plan, laid[conf(k)]))

      fun = lambda *a: raw(*(lay_out(x, k) if p else x for x, k, p in zip(a, kinds, pad)), **dict(static))
      if isinstance(out, int):
        out_sh = in_sh[out]
      else:
        shapes = jax.eval_shape(fun, *arrays)
        out_sh = (
            tree_shardings(shapes, out, mesh_plan, cfg_to)
            if isinstance(out, str)
            else tuple(tree_shardings(x, k, mesh_plan, cfg_to) for x, k in zip(shapes, out))
        )

      def traced(*a):
        TRACES[name] += 1
        return fun(*a)

      _JITS[key] = (jax.jit(traced, in_shardings=in_sh, out_shardings=out_sh, donate_argnums=donate), out_sh)
    jitted, _ = _JITS[key]
    with jax.set_mesh(mesh_plan.mesh):
      placed = place(arrays, in_sh)
    return jitted, placed, out

  def call(*args, **kwargs):
    jitted, placed, out = prepare(*args, **kwargs)
    LAST_IN_SHARDINGS[name] = jax.tree_util.tree_map(lambda x: x.sharding, placed)
    with jax.set_mesh(mesh_plan.mesh):
      result = jitted(*placed)
    LAST_SHARDINGS[name] = jax.tree_util.tree_map(lambda x: x.sharding, result)
    return to_host(result) if isinstance(out, int) else result

  def lower(*args, **kwargs):
    """The `jax.stages.Lowered` of the sharded program for these arguments (`.compile().as_text()`: its
    optimised, SPMD-partitioned HLO, per-device shapes); nothing runs and nothing is donated."""
    jitted, placed, _ = prepare(*args, **kwargs)
    with jax.set_mesh(mesh_plan.mesh):
      return jitted.lower(*placed)

  call.__name__ = f"sharded_{fn.__name__}"
  call.lower = lower
  return call


def jit_cache_sizes() -> list:
  """(entry name, mesh shape, static args, compiled programs) of every sharded wrapper built so far."""
  return [
      (name, tuple(mesh_plan.mesh.shape.values()), dict(static), jitted._cache_size())
      for (name, mesh_plan, static, *_), (jitted, _) in _JITS.items()
  ]
