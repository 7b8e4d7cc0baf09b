"""The model passes the drafters share, below every method that uses them (draft-model speculation, draft
trees, tree self-speculation, the cost analysis of a draft step):

- `full_pass`: pre, every core step and the full-depth readout of S positions per request in one batched pass,
  writing their cache entries (the target's verify pass of `draft.py` and every drafter step);
- `run_level`: one level of a token tree (S queries per request at one position) run to depth d1 and read out
  there, attending to the committed prefix and to the in-flight entries of earlier levels, writing nothing;
- `append_level`: those in-flight entries plus a new level's.
"""

from __future__ import annotations

import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M


def full_pass(params, cache, toks, pos, self_mask, mask, layout: kvcache.CacheLayout, cfg: ModelConfig, noise):
  """pre, every core step and the readout at full depth of S positions per request in ONE batched pass.

  toks / pos [B, S]; self_mask [B, S, S] among the queries; mask [B, S, T] over the cache (the committed
  prefix); `params` in the decode form; `layout` group 1 with one readout. Writes the positions' entries and
  returns (float32 logits [B, S, V], cache). Used for the target's verify pass and every drafter step.
  """
  t = cache.length
  e, k, v = M.pre(params, toks, pos, self_mask, kvcache.prelude_ctx(cache, mask), cfg)
  cache = kvcache.write_prelude(cache, k, v, kvcache.ordered(pos, e, t))
  s = M.initial_state(e, cfg, noise)
  s, cache = kvcache.run_core_steps(params, cache, layout, s, e, pos, self_mask, mask, 0, cfg.recurrence, cfg)
  logits, k, v = M.post(params, s, pos, self_mask, kvcache.coda_ctx(cache, 0, mask), cfg)
  cache = kvcache.write_coda(cache, 0, k, v, kvcache.ordered(pos, logits, t))
  return logits, cache


def _ctx(base, past, name, past_mask):
  """ctx_fn `base` plus the in-flight segment of slot `name` (k/v [L, B, P, KV, D]) under past_mask."""
  if past is None:
    return base

  def ctx(l):
    k, v = past[name]
    return base(l) + [(k[l].transpose(0, 2, 1, 3), v[l].transpose(0, 2, 1, 3), past_mask)]

  return ctx


def run_level(params, cache, layout, toks, p0, level: int, past, past_mask, d1: int, cfg: ModelConfig, noise):
  """pre + d1 core steps + readout at d1 of S queries per request (toks [B, S], all at position p0 + level),
  attending to the committed prefix (positions < p0) and to the in-flight entries `past` ({slot: (k, v)
  [L, B, P, KV, D]} of earlier levels, None at level 0) under past_mask [B, S, P]; each query also sees
  itself. Returns (logits at d1 [B, S, V], this level's entries by slot); writes nothing."""
  b, s_len = toks.shape
  t = cache.length
  pos = jnp.broadcast_to((p0 + level)[:, None], (b, s_len))
  mask = jnp.broadcast_to(jnp.arange(t)[None, None, :] < p0[:, None, None], (b, s_len, t))
  own = jnp.broadcast_to(jnp.eye(s_len, dtype=bool), (b, s_len, s_len))
  e, k, v = M.pre(params, toks, pos, own, _ctx(kvcache.prelude_ctx(cache, mask), past, "pre", past_mask), cfg)
  new = {"pre": (k, v)}
  s = M.initial_state(e, cfg, noise)
  for i in range(d1):
    ctx = _ctx(kvcache.core_ctx(cache, layout, i, mask), past, f"core{i}", past_mask)
    s, k, v = M.core_step(params, s, e, pos, own, ctx, cfg)
    new[f"core{i}"] = (k, v)
  logits, k, v = M.post(params, s, pos, own, _ctx(kvcache.coda_ctx(cache, 0, mask), past, "coda", past_mask), cfg)
  new["coda"] = (k, v)
  return logits, new


def append_level(past, new):
  """The in-flight entries of earlier levels plus this level's (concatenated along the query axis)."""
  if past is None:
    return new
  return {n: tuple(jnp.concatenate([a, b], axis=2) for a, b in zip(past[n], new[n])) for n in past}
