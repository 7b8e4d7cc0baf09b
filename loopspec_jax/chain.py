"""Classic chain self-speculation: draft gamma tokens from the depth-d1 readout, verify at depth R.

One round: gamma + 1 positions each run `pre` and d1 core steps one after another (drafting x_{j+1} from the
depth-d1 readout of position j), then all gamma + 1 positions run the remaining depths d1..R in ONE batched
pass, are read out at R and verified left to right (standard rule plus a bonus token). Drafts are written
straight into the committed cache; rejected positions are rolled back by length (masked, later overwritten).
"""
from __future__ import annotations

import functools
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax import autoregressive as ar
from loopspec_jax import kvcache
from loopspec_jax import model as M
from loopspec_jax import sampling
from loopspec_jax import verify
from loopspec_jax.config import ModelConfig


@chex.dataclass
class ChainState:
  cache: dict
  tokens: jax.Array  # [B, T]
  length: jax.Array  # [B]
  n_new: jax.Array
  done: jax.Array
  rounds: jax.Array  # [B] verify passes per request
  accepted: jax.Array  # [B] drafts accepted
  iterations: jax.Array  # [] rounds of the batched loop


def validate(cfg: ModelConfig, d1, gamma):
  r = cfg.recurrence
  if d1 is None or int(d1) != d1 or not 1 <= d1 < r:
    raise ValueError(f"chain needs an integer draft depth 1 <= d1 < R={r}, got {d1!r}")
  if gamma is None or int(gamma) != gamma or gamma < 1:
    raise ValueError(f"chain needs an integer gamma >= 1, got {gamma!r}")


@functools.partial(jax.jit, static_argnames=("cfg", "d1", "gamma", "greedy", "random_init"),
                   donate_argnames=("state",))
def decode_loop(params, state: ChainState, sp: ar.SamplingParams, *, cfg: ModelConfig, d1: int, gamma: int,
                greedy: bool, random_init: bool):
  r = cfg.recurrence
  layout = M.SlotLayout(cfg, 2)  # coda caches for readouts at d1 (ridx 0) and R (ridx 1)
  process = functools.partial(sampling.process_logits, greedy=greedy, temperature=sp.temperature,
                              top_k=sp.top_k, top_p=sp.top_p)
  s_len = gamma + 1

  def round_(st: ChainState) -> ChainState:
    b, t = st.tokens.shape
    bi = jnp.arange(b)
    p0 = st.length - 1  # first position of the round (its token is committed)
    one = jnp.ones((b, 1, 1), bool)
    cache = st.cache
    states, injections, drafts, qs = [], [], [], []
    tok = st.tokens[bi, p0]
    # Drafting: gamma + 1 positions, one at a time, to depth d1.
    for j in range(s_len):
      q = (p0 + j)[:, None]
      mask = jnp.arange(t)[None, None, :] < q[:, :, None]
      e, k, v = M.pre(params, tok[:, None], q, one, kvcache.prefix_ctx(cache, layout.prelude(0), mask), cfg)
      cache = kvcache.write_positions(cache, layout.prelude(0), k, v, q)
      noise = ar.state_noise(sp, q, cfg) if random_init else None
      s = M.initial_state(e, cfg, noise)
      for i in range(d1):
        s, k, v = M.core_step(params, s, e, q, one, kvcache.prefix_ctx(cache, layout.core(i, 0), mask), cfg)
        cache = kvcache.write_positions(cache, layout.core(i, 0), k, v, q)
      logits, k, v = M.post(params, s, q, one, kvcache.prefix_ctx(cache, layout.coda(0, 0), mask), cfg)
      cache = kvcache.write_positions(cache, layout.coda(0, 0), k, v, q)
      states.append(s)
      injections.append(e)
      if j < gamma:
        probs = process(logits[:, 0])
        keys = jax.vmap(lambda rid, p: sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_X1))(
            sp.request_ids, p0 + j + 1)
        tok = jax.vmap(sampling.sample_token)(keys, probs)
        drafts.append(tok)
        qs.append(probs)
    # Verification pass: all gamma + 1 positions through depths d1..R at once, read out at R.
    s = jnp.concatenate(states, axis=1)  # [B, S, E]
    e = jnp.concatenate(injections, axis=1)
    pos = p0[:, None] + jnp.arange(s_len)[None, :]
    mask = jnp.broadcast_to(jnp.arange(t)[None, None, :] < p0[:, None, None], (b, s_len, t))
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((s_len, s_len), bool)), (b, s_len, s_len))

    def step(i, carry):
      s, cache = carry
      base = layout.core(i, 0)
      s, k, v = M.core_step(params, s, e, pos, causal, kvcache.prefix_ctx(cache, base, mask), cfg)
      return s, kvcache.write_positions(cache, base, k, v, pos)

    s, cache = jax.lax.fori_loop(d1, r, step, (s, cache))
    logits, k, v = M.post(params, s, pos, causal, kvcache.prefix_ctx(cache, layout.coda(1, 0), mask), cfg)
    cache = kvcache.write_positions(cache, layout.coda(1, 0), k, v, pos)
    p_target = process(logits)  # [B, S, V]
    drafts_arr = jnp.stack(drafts, axis=1)  # [B, G]
    q_arr = jnp.stack(qs, axis=1)  # [B, G, V]
    vkeys = jax.vmap(lambda rid, p: sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_VERIFY))(
        sp.request_ids, p0 + 1)
    n_acc, nxt = jax.vmap(verify.verify_chain)(vkeys, p_target, drafts_arr, q_arr)
    # Commit n_acc drafts and the next token, within the budget and up to the first eos.
    cand = jnp.concatenate([drafts_arr, jnp.zeros((b, 1), jnp.int32)], axis=1)
    cand = cand.at[bi, n_acc].set(nxt)
    idx = jnp.arange(s_len)[None, :]
    live = ~st.done
    n_commit = jnp.minimum(n_acc + 1, sp.max_new - st.n_new)
    is_eos = (cand == sp.eos_id) & (idx < n_commit[:, None])
    first_eos = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1, s_len + 1)
    n_commit = jnp.where(live, jnp.minimum(n_commit, first_eos), 0)
    write_pos = jnp.where(idx < n_commit[:, None], st.length[:, None] + idx, t)
    tokens = st.tokens.at[bi[:, None], write_pos].set(cand, mode="drop")
    n_new = st.n_new + n_commit
    done = st.done | (live & ((n_new >= sp.max_new) | (first_eos <= n_commit)))
    return ChainState(cache=cache, tokens=tokens, length=st.length + n_commit, n_new=n_new, done=done,
                      rounds=st.rounds + live, accepted=st.accepted + jnp.where(live, jnp.minimum(n_acc, n_commit), 0),
                      iterations=st.iterations + 1)

  return jax.lax.while_loop(lambda st: ~jnp.all(st.done), round_, state)


