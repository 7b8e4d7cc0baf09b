"""How lanes see and change the KV stores, and how new lanes are placed: pure functions over arrays.

Group order: inside a tick the lanes are processed in **group order** (row g * W + w holds the lane of
stage `stage_of_group(t, G)[g]`, row w, at depth g * d1), so that queries line up with the [G, ...] leading
axis of a cache block and every attention read is a dense batched dot over a whole buffer. The row
permutation is an involution (applying it twice gives the identity), so the same gather maps stage order to
group order and back.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.models import kvcache
from loopspec_jax.models.layers import NEG_INF


def stage_of_group(t, n_groups: int):
  """[G] int32: the stage whose lanes are at depth group g during tick t (lanes spawned at tick t' live in
  stage t' mod G and are in group t - 1 - t' during tick t)."""
  return ((t - 1 - jnp.arange(n_groups)) % n_groups).astype(jnp.int32)


def group_rows(t, n_groups: int, width: int, cols: int = 0):
  """[G * cols] int32: the stable lane id at each group-order row of the first `cols` columns of every stage
  (0: all W; then an involution on 0..N-1)."""
  stages = stage_of_group(t, n_groups)
  return (stages[:, None] * width + jnp.arange(cols or width)[None, :]).reshape(-1)


def request_columns(alive, width: int):
  """[B] int32: each request's highest live column of any stage, plus one (lanes enter a stage at its low
  columns, `allocate_lanes`, and pruning only removes them, so the first that many columns hold every lane)."""
  col = jnp.arange(alive.shape[1], dtype=jnp.int32) % width + 1
  return jnp.max(jnp.where(alive, col[None, :], 0), axis=1)


def live_columns(alive, width: int):
  """[] int32: the columns holding every live lane of the batch (the widest request's `request_columns`)."""
  return jnp.max(request_columns(alive, width))


def ladder_index(need, ladder: tuple):
  """The index in `ladder` (ascending widths) of the narrowest width holding need columns (at most the last)."""
  lad = jnp.asarray(ladder, jnp.int32)
  return jnp.minimum(jnp.sum(lad < jnp.asarray(need)[..., None], axis=-1), len(ladder) - 1)


def ladder_width(need, ladder: tuple):
  """need's entries rounded up to the narrowest width of `ladder` that holds them (at most the last)."""
  return jnp.asarray(ladder, jnp.int32)[ladder_index(need, ladder)]


def id_columns(x, n_groups: int, width: int, cols: int, axis: int):
  """x's stable-id axis `axis` (N = G * W) cut to the ids of the first `cols` columns of every stage, in id
  order (stage * cols + w): a static strided slice, the identity when cols = W."""
  if cols == width:
    return x
  sh = x.shape
  y = x.reshape(sh[:axis] + (n_groups, width) + sh[axis + 1 :])
  y = jax.lax.slice_in_dim(y, 0, cols, axis=axis + 1)
  return y.reshape(sh[:axis] + (n_groups * cols,) + sh[axis + 1 :])


def read_rows(table, ids, *, shared: bool = False):
  """table [B, N, V] rows at ids as a one-hot dot: one row per request (ids [B] -> [B, V]) or, with `shared`,
  the same K rows of every request (ids [K] -> [B, K, V]).

  A gather of a loop-carried table that is also updated in the same tick gets fused into (and recomputed by)
  its consumers, which XLA may schedule after the update, so it copies the whole table to keep the old rows.
  A dot is never fused that way: it reads the table once, in place, before the update. Exact (one 1.0 per
  output element, HIGHEST precision)."""
  b, n, _ = table.shape
  onehot = (jnp.arange(n) == ids[..., None]).astype(table.dtype)  # [B, N] or [K, N]
  onehot = jnp.broadcast_to(onehot, (b,) + onehot.shape) if shared else onehot[:, None, :]  # [B, K, N]
  # [B, K, N] x [B, N, V]: the table is the rhs in canonical (batch, contracting, free) order, read as stored.
  rows = jax.lax.dot_general(onehot, table, (((2,), (1,)), ((0,), (0,))), precision=jax.lax.Precision.HIGHEST)
  return rows if shared else rows[:, 0]


def block_scores(qq, keys):
  """Scores [G, B, KV, Q, T] float32 of queries qq [G, B, KV, Q, D] against a whole key block [G, B, KV, T, D].

  One query row is a batched matrix-vector product. Several rows (a second lane column, or GQA head groups)
  are computed as keys . q^T ([.., T, Q]) and only the small result is transposed: XLA CPU runs the
  (Q, D) x (T, D)^T form of this dot with a small-matrix kernel per batch, 2-4x slower than keys . q^T at
  G x KV = 64 batches, Q = 2..16, T = 129..257 (measured on tiny-raven's shapes). Both read the block once,
  in place, so the choice changes no byte of traffic on any backend."""
  if qq.shape[-2] == 1:
    return jnp.einsum("gbkqd,gbktd->gbkqt", qq, keys, preferred_element_type=jnp.float32)
  return jnp.swapaxes(jnp.einsum("gbktd,gbkqd->gbktq", keys, qq, preferred_element_type=jnp.float32), -1, -2)


def grouped_attend(prefix, spec, prefix_mask, anc_rows, cfg: ModelConfig):
  """Attention of lanes in group order over one cache block, their ancestors' entries and themselves.

  prefix: (k, v) [G, B, KV, T, D], block g read by the W query rows of group g; spec: (k, v) [G, B, KV, N, D]
  (entries by stable lane id); prefix_mask [B, T]; anc_rows [B, G*W, N] (query row -> ancestor ids).
  Returns attend(q [B, G*W, H, D], k, v [B, G*W, KV, D]) -> [B, G*W, H*D]. The queries are transposed (they
  are small) so that both big operands are read in place by canonical batched dots (batch dims G, B, KV).
  """
  pk, pv = (kvcache.stored(x) for x in prefix)  # read in the layout the loop keeps the block (on a TPU)
  sk, sv = spec
  g, _, kvh, t, d = pk.shape
  scale = 1.0 / math.sqrt(d)

  def attend(q, k, v):
    b, s, h, _ = q.shape
    w, hg = s // g, h // kvh
    qq = q.reshape(b, g, w, kvh, hg, d).transpose(1, 0, 3, 2, 4, 5).reshape(g, b, kvh, w * hg, d)
    sc_p = block_scores(qq, pk) * scale
    sc_p = jnp.where(prefix_mask[None, :, None, None, :], sc_p, NEG_INF)
    sc_s = block_scores(qq, sk) * scale
    mask_s = anc_rows.reshape(b, g, w, 1, 1, -1).transpose(1, 0, 3, 2, 4, 5)  # [G, B, 1, W, 1, N]
    sc_s = jnp.where(mask_s, sc_s.reshape(g, b, kvh, w, hg, -1), NEG_INF).reshape(g, b, kvh, w * hg, -1)
    kk = k.reshape(b, g, w, kvh, 1, d).transpose(1, 0, 3, 2, 4, 5).astype(jnp.float32)  # [G, B, KV, W, 1, D]
    qf = qq.reshape(g, b, kvh, w, hg, d).astype(jnp.float32)
    sc_o = (jnp.sum(qf * kk, axis=-1) * scale).reshape(g, b, kvh, w * hg, 1)  # each lane sees itself
    probs = jax.nn.softmax(jnp.concatenate([sc_p, sc_s, sc_o], axis=-1), axis=-1)
    n = sk.shape[3]
    out = jnp.einsum("gbkqt,gbktd->gbkqd", probs[..., :t].astype(pv.dtype), pv, preferred_element_type=jnp.float32)
    out = out + jnp.einsum(
        "gbkqn,gbknd->gbkqd", probs[..., t : t + n].astype(sv.dtype), sv, preferred_element_type=jnp.float32
    )
    vv = v.reshape(b, g, w, kvh, 1, d).transpose(1, 0, 3, 2, 4, 5).astype(jnp.float32)
    out = out + (probs[..., t + n :].reshape(g, b, kvh, w, hg, 1) * vv).reshape(g, b, kvh, w * hg, d)
    out = out.reshape(g, b, kvh, w, hg, d).transpose(1, 0, 3, 2, 4, 5).reshape(b, s, h * d)
    return out.astype(q.dtype)

  return attend


def write_rows(pairs, idx: int, lead, ids, k, v):
  """Stores rows' new entries k/v [B, S, KV, D] under stable ids [S] in buffer `idx` of a SpecKV field.

  lead: None (buffer [B, KV, N, D]) or per-row leading indices [S] (buffer [G or nR, B, KV, N, D]).
  One in-place scatter per buffer; rows of dead lanes write to their own (dead) ids, which nothing reads.
  """
  pairs = list(pairs)
  out = []
  for buf, x in zip(pairs[idx], (k, v)):
    x = x.astype(buf.dtype)
    if lead is None:
      out.append(buf.at[:, :, ids].set(x.transpose(0, 2, 1, 3), mode="drop"))  # [B, KV, S, D]
    else:
      out.append(buf.at[lead, :, :, ids].set(x.transpose(1, 0, 2, 3), mode="drop"))  # [S, B, KV, D]
  pairs[idx] = tuple(out)
  return tuple(pairs)


UNROLLED_COMMIT_MAX_BATCH = 16


def commit_entries(cache: kvcache.KVCache, spec, root, pos) -> kvcache.KVCache:
  """Moves lane `root` [B]'s speculative entries (every block, layer and readout) into the committed prefix
  at positions pos [B]; a request without a root this tick writes to the cache's last position, a scratch
  position no query ever reads (the cache holds one more position than a request can fill).

  Up to UNROLLED_COMMIT_MAX_BATCH requests: one dynamic_update_slice per (buffer, request), a pure data move that
  XLA updates in place for every dtype. Larger batches: one scatter per buffer (in place too, except that XLA CPU
  normalises a bf16 scatter to f32 and then copies the buffer; accelerators do not).
  """
  b = root.shape[0]
  bi = jnp.arange(b)

  def move(buf, src, lead: bool):
    if b > UNROLLED_COMMIT_MAX_BATCH:
      if lead:  # [L, B, KV, T, D] <- [L, B, KV, N, D] at (b, root[b]) -> (b, pos[b]); advanced dims lead
        return buf.at[:, bi, :, pos].set(src[:, bi, :, root], mode="promise_in_bounds")
      return buf.at[bi, :, pos].set(src[bi, :, root], mode="promise_in_bounds")
    for i in range(b):
      if lead:
        entry = jax.lax.dynamic_slice_in_dim(src[:, i : i + 1], root[i], 1, axis=3)
        buf = jax.lax.dynamic_update_slice(buf, entry, (0, i, 0, pos[i], 0))
      else:  # [B, KV, T, D] <- [B, KV, N, D]
        entry = jax.lax.dynamic_slice_in_dim(src[i : i + 1], root[i], 1, axis=2)
        buf = jax.lax.dynamic_update_slice(buf, entry, (i, 0, pos[i], 0))
    return buf

  moved = lambda dst, src, lead: tuple(
      tuple(kvcache.stored(move(d, s, lead)) for d, s in zip(dp, sp)) for dp, sp in zip(dst, src)
  )
  return cache.replace(
      prelude=moved(cache.prelude, spec.prelude, False),
      core=moved(cache.core, spec.core, True),
      coda=moved(cache.coda, spec.coda, True),
  )


def allocate_lanes(want1, want2):
  """Ranked placement of spawn requests into the W free rows of the new stage.

  want1, want2 [B, W] bool: first-proposal children requested by the W lanes at depth d1 and gated second
  proposals requested by the W lanes at depth d2. First proposals are served before second ones, each in row
  order, into rows 0..W-1. Returns (assigned [B, W] bool: the row gets a child, src [B, W] int32 in 0..2W-1:
  which request (first proposals 0..W-1, second W..2W-1), granted1 [B, W], granted2 [B, W]).
  """
  w = want1.shape[1]
  req = jnp.concatenate([want1, want2], axis=1)  # [B, 2W] in priority order
  rank = jnp.cumsum(req, axis=1) - 1
  granted = req & (rank < w)
  match = granted[:, :, None] & (rank[:, :, None] == jnp.arange(w)[None, None, :])  # [B, 2W, W]
  assigned = jnp.any(match, axis=1)
  src = jnp.argmax(match, axis=1).astype(jnp.int32)
  return assigned, src, granted[:, :w], granted[:, w:]
