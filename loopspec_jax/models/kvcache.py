"""The committed-prefix KV cache: keys/values of every (recurrent step, layer), one buffer per block.

Recurrent steps are laid out in `group`-step blocks: core step i of layer l lives in buffer
(i % group) * n_core + l at index i // group of its leading axis, so a buffer is [G, B, KV, T, D] with
G = R / group. With group = d1 (LoopSpec), the G lane groups of one sub-step j (lanes at depths g*d1 + j)
read buffer (j, l) WHOLE with one batched dot: no per-lane gather, no slice of a loop-carried buffer.
With group = 1 (autoregressive, chain) each layer has one [R, B, KV, T, D] buffer indexed by the step.
Prelude layers have one [B, KV, T, D] buffer each; coda layers one [n_readouts, B, KV, T, D] buffer each
(one coda cache per readout depth). Every buffer is a separate array (a separate loop-carried value), which
is what lets XLA update it in place and feed it to a dot without copying.

`KVCache` declares the logical axes of its buffers where it is made (`parallel.logical.axes_field`).
Prefill fills a whole prompt at every depth; decoders write one or more positions per request.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.models import layers
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import rules
from loopspec_jax.parallel.logical import axes_field

KV_AXES = ("batch", "kv_heads", "length", "head_dim")


@flax.struct.dataclass
class KVCache:
  """Per buffer a (k, v) pair; see the module docstring for the layout."""

  prelude: tuple = axes_field(*KV_AXES)  # n_prelude x (k, v) [B, KV, T, D]
  core: tuple = axes_field("groups", *KV_AXES)  # (group * n_core) x (k, v) [G, B, KV, T, D]
  coda: tuple = axes_field("readouts", *KV_AXES)  # n_coda x (k, v) [n_readouts, B, KV, T, D]

  @property
  def length(self) -> int:
    return self.core[0][0].shape[-2]


@dataclasses.dataclass(frozen=True)
class CacheLayout:
  """Where each (recurrent step, layer) lives; `group` recurrent steps per block (see module docstring)."""

  n_prelude: int
  n_core: int
  n_coda: int
  recurrence: int
  n_readouts: int
  group: int = 1

  @classmethod
  def of(cls, cfg: ModelConfig, n_readouts: int, group: int = 1) -> "CacheLayout":
    if cfg.recurrence % group:
      raise ValueError(f"cache group {group} must divide the recurrence R={cfg.recurrence}")
    n_coda = cfg.n_coda if cfg.is_raven else 0
    n_prelude = cfg.n_prelude if cfg.is_raven else 0
    return cls(n_prelude, cfg.n_core, n_coda, cfg.recurrence, n_readouts, group)

  @property
  def n_groups(self) -> int:
    return self.recurrence // self.group

  @property
  def n_slots(self) -> int:
    """(step, layer) slots of one position: prelude, R x core, one coda cache per readout."""
    return self.n_prelude + self.recurrence * self.n_core + self.n_readouts * self.n_coda

  def core_buffer(self, j: int, l: int) -> int:
    """Index into KVCache.core of sub-step j (step % group) and layer l."""
    return j * self.n_core + l


def empty_cache(cfg: ModelConfig, layout: CacheLayout, batch: int, length: int) -> KVCache:
  dt = jnp.dtype(cfg.dtype)
  kv = (batch, cfg.num_kv_heads, length, cfg.head_dim)
  pair = lambda lead: (jnp.zeros(lead + kv, dt), jnp.zeros(lead + kv, dt))
  return KVCache(
      prelude=tuple(pair(()) for _ in range(layout.n_prelude)),
      core=tuple(pair((layout.n_groups,)) for _ in range(layout.group * layout.n_core)),
      coda=tuple(pair((layout.n_readouts,)) for _ in range(layout.n_coda)),
  )


# ---------------------------------------------------------------------------------------------------
# The TPU layout of a buffer
# ---------------------------------------------------------------------------------------------------
def stored(x, like=None):
  """x [..., KV, T, D] as a decode loop keeps it: pinned on a TPU to the layout its buffer (`like`, default x
  itself) has as a program argument (`layers.kv_order`: positions on the lanes when D is 96 or 64, heads
  under positions when D is 128 and the positions pad).

  Every write of a loop-carried buffer goes through here, and so does every read of a slot and every window a
  write reads or writes. Unpinned, the TPU compiler carries the buffers of a decode loop in the layout its
  attention products prefer (heads or head dim on the lanes: Huginn-0125's 55 heads or 96 dims padded to 128,
  1.3-2.3x the bytes), so it relays the whole cache out into temporaries before the loop and back after it
  (12.4 GiB for Huginn-0125 at 2048 positions); an unpinned read or window may make it relay a buffer out
  inside the loop (Ouro-1.4B's chain and tree: 13 and 26 copies of a core buffer per round). Pinned, the loop
  keeps the argument's layout and the products read it in place. A no-op on other backends."""
  shape = x.shape if like is None else like.shape
  return layers.kv_pinned(x, shape, axes=(None,) * (x.ndim - len(KV_AXES)) + KV_AXES[-x.ndim :])


# ---------------------------------------------------------------------------------------------------
# Reading: (k, v) [B, KV, T, D] of one slot, and ctx_fns for the standard attention
# ---------------------------------------------------------------------------------------------------
def core_slot(cache: KVCache, layout: CacheLayout, step, l: int):
  """(k, v) [B, KV, T, D] of core step `step` (a Python int, or traced when group == 1), layer l."""
  if isinstance(step, int):
    k, v = cache.core[layout.core_buffer(step % layout.group, l)]
    g = step // layout.group
    return stored(k[g], like=k), stored(v[g], like=v)
  if layout.group != 1:
    raise ValueError("a traced step index needs a cache laid out with group=1")
  k, v = cache.core[l]
  return (
      stored(jax.lax.dynamic_index_in_dim(k, step, 0, keepdims=False), like=k),
      stored(jax.lax.dynamic_index_in_dim(v, step, 0, keepdims=False), like=v),
  )


def prelude_ctx(cache: KVCache, mask):
  """ctx_fn of the prelude stack attending to the committed prefix under mask [B, S, T]."""
  return lambda l: [(stored(cache.prelude[l][0]), stored(cache.prelude[l][1]), mask)]


def core_ctx(cache: KVCache, layout: CacheLayout, step, mask):
  return lambda l: [core_slot(cache, layout, step, l) + (mask,)]


def coda_ctx(cache: KVCache, readout: int, mask):
  coda = lambda l, i: stored(cache.coda[l][i][readout], like=cache.coda[l][i])
  return lambda l: [(coda(l, 0), coda(l, 1), mask)]


# ---------------------------------------------------------------------------------------------------
# Writing positions (in place: one scatter per buffer)
# ---------------------------------------------------------------------------------------------------
def ordered(index, dep, out_of_range: int):
  """`index` made data-dependent on `dep`, a value computed from the reads that must precede a write.

  A layer's new k/v are computed BEFORE its attention reads the cache, so nothing orders the in-place write of
  a buffer after the read of the same buffer, and XLA then copies the whole buffer to keep the read's value
  (an optimization barrier does not survive to copy insertion on CPU). Routing the write's index through a
  value of the layer's output orders it; a NaN output drops the write (index out of range, mode="drop").
  """
  probe = jnp.ravel(dep)[0]
  return jnp.where(probe == probe, index, out_of_range)


def _scatter(buf, lead, k, pos):
  """buf [*lead?, B, KV, T, D] <- k [B, S, KV, D] at per-request positions pos [B, S] (index `lead`)."""
  k = k.astype(buf.dtype)
  bidx = lambda p: jnp.arange(p.shape[0])[:, None]  # from the positions: a shard's own requests on a mesh
  if lead is None:
    return _put(buf, (), k, pos, lambda p: (bidx(p), slice(None), p))
  return _put(buf, (lead,), k[None], pos, lambda p: (lead, bidx(p), slice(None), p), squeeze=True)


MAX_UPDATE_SLICES = 64  # the most (request, position) writes `_put` unrolls as update slices on a TPU


def _put(buf, start, x, pos, index, squeeze=False):
  """buf [*M, B, KV, T, D] <- x [*m, B, S, KV, D] at positions pos [B, S] (out of range: dropped), the m
  leading entries from `start` (len M) on, pinned (`stored`). `index(pos)`: the same write as a scatter index
  (x squeezed of its leading axis when `squeeze`).

  On a TPU, a write of more than one column (several requests, positions or core steps) is `update_slices`:
  one scatter of several indices into a buffer whose positions are minor (its compact layout) is emitted by
  the TPU compiler as a relayout of the whole buffer (head dim minor), the scatter and a relayout back,
  inside the decode loop (2 x 0.94 GB live for each of Huginn-0125's [32, 1, 55, 2053, 96] core buffers when
  chain, tree, lookup or lookahead verify several positions); an update slice writes in place. A TPU
  lowering only (`lax.platform_dependent`); other backends keep the one scatter. Unrolled, the update slices
  are B x S ops in the program, so past `MAX_UPDATE_SLICES` of them (large batches: the statistical tests'
  3000 requests traced 3000 x S slices in the TPU branch) the write stays one scatter on every backend.

  Several requests' one position each (AR and LoopSpec at batch 8) are update slices as well: the TPU
  compiler lays a scatter of one column per request out as heads under positions, and copied the whole
  buffer into and out of that layout every token where the buffer is not already so (Huginn-0125, D = 96:
  32 copies per token at batch 8 on one v5e chip with two core layers and R = 2; 2 on a 1x16 mesh).

  On a mesh whose data axis splits the requests, each device writes its own shards (`rules.per_shard_call`:
  its requests, its KV heads): written globally, the partitioned scatter's result was copied whole into the
  buffer's layout every token (AR, batch 8 on a 2x4 v5e mesh: 2 copies in Huginn-0125's loop). Where the
  requests are not split (a 1 x n mesh) the write is global: per shard it costs temporaries, and with one KV
  head per device (Raven-Llama on 1x8) the per-shard write relaid buffers out."""
  lead = (None,) * (x.ndim - 4)
  axes = ((None,) * (buf.ndim - 4) + KV_AXES, lead + ("batch", None, "kv_heads", "head_dim"), ("batch", None))
  write = functools.partial(_put_local, start, index, squeeze)
  return rules.per_shard_call(write, (buf, x, pos), axes, unsharded=("length",), required=("batch",))


def _put_local(start, index, squeeze, buf, x, pos):
  """`_put` on one device's shards (or the whole arrays): `index(pos)` from the positions given."""
  whole = lambda b: stored(b.at[index(pos)].set(x[0] if squeeze else x, mode="drop"))
  if pos.size * x[..., 0, 0, 0, 0].size == 1 or pos.size > MAX_UPDATE_SLICES:
    return whole(buf)
  return jax.lax.platform_dependent(buf, tpu=lambda b: update_slices(b, start, x, pos), default=whole)


def update_slices(buf, start, x, pos):
  """`_put`'s write as one dynamic update slice per (request, position), each pinned (`stored`): the values
  of the scatter (an out-of-range position keeps the slot's old value, the scatter's drop; a negative one
  counts from the end, as the scatter's index does)."""
  t, m = buf.shape[-2], x.ndim - 4
  for r in range(pos.shape[0]):
    for s in range(pos.shape[1]):
      p = pos[r, s] + jnp.where(pos[r, s] < 0, t, 0)
      at = tuple(start) + (r, 0, jnp.clip(p, 0, t - 1), 0)
      new = jnp.expand_dims(x[..., r, s, :, :], (m, m + 2))  # [*m, 1, KV, 1, D]
      old = stored(jax.lax.dynamic_slice(buf, at, new.shape), like=buf)
      new = stored(jnp.where((p >= 0) & (p < t), new, old), like=buf)
      buf = stored(jax.lax.dynamic_update_slice(buf, new, at))
  return buf


def _write(pairs, idx, lead, k, v, pos):
  pairs = list(pairs)
  kb, vb = pairs[idx]
  pairs[idx] = (_scatter(kb, lead, k, pos), _scatter(vb, lead, v, pos))
  return tuple(pairs)


def write_prelude(cache: KVCache, k, v, pos) -> KVCache:
  """Writes a prelude stack's entries k/v [L, B, S, KV, D] at positions pos [B, S]."""
  pre = cache.prelude
  for l in range(k.shape[0]):
    pre = _write(pre, l, None, k[l], v[l], pos)
  return cache.replace(prelude=pre)


def write_core(cache: KVCache, layout: CacheLayout, step, k, v, pos) -> KVCache:
  """Writes core step `step`'s entries k/v [L, B, S, KV, D] (a Python int; several traced steps at once:
  `write_core_steps`)."""
  core = cache.core
  for l in range(k.shape[0]):
    core = _write(core, layout.core_buffer(step % layout.group, l), step // layout.group, k[l], v[l], pos)
  return cache.replace(core=core)


def write_positions(buf, k, pos):
  """buf [B, KV, T, D] <- k [B, S, KV, D] at positions pos [B, S] (out of range: dropped), written as every
  cache write is (`_put`): a drafter head's own cache."""
  return _scatter(buf, None, k, pos)


def write_stack(buf, k, pos, first=0):
  """buf [M, B, KV, T, D] <- k [n, B, S, KV, D] at positions pos [B, S] into the leading entries first ..
  first + n - 1 at once (a position out of range is dropped), written as every cache write is (`_put`: update
  slices on a TPU). `first` may be traced."""
  lead = first + jnp.arange(k.shape[0])[:, None, None]
  index = lambda p: (lead, jnp.arange(p.shape[0])[None, :, None], slice(None), p[None])
  return _put(buf, (first,), k.astype(buf.dtype), pos, index)


def write_core_steps(cache: KVCache, layout: CacheLayout, steps, k, v, pos) -> KVCache:
  """Writes the entries of several core steps at once: k/v [n_steps, L, B, S, KV, D] for steps [n_steps]
  (traced, consecutive, group == 1) at positions pos [B, S]: one in-place scatter per buffer, after a loop over steps
  that only READ the cache (a loop carrying the cache makes XLA copy every buffer at its boundary)."""
  if layout.group != 1:
    raise ValueError("write_core_steps needs a cache laid out with group=1")
  put = lambda buf, x: write_stack(buf, x, pos, steps[0])
  core = tuple((put(kb, k[:, l]), put(vb, v[:, l])) for l, (kb, vb) in enumerate(cache.core))
  return cache.replace(core=core)


def run_core_steps(
    params, cache: KVCache, layout: CacheLayout, s, e, pos, self_mask, mask, first: int, last: int, cfg: ModelConfig
):
  """Core steps first..last-1 of queries at positions pos [B, S] attending to the cache under mask [B, S, T]
  (and to each other under self_mask); returns (s, cache with the steps' entries written)."""

  def step(s, i):
    s, k, v = M.core_step(params, s, e, pos, self_mask, core_ctx(cache, layout, i, mask), cfg)
    return s, (k, v)

  steps = jnp.arange(first, last)
  s, (k, v) = jax.lax.scan(step, s, steps)
  # ordered after the steps' reads: a one-step scan is inlined, and its write would race its own read (a copy
  # of each buffer per pass: Ouro-1.4B's R = 1 stand-in drafter, 3 per round)
  return s, write_core_steps(cache, layout, steps, k, v, ordered(pos, s, cache.length))


def write_coda(cache: KVCache, readout: int, k, v, pos) -> KVCache:
  coda = cache.coda
  for l in range(k.shape[0]):
    coda = _write(coda, l, readout, k[l], v[l], pos)
  return cache.replace(coda=coda)


# ---------------------------------------------------------------------------------------------------
# Prefill
# ---------------------------------------------------------------------------------------------------
def _write_block(buf, lead, k):
  """buf [*lead?, B, KV, T, D] <- k [B, S, KV, D] at positions 0..S-1 (dynamic_update_slice, in place)."""
  k = k.transpose(0, 2, 1, 3).astype(buf.dtype)  # [B, KV, S, D]
  if lead is None:
    return stored(jax.lax.dynamic_update_slice(buf, k, (0, 0, 0, 0)))
  return stored(jax.lax.dynamic_update_slice(buf, k[None], (lead, 0, 0, 0, 0)))


def prefill(
    params, tokens, lengths, cache: KVCache, cfg: ModelConfig, layout: CacheLayout, readout_depths: tuple, noise=None
) -> KVCache:
  """Runs the prompt tokens [B, Tp] through every depth, filling every buffer for positions 0..Tp-1.

  Coda buffers are filled for each depth of `readout_depths` (one coda cache per readout depth). Entries of
  padded positions are garbage that decoders mask out (keys at positions >= the decoding position).
  A fori_loop over the G step blocks runs the `group` steps of a block unrolled, so every write is an
  in-place dynamic_update_slice of its own buffer.
  """
  params = M.prepare_params(params, cfg)
  b, tp = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(tp), (b, tp))
  mask = M.causal_mask(lengths, tp)
  none = lambda l: []
  e, k, v = M.pre(params, tokens, pos, mask, none, cfg)
  pre = tuple(
      (_write_block(cache.prelude[l][0], None, k[l]), _write_block(cache.prelude[l][1], None, v[l]))
      for l in range(layout.n_prelude)
  )
  s = M.initial_state(e, cfg, noise)

  def block_of_steps(g, carry):
    s, core, states = carry
    core = list(core)
    for j in range(layout.group):
      s, k, v = M.core_step(params, s, e, pos, mask, none, cfg)
      for l in range(layout.n_core):
        kb, vb = core[layout.core_buffer(j, l)]
        core[layout.core_buffer(j, l)] = (_write_block(kb, g, k[l]), _write_block(vb, g, v[l]))
      states = [jnp.where(g * layout.group + j + 1 == r, s, st) for r, st in zip(readout_depths, states)]
    return s, tuple(core), states

  states0 = [jnp.zeros_like(s) for _ in readout_depths]
  _, core, states = jax.lax.fori_loop(0, layout.n_groups, block_of_steps, (s, cache.core, states0))
  cache = cache.replace(prelude=pre, core=core)
  coda = cache.coda
  for ridx, st in enumerate(states):
    _, k, v = M.post(params, st, pos, mask, none, cfg)
    coda = tuple(
        (_write_block(coda[l][0], ridx, k[l]), _write_block(coda[l][1], ridx, v[l])) for l in range(layout.n_coda)
    )
  return cache.replace(coda=coda)