def generate_chain(model, prompt_arr, len_arr, sp, *, total, greedy, random_init, d1, gamma, mesh=None):
  from loopspec_jax import api
  cfg = model.config
  validate(cfg, d1, gamma)
  d1, gamma = int(d1), int(gamma)
  total = total + gamma + 1  # drafts may run gamma positions past the last committed one
  t0 = time.perf_counter()
  from loopspec_jax import sharding
  cache, tokens = sharding.entry(ar.prefill_state, mesh)(model.params, prompt_arr, len_arr, sp, cfg=cfg,
                                                         readout_depths=(d1, cfg.recurrence), total_len=total,
                                                         random_init=random_init)
  jax.block_until_ready(cache)
  t1 = time.perf_counter()
  lengths0 = np.asarray(len_arr)
  b = prompt_arr.shape[0]
  zb = lambda: jnp.zeros((b,), jnp.int32)
  state = ChainState(cache=cache, tokens=tokens, length=jnp.array(len_arr), n_new=zb(), done=jnp.zeros((b,), bool),
                     rounds=zb(), accepted=zb(), iterations=jnp.int32(0))
  out = sharding.entry(decode_loop, mesh)(model.params, state, sp, cfg=cfg, d1=d1, gamma=gamma, greedy=greedy,
                                          random_init=random_init)
  jax.block_until_ready(out.tokens)
  t2 = time.perf_counter()
  n = int(np.asarray(out.n_new).sum())
  rounds = int(np.asarray(out.rounds).sum())
  iters = int(out.iterations)
  r = cfg.recurrence
  seq_steps = (gamma + 1) * d1 + (r - d1)
  stats = {
      "method": "chain", "d1": d1, "gamma": gamma, "batch": b, "tokens_generated": n,
      "prefill_seconds": t1 - t0, "decode_seconds": t2 - t1, "tokens_per_second": n / max(t2 - t1, 1e-9),
      "ticks": iters, "rounds": rounds, "core_step_calls": iters * seq_steps,
      "core_step_calls_per_token": iters * seq_steps * b / max(n, 1),
      "mean_accepted_length": n / max(rounds, 1),
      "acceptance_rate": int(np.asarray(out.accepted).sum()) / max(rounds * gamma, 1),
      "tokens_per_r_steps": n * r / max(rounds * seq_steps, 1),
      "commits": {"first": int(np.asarray(out.accepted).sum()), "second": 0,
                  "restart": n - int(np.asarray(out.accepted).sum())},
      "gate_open_rate": 0.0, "skipped_spawns": 0,
  }
  return api.GenerateResult(api.collect_tokens(out.tokens, lengths0, out.n_new), stats)
