"""Transformer building blocks shared by every looped family: RMSNorm, RoPE, attention, MLP, blocks.

All functions are pure and work on explicit parameter dicts. Norms, softmax and logits run in float32.
Attention takes its keys/values as a list of *segments* (cached prefix, speculative tree entries, the
queries' own new keys), each with its own boolean mask, so the same block serves full-sequence forwards,
prefill, autoregressive decoding and tree-masked speculative lanes without copying caches together.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import flax.struct
import jax
from jax.experimental.layout import Layout, with_layout_constraint
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.parallel import rules

NEG_INF = -1e30
UNROLL_LAYERS = 0


def _padded(rows: int, cols: int, itemsize: int) -> int:
  """Elements of a [rows, cols] array in TPU tiles: 128 lanes by 8 32-bit sublanes (16 of bf16)."""
  sub = 8 * max(1, 4 // itemsize)
  return -(-rows // sub) * sub * (-(-cols // 128) * 128)


def compact(x, *, weight: bool = False, axes=None):
  """x pinned, on a TPU, to the layout the TPU compiler gives such an array as a program argument: of its two
  minor axes, the one whose tiles pad least on the lanes (the last, XLA's default, on a tie). A KV buffer
  [.., T, D] with D = 96 or 64: positions on the lanes; a down projection [L, F, E] with E = 5280: F on the
  lanes. Pinned where a loop writes (or reads) it, the loop keeps the argument's layout, where unpinned the
  compiler may carry the array in the layout one product prefers and relay it out into a whole copy outside
  the loop (the cache: 12.4 GiB for Huginn-0125 at 2048) or, where a `lax.switch` branch prefers another,
  copy it inside the loop (LoopSpec's KV blocks and layer stacks). `weight`: pin on a tie too (a weight's
  argument layout is the default then; a KV buffer's may permute further, so a tie leaves it free). A no-op
  on other backends (the pin exists only in a TPU lowering). `axes`: x's logical axes, so that on a mesh the
  pin applies to each device's shard (`rules.per_shard`) instead of gathering x whole."""
  if x.ndim < 2:
    return x
  n, (a, b) = x.ndim, x.shape[-2:]
  swapped, default = _padded(b, a, x.dtype.itemsize), _padded(a, b, x.dtype.itemsize)
  if swapped < default:
    order = tuple(range(n - 2)) + (n - 1, n - 2)
  elif weight:
    order = tuple(range(n))
  else:
    return x
  return _pinned(x, order, axes)


def kv_order(shape, itemsize: int):
  """Major-to-minor order of a KV array [..., KV, T, D] (a buffer, one slot, or a window of one) in the layout
  the TPU gives such a buffer as a program argument (its default device layout, `get_default_layout`).

  - Lanes: positions (T) where they pad the 128 lanes less than D does (`compact`'s choice: Huginn's D = 96
    and Raven-Llama's 64 at long contexts), D then on the sublanes under them: [.., KV, D, T].
  - Otherwise D stays on the lanes, and on the sublanes goes the axis whose rows pad least (`_row_waste`), the
    most minor on a tie: T where it fills whole sublane tiles (row-major); else heads (Ouro's 16), a batch of
    8 or a group; for a short cache, whichever pads least. The other axes keep their order.

  tests/models/test_kvcache_layout.py holds this rule to the TPU client's own default layout for every
  registered model's buffers (batch 1 and 8, contexts 2048 and 8192, per shard on the planned meshes) and for
  18,816 other shapes (1-16 heads, leading axes, lengths 9-8197, head dims 32-256, bf16 / f32 / int8)."""
  n, (t, d) = len(shape), shape[-2:]
  if _padded(d, t, itemsize) < _padded(t, d, itemsize):
    return tuple(range(n - 3)) + (n - 3, n - 1, n - 2)
  i = min(range(n - 2, -1, -1), key=lambda i: _row_waste(shape[i], itemsize))
  return tuple(j for j in range(n - 1) if j != i) + (i, n - 1)


def _row_waste(size: int, itemsize: int) -> float:
  """Padded / actual rows of an axis of `size` on a TPU's sublanes: a multiple of 8 rows fills its tiles, as
  does a small power of two down to the dtype's packing (2 of bf16, 4 of int8, 1 of f32), which gets a tile of
  its own height; other sizes pad to the next of those heights or to a multiple of 8."""
  pack = max(1, 4 // itemsize)
  if size % 8 == 0 or (8 % size == 0 and size >= pack):
    return 1.0
  tile = next((p for p in (1, 2, 4, 8) if p >= pack and p >= size), 8)
  return -(-size // tile) * tile / size


def kv_pinned(x, like_shape, axes=None):
  """x [..., KV, T, D] pinned, on a TPU, to `kv_order` of the buffer it belongs to (shape `like_shape`, whose
  trailing axes match x's): a read or a written window of a buffer in the buffer's own layout, so neither
  makes the compiler relay the buffer out: x's axes in the buffer's order. A no-op on other backends.

  On a mesh the order is the buffer's shard's (each axis of `like_shape` split as x's is): a device holding
  one of Ouro's 16 heads (a model axis of 16) keeps its shard [.., 1, T, D] with the batch, not the heads,
  under the positions, where the whole buffer's order would put heads (padded 1 -> 2 rows) there and make the
  compiler relay every buffer out before the loop and back after it (2x the cache in temporaries)."""
  if x.ndim < 3:
    return x
  drop = len(like_shape) - x.ndim

  def order(y):  # y: x, or its shard on a mesh
    local = tuple(like_shape[:drop]) + tuple(s * m // n for s, m, n in zip(like_shape[drop:], y.shape, x.shape))
    return tuple(i - drop for i in kv_order(local, x.dtype.itemsize) if i >= drop)

  return _pinned(x, order, axes)


def _pinned(x, order, axes):
  """x pinned to the layout `order` (major to minor; or a function of the array pinned, x or its shard, that
  gives it) in a TPU lowering, per shard on a mesh when `axes` are given; x itself on other backends."""
  pin = lambda y: with_layout_constraint(y, Layout(major_to_minor=order(y) if callable(order) else order))
  tpu = pin if axes is None else lambda y: rules.per_shard(pin, y, axes)
  return jax.lax.platform_dependent(x, tpu=tpu, default=lambda y: y)


def row_major(x, axes=None):
  """x pinned, on a TPU, to the default (row-major) layout: a projection's output [B, S, N] with its N
  features minor, so the product reads its weight [E, N] as stored. Unpinned, the rotary embedding's strided
  reads of q/k (the interleaved pairs) make the TPU compiler want the product's output feature-major, which
  it gets by a transposed copy of every q/k weight stack before the decode loop (Huginn-0125: 1 GB when
  several rows are verified). A no-op on other backends. `axes`: as `compact`'s."""
  return _pinned(x, tuple(range(x.ndim)), axes)


def rms_norm(x, w, eps, count=None):
  """RMSNorm computed in float32, returned in x's dtype. `count`: the number of real entries of the last axis
  to average over (the rest are zero padding, see ModelConfig.head_padding); None: all of them."""
  x32 = x.astype(jnp.float32)
  if count is None or count == x.shape[-1]:
    ms = jnp.mean(x32 * x32, axis=-1, keepdims=True)
  else:
    ms = jnp.sum(x32 * x32, axis=-1, keepdims=True) / count
  y = x32 * jax.lax.rsqrt(ms + eps)
  return (w.astype(jnp.float32) * y).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig):
  """Inverse RoPE frequencies theta^(-2i/D), with llama3 frequency scaling when configured."""
  d = cfg.head_dim
  inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  if cfg.rope_llama3 is not None:
    factor, low_ff, high_ff, old_ctx = cfg.rope_llama3
    low_wavelen = old_ctx / low_ff
    high_wavelen = old_ctx / high_ff
    wavelen = 2 * math.pi / inv
    smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)
    smoothed = (1 - smooth) * inv / factor + smooth * inv
    inv = jnp.where(wavelen > low_wavelen, inv / factor, jnp.where(wavelen < high_wavelen, inv, smoothed))
  return inv


def apply_rope(x, pos, cfg: ModelConfig):
  """Rotates x [..., S, heads, D] by positions pos [..., S] (rotate_half or interleaved layout)."""
  inv = rope_inv_freq(cfg)
  ang = pos.astype(jnp.float32)[..., None] * inv  # [..., S, D/2]
  cos = jnp.cos(ang)[..., None, :]
  sin = jnp.sin(ang)[..., None, :]
  xf = x.astype(jnp.float32)
  if cfg.rope_interleaved:
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(xf.shape)
  else:
    half = xf.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


# (k, v, mask): k/v [B, KV, T, D] shared by all queries; mask [B, S, T] bool (or broadcastable). Heads before
# positions, so that the cache feeds a canonical batched dot (batch dims B, KV leading in both operands) in
# place, without a transposing copy.
Segment = tuple


def attention(q, segments: Sequence[Segment], cfg: ModelConfig):
  """Softmax attention of q [B, S, H, D] over the union of key/value segments (GQA-aware).

  The (small) queries are laid out [B, KV, S * H/KV, D] so both dots read each (large) segment as stored.
  """
  b, s, h, d = q.shape
  kvh = cfg.num_kv_heads
  hg = h // kvh
  qq = q.reshape(b, s, kvh, hg, d).transpose(0, 2, 1, 3, 4).reshape(b, kvh, s * hg, d)
  scale = 1.0 / math.sqrt(d)
  scores = []
  for k, _, mask in segments:
    sc = jnp.einsum("bkqd,bktd->bkqt", qq, k, preferred_element_type=jnp.float32) * scale
    sc = sc.reshape(b, kvh, s, hg, -1)
    scores.append(jnp.where(mask[:, None, :, None, :], sc, NEG_INF).reshape(b, kvh, s * hg, -1))
  sizes = [sc.shape[-1] for sc in scores]
  probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1)
  out = 0.0
  start = 0
  for (_, v, _), n in zip(segments, sizes):
    pr = probs[..., start : start + n].astype(v.dtype)
    out = out + jnp.einsum("bkqt,bktd->bkqd", pr, v, preferred_element_type=jnp.float32)
    start += n
  out = out.reshape(b, kvh, s, hg, d).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, s, h * d).astype(q.dtype)


def attention_sublayer(p, x, pos, self_mask, ctx: Sequence[Segment], cfg: ModelConfig):
  """Projects x to q/k/v (q/k norm, q/k bias, RoPE as the family does), attends, projects out.

  Returns (output [B, S, E], (k, v)) where k/v [B, S, KV, D] are the entries to cache (post-RoPE).
  """
  b, s, _ = x.shape
  h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  q = row_major(x @ p["wq"], ("batch", "length", "heads"))
  k = row_major(x @ p["wk"], ("batch", "length", "kv_heads"))
  v = row_major(x @ p["wv"], ("batch", "length", "kv_heads"))
  if cfg.qk_norm:  # OLMo-2: RMSNorm over the full projection width (padding excluded), before the head split
    q = rms_norm(q, p["q_norm"], cfg.norm_eps, cfg.real_q_width)
    k = rms_norm(k, p["k_norm"], cfg.norm_eps, cfg.real_kv_width)
  q = q.reshape(b, s, h, d)
  k = k.reshape(b, s, kvh, d)
  v = v.reshape(b, s, kvh, d)
  if cfg.qk_bias:  # Huginn: learned bias added before RoPE
    q = q + p["qk_bias"][0].astype(q.dtype)
    k = k + p["qk_bias"][1].astype(k.dtype)
  q = apply_rope(q, pos, cfg)
  k = apply_rope(k, pos, cfg)
  if callable(ctx):  # a custom attention (e.g. LoopSpec's grouped lane attention) over its own context
    o = ctx(q, k, v)
  else:
    own = (k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), self_mask)
    o = attention(q, list(ctx) + [own], cfg)
  return o @ p["wo"], (k, v)


