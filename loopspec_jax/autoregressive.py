"""Autoregressive decoding at full depth R: one jitted `lax.while_loop` over tokens, all on device.

Each iteration processes the last committed token of every request (pre, R core steps writing the per-step
cache slots, post at depth R), then draws the next token with the shared logits processing and a
per-(request, position) key.
"""
from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from loopspec_jax import kvcache
from loopspec_jax import model as M
from loopspec_jax import sampling
from loopspec_jax.config import ModelConfig


@chex.dataclass
class DecodeState:
  """The whole mutable state of a decode loop, as an explicit pytree."""
  cache: dict
  tokens: jax.Array  # [B, T] committed tokens (prompt + generated)
  length: jax.Array  # [B] number of committed tokens
  n_new: jax.Array  # [B] generated so far
  done: jax.Array  # [B]
  iterations: jax.Array  # [] loop iterations (each = R batched core-step calls)


@chex.dataclass(frozen=True)
class SamplingParams:
  """Traced sampling settings shared by every decoder (greedy is a static flag, not in here)."""
  temperature: jax.Array
  top_k: jax.Array
  top_p: jax.Array
  base_key: jax.Array
  request_ids: jax.Array  # [B]
  eos_id: jax.Array  # [] (-1: none)
  max_new: jax.Array  # [B]


def state_noise(sp: SamplingParams, positions, cfg: ModelConfig):
  """Per-(request, position) random initial states [B, S, E] (Raven 'like-init')."""
  def one(rid, p):
    key = sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_INIT)
    return M.random_state_noise(key, (cfg.hidden_size,), cfg)
  return jax.vmap(lambda rid, ps: jax.vmap(lambda p: one(rid, p))(ps))(sp.request_ids, positions)


def prompt_noise(sp: SamplingParams, b: int, t: int, cfg: ModelConfig, random_init: bool):
  if not random_init:
    return None
  return state_noise(sp, jnp.broadcast_to(jnp.arange(t), (b, t)), cfg)


def full_depth_token_step(params, cache, tok, pos, noise, layout: M.SlotLayout, cfg: ModelConfig):
  """Processes one token per request at position pos [B] through every depth; returns (logits [B,V], cache)."""
  b = tok.shape[0]
  t = cache["k"].shape[3]
  q = pos[:, None]
  mask = (jnp.arange(t)[None, None, :] < pos[:, None, None])  # [B, 1, T]: the committed prefix
  self_mask = jnp.ones((b, 1, 1), bool)
  e, k, v = M.pre(params, tok[:, None], q, self_mask, kvcache.prefix_ctx(cache, layout.prelude(0), mask), cfg)
  cache = kvcache.write_positions(cache, layout.prelude(0), k, v, q)
  s = M.initial_state(e, cfg, noise)

  def step(i, carry):
    s, cache = carry
    base = layout.core(i, 0)
    s, k, v = M.core_step(params, s, e, q, self_mask, kvcache.prefix_ctx(cache, base, mask), cfg)
    return s, kvcache.write_positions(cache, base, k, v, q)

  s, cache = jax.lax.fori_loop(0, cfg.recurrence, step, (s, cache))
  logits, k, v = M.post(params, s, q, self_mask, kvcache.prefix_ctx(cache, layout.coda(0, 0), mask), cfg)
  cache = kvcache.write_positions(cache, layout.coda(0, 0), k, v, q)
  return logits[:, 0], cache


def commit(state: DecodeState, y, sp: SamplingParams):
  """Appends y [B] to every unfinished request and updates done flags."""
  b = y.shape[0]
  live = ~state.done
  tokens = state.tokens.at[jnp.arange(b), state.length].set(jnp.where(live, y, state.tokens[jnp.arange(b), state.length]), mode="drop")
  n_new = state.n_new + live
  length = state.length + live
  done = state.done | (live & ((y == sp.eos_id) | (n_new >= sp.max_new)))
  return tokens, length, n_new, done


