"""The head layout for a mesh: attention heads a mesh axis does not divide are repeated (KV) or zero-padded.

Before the rules shard them (`parallel/rules.py`), attention heads the model axis does not divide are laid
out so that it does, exactly (`padded_config`, `pad_params`): GQA KV heads stored r times, then all-zero heads
appended (a zero head attends uniformly to zero values and feeds zero rows of wo). Huginn-0125's 55 heads
become 56 on a model axis of 2, 4 or 8 (+1.8% attention weights and KV cache in total), so its attention
weights and KV caches shard like its MLP and vocabulary instead of being replicated. `sharding.shard_params`
(and so `load(..., mesh=)`, which also keeps the laid-out config as the model's) places the parameters laid
out; the sharded entry points run on the laid-out config and lay out parameters that were not (inside the
program). `base_config` undoes the layout; `check_params` / `params_match` tell which layout parameters have.
"""

from __future__ import annotations

import jax
import numpy as np

from loopspec_jax.parallel import rules as rules_lib
from loopspec_jax.parallel.rules import MeshPlan, STACKS


def _axis_sizes(mesh) -> dict:
  if isinstance(mesh, dict):
    return dict(mesh)
  return rules_lib.plan(mesh).axis_sizes


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
  rules = rules_lib.normalize_rules(rules)
  sizes = _axis_sizes(mesh)
  mk, mh = rules_lib.rule_size("kv_heads", sizes, rules), rules_lib.rule_size("heads", sizes, rules)
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
  return {name: one_stack(v) if name in STACKS else v for name, v in params.items()}


def base_config(cfg):
  """The config as trained: `cfg` with the head layout of `padded_config` undone."""
  if cfg is None or (cfg.head_padding == 0 and cfg.kv_repeat == 1):
    return cfg
  kv = (cfg.num_kv_heads - cfg.head_padding) // cfg.kv_repeat
  h = cfg.num_heads - cfg.head_padding * (cfg.num_heads // cfg.num_kv_heads)
  return cfg.replace(num_kv_heads=kv, num_heads=h, head_padding=0, kv_repeat=1)


def check_params(params, cfg):
  """Raises ValueError unless the attention weights of `params` have the head counts of `cfg`."""
  for name in STACKS:
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