def mlp(p, x):
  """SwiGLU: down(silu(gate(x)) * up(x))."""
  g = x @ p["w_gate"]
  u = x @ p["w_up"]
  return (jax.nn.silu(g.astype(jnp.float32)).astype(x.dtype) * u) @ p["w_down"]


def block(p, x, pos, self_mask, ctx, cfg: ModelConfig):
  """One transformer block in the family's norm placement; returns (x, (k, v))."""
  eps = cfg.norm_eps
  style = cfg.block_style
  if style == "ouro":
    a, kv = attention_sublayer(p, rms_norm(x, p["norm_1"], eps), pos, self_mask, ctx, cfg)
    x = x + rms_norm(a, p["norm_2"], eps)
    x = x + rms_norm(mlp(p, rms_norm(x, p["norm_3"], eps)), p["norm_4"], eps)
  elif style == "huginn":
    a, kv = attention_sublayer(p, rms_norm(x, p["norm_1"], eps), pos, self_mask, ctx, cfg)
    x = rms_norm(x + a, p["norm_2"], eps)
    x = rms_norm(x + mlp(p, rms_norm(x, p["norm_3"], eps)), p["norm_4"], eps)
  elif style == "llama":
    a, kv = attention_sublayer(p, rms_norm(x, p["norm_1"], eps), pos, self_mask, ctx, cfg)
    x = x + a
    x = x + mlp(p, rms_norm(x, p["norm_2"], eps))
  elif style == "olmo":
    a, kv = attention_sublayer(p, x, pos, self_mask, ctx, cfg)
    x = x + rms_norm(a, p["norm_1"], eps)
    x = x + rms_norm(mlp(p, x), p["norm_2"], eps)
  else:
    raise ValueError(f"unknown block style {style!r}")
  return x, kv


