"""The committed-prefix KV cache: one slot per (recurrent step, layer), plus prelude and coda slots.

A cache is a plain dict pytree {'k', 'v'} of shape [n_slots, B, KV, T, D] (heads before positions); which slot holds what is given by
`model.SlotLayout`. Prefill fills a whole prompt at every depth; decoders append one position at a time.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from loopspec_jax import model as M
from loopspec_jax.config import ModelConfig


def empty_cache(cfg: ModelConfig, layout: M.SlotLayout, batch: int, length: int):
  shape = (layout.n_slots, batch, cfg.num_kv_heads, length, cfg.head_dim)
  dt = jnp.dtype(cfg.dtype)
  return {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)}


def slot_view(cache, slot):
  """(k, v) of one slot, [B, KV, T, D]; `slot` may be traced."""
  return (jax.lax.dynamic_index_in_dim(cache["k"], slot, 0, keepdims=False),
          jax.lax.dynamic_index_in_dim(cache["v"], slot, 0, keepdims=False))


def prefix_ctx(cache, base, mask):
  """A ctx_fn for a layer stack whose layer l lives at slot base + l, attending under `mask` [B,S,T]."""
  def ctx(l):
    k, v = slot_view(cache, base + l)
    return [(k, v, mask)]
  return ctx


def write_block(cache, base, k, v):
  """Writes a stack's entries k/v [L, B, S, KV, D] for positions 0..S-1 at slots base..base+L-1."""
  if k.shape[0] == 0:
    return cache
  idx = (base, 0, 0, 0, 0)
  k = k.transpose(0, 1, 3, 2, 4).astype(cache["k"].dtype)  # [L, B, KV, S, D]
  v = v.transpose(0, 1, 3, 2, 4).astype(cache["v"].dtype)
  return {"k": jax.lax.dynamic_update_slice(cache["k"], k, idx),
          "v": jax.lax.dynamic_update_slice(cache["v"], v, idx)}


def write_positions(cache, base, k, v, pos):
  """Writes k/v [L, B, S, KV, D] at slots base..base+L-1 and per-request positions pos [B, S]."""
  n = k.shape[0]
  if n == 0:
    return cache
  b = k.shape[1]
  slots = (base + jnp.arange(n))[:, None, None]
  bidx = jnp.arange(b)[None, :, None]
  p = pos[None]
  # Advanced indices around a slice: the indexed dims [L, B, S] lead, then KV, D (the layout of k).
  return {"k": cache["k"].at[slots, bidx, :, p].set(k.astype(cache["k"].dtype), mode="drop"),
          "v": cache["v"].at[slots, bidx, :, p].set(v.astype(cache["v"].dtype), mode="drop")}


def prefill(params, tokens, lengths, cache, cfg: ModelConfig, layout: M.SlotLayout, readout_depths: tuple,
            noise=None):
  """Runs the prompt tokens [B, Tp] through every depth, filling every slot for positions 0..Tp-1.

  Coda slots are filled for each depth of `readout_depths` (one coda cache per readout depth). Entries of
  padded positions are garbage that decoders mask out (keys at positions >= the decoding position).
  """
  b, tp = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(tp), (b, tp))
  mask = M.causal_mask(lengths, tp)
  none = lambda l: []
  e, k, v = M.pre(params, tokens, pos, mask, none, cfg)
  cache = write_block(cache, layout.prelude(0), k, v)
  s = M.initial_state(e, cfg, noise)

  def step(carry, i):
    s, cache = carry
    s, k, v = M.core_step(params, s, e, pos, mask, none, cfg)
    cache = write_block(cache, layout.core(i, 0), k, v)
    return (s, cache), s

  (_, cache), states = jax.lax.scan(step, (s, cache), jnp.arange(cfg.recurrence))
  for ridx, r in enumerate(readout_depths):
    _, k, v = M.post(params, states[r - 1], pos, mask, none, cfg)
    cache = write_block(cache, layout.coda(ridx, 0), k, v)
  return cache
