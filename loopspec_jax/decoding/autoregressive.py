"""Autoregressive decoding at full depth R: one jitted `lax.while_loop` over tokens, all on device.

Each iteration processes the last committed token of every request (pre, R core steps writing the per-step
cache buffers, post at depth R), then picks the next token: greedy as a plain argmax (no keys, no
distributions), sampled through the shared logits processing and a per-(request, position) key.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import common
from loopspec_jax.decoding.method import Method
from loopspec_jax.decoding import sampling
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import entry
from loopspec_jax.parallel.logical import axes_field


@flax.struct.dataclass
class DecodeState:
  """The whole mutable state of a decode loop, as an explicit pytree."""

  cache: kvcache.KVCache  # committed prefix, laid out with group=R (axes declared by KVCache)
  tokens: jax.Array = axes_field("batch", "length")  # [B, T] committed tokens (prompt + generated)
  length: jax.Array = axes_field("batch")  # [B] number of committed tokens
  n_new: jax.Array = axes_field("batch")  # [B] generated so far
  done: jax.Array = axes_field("batch")  # [B]
  iterations: jax.Array = axes_field()  # [] loop iterations (each = R batched core-step calls)


def full_depth_token_step(
    params, cache: kvcache.KVCache, tok, pos, noise, layout: kvcache.CacheLayout, cfg: ModelConfig
):
  """Processes one token per request at position pos [B] through every depth; returns (logits [B,V], cache).

  `params` in the decode form (`looped.prepare_params`); `layout` with group=R and one readout (depth R): the
  R core steps are unrolled and each (step, layer) slot is its own buffer, which the attention dot reads in
  place (a traced step index into one [R, ...] buffer per layer copies the slot out at every step).
  """
  b = tok.shape[0]
  t = cache.length
  q = pos[:, None]
  mask = jnp.arange(t)[None, None, :] < pos[:, None, None]  # [B, 1, T]: the committed prefix
  self_mask = jnp.ones((b, 1, 1), bool)
  e, k, v = M.pre(params, tok[:, None], q, self_mask, kvcache.prelude_ctx(cache, mask), cfg)
  cache = kvcache.write_prelude(cache, k, v, kvcache.ordered(q, e, t))  # after the prelude's reads: no copy
  s = M.initial_state(e, cfg, noise)
  entries = []
  for i in range(cfg.recurrence):  # unrolled: step i reads its own buffers whole (layout group = R)
    s, k, v = M.core_step(params, s, e, q, self_mask, kvcache.core_ctx(cache, layout, i, mask), cfg)
    entries.append((k, v))
  wq = kvcache.ordered(q, s, t)  # every step's reads precede the writes: in place, no copy
  for i, (k, v) in enumerate(entries):
    cache = kvcache.write_core(cache, layout, i, k, v, wq)
  logits, k, v = M.post(params, s, q, self_mask, kvcache.coda_ctx(cache, 0, mask), cfg)
  cache = kvcache.write_coda(cache, 0, k, v, kvcache.ordered(q, logits, t))
  return logits[:, 0], cache


@entry.program(entry.LOOP, donate_argnames=("state",))
def decode_loop(
    params, state: DecodeState, sp: common.SamplingParams, *, cfg: ModelConfig, greedy: bool, random_init: bool
):
  """Generates until every request is done; the loop never returns to the host."""
  layout = kvcache.CacheLayout.of(cfg, 1, cfg.recurrence)
  params = M.prepare_params(params, cfg)

  def body(st: DecodeState):
    b = st.tokens.shape[0]
    pos = st.length - 1
    tok = st.tokens[jnp.arange(b), pos]
    noise = common.state_noise(sp, pos[:, None], cfg) if random_init else None
    logits, cache = full_depth_token_step(params, st.cache, tok, pos, noise, layout, cfg)
    if greedy:
      y = sampling.greedy_token(logits)
    else:
      probs = common.row_distributions(logits, sp)
      keys = jax.vmap(lambda r, p: sampling.request_key(sp.base_key, r, p, sampling.PURPOSE_AR))(
          sp.request_ids, pos + 1
      )
      y = jax.vmap(sampling.sample_token)(keys, probs)
    tokens, length, n_new, done, _ = common.commit_tokens(
        st.tokens, st.length, st.n_new, st.done, y[:, None], jnp.ones_like(y), sp
    )
    return DecodeState(cache=cache, tokens=tokens, length=length, n_new=n_new, done=done, iterations=st.iterations + 1)

  return common.loop_until_done(body, state, sp)


@entry.program(entry.INIT)
def initial_state(cache, tokens, lengths, sp: common.SamplingParams, *, cfg: ModelConfig) -> DecodeState:
  del sp, cfg
  return DecodeState(cache=cache, **common.fresh_counters(tokens, lengths))


def summarize(st: DecodeState, cfg: ModelConfig) -> common.DecodeStats:
  """Raw counts: every AR token is a restart at depth 0."""
  return common.DecodeStats.of_loop(
      "ar", st, cfg.recurrence, settings={"recurrence": cfg.recurrence}, per_request={"restart": st.n_new}
  )


def make_decoder(cfg: ModelConfig, *, greedy: bool, random_init: bool) -> common.Decoder:
  return common.Decoder(
      name="ar",
      readout_depths=(cfg.recurrence,),
      cache_group=cfg.recurrence,
      extra_positions=0,
      init=initial_state,
      loop=decode_loop,
      stats=functools.partial(summarize, cfg=cfg),
      init_kw={"cfg": cfg},
      loop_kw={"cfg": cfg, "greedy": greedy, "random_init": random_init},
  )


@functools.partial(jax.jit, static_argnames=("cfg", "split"))
def incremental_readouts(params, tokens, *, cfg: ModelConfig, split: int):
  """Prefill tokens[:, :split] at every depth, then decode the rest one position at a time, reading out at
  every depth 1..R. Returns logits [R, B, T - split, V]; used to check the cache against `forward_depths`."""
  b, t = tokens.shape
  depths = tuple(range(1, cfg.recurrence + 1))
  layout = kvcache.CacheLayout.of(cfg, len(depths))
  cache = kvcache.empty_cache(cfg, layout, b, t)
  cache = kvcache.prefill(params, tokens[:, :split], jnp.full((b,), split, jnp.int32), cache, cfg, layout, depths)
  params = M.prepare_params(params, cfg)
  self_mask = jnp.ones((b, 1, 1), bool)
  outs = []
  for p in range(split, t):
    q = jnp.full((b, 1), p, jnp.int32)
    mask = jnp.broadcast_to(jnp.arange(t)[None, None, :] < p, (b, 1, t))
    e, k, v = M.pre(params, tokens[:, p : p + 1], q, self_mask, kvcache.prelude_ctx(cache, mask), cfg)
    cache = kvcache.write_prelude(cache, k, v, q)
    s = M.initial_state(e, cfg)
    per_depth = []
    for i in range(cfg.recurrence):
      s, k, v = M.core_step(params, s, e, q, self_mask, kvcache.core_ctx(cache, layout, i, mask), cfg)
      cache = kvcache.write_core(cache, layout, i, k, v, q)
      logits, k, v = M.post(params, s, q, self_mask, kvcache.coda_ctx(cache, i, mask), cfg)
      cache = kvcache.write_coda(cache, i, k, v, q)
      per_depth.append(logits[:, 0])
    outs.append(jnp.stack(per_depth))
  return jnp.stack(outs, axis=2)


@dataclasses.dataclass(frozen=True)
class AR(Method):
  """Autoregressive decoding at full depth R: the reference every other method equals."""

  name = "ar"
  build_decoder = staticmethod(make_decoder)

  @classmethod
  def derived(cls, stats) -> dict:
    return {"tokens_per_pass": 1.0, "acceptance": None, "draft_cost_share": 0.0}