CtxFn = Callable[[jax.Array], Sequence[Segment]]


@flax.struct.dataclass
class LayerViews:
  """A block stack (params stacked on a leading layer axis) read one layer at a time: `views[l]` is layer l's
  dict, sliced where it is READ (inside a decode loop's body), not where the views are made.

  Slicing the stack outside a `lax.while_loop` hands the loop each layer as its own loop input, which the TPU
  compiler materialises as a copy of every weight matrix (7.5 GB of temporaries for Huginn-0125); a static
  slice inside the body feeds the product in place. A pytree (its child is the stacked dict), so it passes
  through loop carries and closures like the stack itself. The stack is read in its argument layout on a
  TPU (`compact`): a `lax.switch` branch whose products prefer another layout would otherwise copy it.
  """

  stack: dict

  def __len__(self) -> int:
    return jax.tree_util.tree_leaves(self.stack)[0].shape[0]

  def __getitem__(self, l: int) -> dict:
    pin = lambda k, x: compact(x, weight=True, axes=rules.layer_axes(k)) if x.ndim == 3 else x
    return {k: pin(k, x)[l] for k, x in self.stack.items()}

  def __iter__(self):
    return (self[l] for l in range(len(self)))


def no_context(_layer):
  return []


def run_stack(stack, x, pos, self_mask, ctx_fn: CtxFn, cfg: ModelConfig):
  """Applies a stack of blocks. Returns (x, k [L,B,S,KV,D], v).

  `stack` is either the stored form (params stacked on a leading layer axis: a lax.scan, ctx_fn gets a traced
  layer index) or the decode form of `looped.prepare_params` (per-layer dicts, `LayerViews`: a Python loop, ctx_fn
  gets the layer as an int, so each layer may read its own cache buffer whole). ctx_fn(l) gives the cached
  key/value segments layer l attends to, or a callable attend(q, k, v) -> [B, S, H*D].
  """
  if isinstance(stack, (tuple, list, LayerViews)):
    ks, vs = [], []
    for l, p in enumerate(stack):
      x, (k, v) = block(p, x, pos, self_mask, ctx_fn(l), cfg)
      ks.append(k)
      vs.append(v)
    if not ks:
      empty = jnp.zeros((0,) + x.shape[:2] + (cfg.num_kv_heads, cfg.head_dim), x.dtype)
      return x, empty, empty
    return x, jnp.stack(ks), jnp.stack(vs)
  n = jax.tree_util.tree_leaves(stack)[0].shape[0]

  def body(h, inp):
    p, l = inp
    h, (k, v) = block(p, h, pos, self_mask, ctx_fn(l), cfg)
    return h, (k, v)

  # Small stacks are unrolled: on CPU a loop iteration costs as much as a tiny layer.
  x, (ks, vs) = jax.lax.scan(body, x, (stack, jnp.arange(n)), unroll=bool(n <= UNROLL_LAYERS))
  return x, ks, vs