@functools.partial(jax.jit, static_argnames=("cfg", "greedy", "random_init"), donate_argnames=("state",))
def decode_loop(params, state: DecodeState, sp: SamplingParams, *, cfg: ModelConfig, greedy: bool,
                random_init: bool):
  """Generates until every request is done; the loop never returns to the host."""
  layout = M.SlotLayout(cfg, 1)

  def body(st: DecodeState):
    b = st.tokens.shape[0]
    pos = st.length - 1
    tok = st.tokens[jnp.arange(b), pos]
    noise = state_noise(sp, pos[:, None], cfg) if random_init else None
    logits, cache = full_depth_token_step(params, st.cache, tok, pos, noise, layout, cfg)
    probs = sampling.process_logits(logits, greedy=greedy, temperature=sp.temperature, top_k=sp.top_k,
                                    top_p=sp.top_p)
    keys = jax.vmap(lambda r, p: sampling.request_key(sp.base_key, r, p, sampling.PURPOSE_AR))(sp.request_ids, pos + 1)
    y = jax.vmap(sampling.sample_token)(keys, probs)
    tokens, length, n_new, done = commit(st, y, sp)
    return DecodeState(cache=cache, tokens=tokens, length=length, n_new=n_new, done=done,
                       iterations=st.iterations + 1)

  return jax.lax.while_loop(lambda st: ~jnp.all(st.done), body, state)


@functools.partial(jax.jit, static_argnames=("cfg", "readout_depths", "total_len", "random_init"))
def prefill_state(params, prompt, lengths, sp: SamplingParams, *, cfg: ModelConfig, readout_depths: tuple,
                  total_len: int, random_init: bool):
  """Allocates the cache for total_len positions and prefills the prompt [B, Tp] at every depth."""
  b, tp = prompt.shape
  layout = M.SlotLayout(cfg, len(readout_depths))
  cache = kvcache.empty_cache(cfg, layout, b, total_len)
  noise = prompt_noise(sp, b, tp, cfg, random_init)
  cache = kvcache.prefill(params, prompt, lengths, cache, cfg, layout, readout_depths, noise)
  tokens = jnp.zeros((b, total_len), jnp.int32).at[:, :tp].set(prompt)
  return cache, tokens


@functools.partial(jax.jit, static_argnames=("cfg", "split"))
def incremental_readouts(params, tokens, *, cfg: ModelConfig, split: int):
  """Prefill tokens[:, :split] at every depth, then decode the rest one position at a time, reading out at
  every depth 1..R. Returns logits [R, B, T - split, V]; used to check the cache against `forward_depths`."""
  b, t = tokens.shape
  depths = tuple(range(1, cfg.recurrence + 1))
  layout = M.SlotLayout(cfg, len(depths))
  cache = kvcache.empty_cache(cfg, layout, b, t)
  cache = kvcache.prefill(params, tokens[:, :split], jnp.full((b,), split, jnp.int32), cache, cfg, layout, depths)
  self_mask = jnp.ones((b, 1, 1), bool)
  outs = []
  for p in range(split, t):
    q = jnp.full((b, 1), p, jnp.int32)
    mask = jnp.broadcast_to(jnp.arange(t)[None, None, :] < p, (b, 1, t))
    e, k, v = M.pre(params, tokens[:, p:p + 1], q, self_mask, kvcache.prefix_ctx(cache, layout.prelude(0), mask), cfg)
    cache = kvcache.write_positions(cache, layout.prelude(0), k, v, q)
    s = M.initial_state(e, cfg)
    per_depth = []
    for i in range(cfg.recurrence):
      s, k, v = M.core_step(params, s, e, q, self_mask, kvcache.prefix_ctx(cache, layout.core(i, 0), mask), cfg)
      cache = kvcache.write_positions(cache, layout.core(i, 0), k, v, q)
      logits, k, v = M.post(params, s, q, self_mask, kvcache.prefix_ctx(cache, layout.coda(i, 0), mask), cfg)
      cache = kvcache.write_positions(cache, layout.coda(i, 0), k, v, q)
      per_depth.append(logits[:, 0])
    outs.append(jnp.stack(per_depth))
  return jnp.stack(outs, axis=2)
