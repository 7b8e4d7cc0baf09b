"""LoopSpec: pipelined self-speculative decoding over a statically shaped branch tree of lanes.

A lane carries one token through the recurrence. Each tick: `pre` for new lanes, d1 core steps (each ONE
batched, masked call of the shared core over all N lanes of all B requests), `post` for lanes at d1, d2 or
R, then drafting (x1 ~ q1 at d1), the gated residual second proposal (x2 ~ q2 at d2), cascade verification
of the root lane at R, commit, child selection, pruning and spawning, all as array operations inside one
jitted `lax.while_loop`. Lanes attend to the committed prefix cache and to their ancestors' speculative
entries (per lane, per (step, layer) slot) through a tree mask; nothing is copied until a lane commits.
"""
from __future__ import annotations

import functools
import time
from typing import Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax import autoregressive as ar
from loopspec_jax import model as M
from loopspec_jax import sampling
from loopspec_jax import verify
from loopspec_jax.config import ModelConfig

PROP_RESTART, PROP_FIRST, PROP_SECOND = 0, 1, 2


@chex.dataclass
class LaneTable:
  """Per request (leading axis B), N lanes: the branch tree as arrays."""
  alive: jax.Array  # [B, N] bool
  pos: jax.Array  # [B, N] position of the lane's input token
  token: jax.Array  # [B, N] input token
  depth: jax.Array  # [B, N] recurrent steps done
  parent: jax.Array  # [B, N] parent lane (-1: none)
  prop: jax.Array  # [B, N] how the token was proposed: 0 restart, 1 first (d1), 2 second (d2)
  anc: jax.Array  # [B, N, N] anc[b, n, m]: lane m is a (speculative) strict ancestor of lane n
  s: jax.Array  # [B, N, E] recurrent state
  e: jax.Array  # [B, N, E] input injection (prelude output; Ouro: embedding)
  x1: jax.Array  # [B, N] first proposal drafted at d1
  q1: jax.Array  # [B, N, V]
  x2: jax.Array  # [B, N] second proposal drafted at d2
  q2: jax.Array  # [B, N, V]
  gate: jax.Array  # [B, N] bool: a second proposal exists (and has a lane)


@chex.dataclass
class LoopSpecStats:
  """Per-request counters, [B] each."""
  ticks: jax.Array
  first: jax.Array  # commits whose next lane is the first-proposal child
  second: jax.Array  # ... the second-proposal child
  restart: jax.Array  # ... a restarted lane
  last_source: jax.Array  # source of the last commit (0 restart, 1 first, 2 second)
  reject_first: jax.Array  # verifications that rejected x1
  gate_evals: jax.Array
  gate_opens: jax.Array
  skipped_first: jax.Array
  skipped_second: jax.Array
  live_sum: jax.Array
  live_max: jax.Array


@chex.dataclass
class LoopSpecState:
  cache: dict  # committed prefix {'k','v'} [n_slots, B, KV, T, D]
  spec: dict  # speculative entries {'k','v'} [n_slots, B, KV, N, D]
  lanes: LaneTable
  tokens: jax.Array  # [B, T]
  length: jax.Array  # [B] committed tokens; the prefix holds positions < length - 1
  n_new: jax.Array
  done: jax.Array
  limit: jax.Array  # [B] last position a lane may be spawned at (exclusive)
  stats: LoopSpecStats
  iterations: jax.Array


# ---------------------------------------------------------------------------------------------------
# Validation and defaults
# ---------------------------------------------------------------------------------------------------
def default_capacity(r: int, d1: int, d2: Optional[int]) -> int:
  """Lanes per request: the R/d1 pipeline, one spare, and room for live second-proposal branches."""
  base = r // d1 + 1
  if d2 is None:
    return base
  return base + max(1, (r - d2) // d1 // 2)


def validate(cfg: ModelConfig, d1, d2, capacity):
  r = cfg.recurrence
  if d1 is None or int(d1) != d1 or d1 < 1:
    raise ValueError(f"LoopSpec needs an integer d1 >= 1, got {d1!r}")
  if r % d1:
    raise ValueError(f"d1={d1} must divide the recurrence R={r}")
  if d1 >= r:
    raise ValueError(f"d1={d1} must be smaller than R={r}")
  if d2 is not None:
    if int(d2) != d2 or not d1 < d2 < r:
      raise ValueError(f"d2={d2} must satisfy d1 < d2 < R (d1={d1}, R={r})")
    if d2 % d1:
      raise ValueError(f"d1={d1} must divide d2={d2}")
  need = r // d1 + 1
  if capacity is not None and capacity < need:
    raise ValueError(f"lane_capacity={capacity} is too small: LoopSpec needs at least R/d1 + 1 = {need} lanes")


# ---------------------------------------------------------------------------------------------------
# Lane-batched model calls
# ---------------------------------------------------------------------------------------------------
def _gather_slots(store, slot):
  """store [n_slots, B, KV, X, D], slot [B, N] -> [B, N, KV, X, D] (each lane's own slot)."""
  b = slot.shape[0]
  return store[jnp.clip(slot, 0, store.shape[0] - 1), jnp.arange(b)[:, None]]


def lane_ctx(cache, spec, slot_base, prefix_mask, anc, uniform: bool):
  """ctx_fn for lanes: committed prefix at the lane's slot + ancestors' speculative entries (tree mask)."""
  def ctx(l):
    if uniform:  # every lane reads the same slot (prelude): share the context
      slot = slot_base[0, 0] + l
      pk, pv = cache["k"][slot], cache["v"][slot]
      sk, sv = spec["k"][slot], spec["v"][slot]
    else:
      slot = slot_base + l
      pk, pv = _gather_slots(cache["k"], slot), _gather_slots(cache["v"], slot)
      sk, sv = _gather_slots(spec["k"], slot), _gather_slots(spec["v"], slot)
    return [(pk, pv, prefix_mask), (sk, sv, anc)]
  return ctx


def lane_writes(slot_base, k, v, write, n_slots):
  """One pending write: entries k/v [L, B, N, KV, D] for slots slot_base + l of the lanes where `write`."""
  n_layers = k.shape[0]
  slots = jnp.where(write[None], slot_base[None] + jnp.arange(n_layers)[:, None, None], n_slots)
  return slots, k, v


def apply_lane_writes(spec, writes):
  """Applies a tick's pending writes with ONE scatter per store.

  Within a tick every read of the speculative store is of entries written in earlier ticks (a lane's
  ancestors are at least d1 steps ahead), so all writes can wait until the end of the tick; one scatter
  into the loop-carried buffer lets XLA update it in place instead of copying it after each write.
  """
  writes = [w for w in writes if w[1].shape[0]]
  slots = jnp.concatenate([w[0] for w in writes])
  k = jnp.concatenate([w[1] for w in writes]).astype(spec["k"].dtype)
  v = jnp.concatenate([w[2] for w in writes]).astype(spec["v"].dtype)
  _, b, _, n = spec["k"].shape[:4]
  bidx = jnp.arange(b)[None, :, None]
  nidx = jnp.arange(n)[None, None, :]
  return {"k": spec["k"].at[slots, bidx, :, nidx].set(k, mode="drop"),
          "v": spec["v"].at[slots, bidx, :, nidx].set(v, mode="drop")}


# ---------------------------------------------------------------------------------------------------
# The tick
# ---------------------------------------------------------------------------------------------------
def _onehot_rows(idx, n):
  return jax.nn.one_hot(idx, n, dtype=bool)


def make_tick(params, sp: ar.SamplingParams, cfg: ModelConfig, d1: int, d2: Optional[int], greedy: bool,
              random_init: bool):
  """Builds the while_loop body: one tick of the LoopSpec pipeline for every request."""
  r = cfg.recurrence
  dd2 = r if d2 is None else d2  # single proposal: the "second" endpoint is R itself
  readouts = (d1, r) if d2 is None else (d1, d2, r)
  layout = M.SlotLayout(cfg, len(readouts))
  n_slots = layout.n_slots
  process = functools.partial(sampling.process_logits, greedy=greedy, temperature=sp.temperature,
                              top_k=sp.top_k, top_p=sp.top_p)

  def keys_for(pos, purpose):  # pos [B, N] -> keys [B, N, 2]
    f = lambda rid, p: sampling.request_key(sp.base_key, rid, p, purpose)
    return jax.vmap(lambda rid, ps: jax.vmap(lambda p: f(rid, p))(ps))(sp.request_ids, pos)

  def tick(st: LoopSpecState) -> LoopSpecState:
    ln = st.lanes
    b, n = ln.alive.shape
    t = st.cache["k"].shape[3]
    active = ~st.done  # [B]
    alive = ln.alive & active[:, None]
    prefix_len = st.length - 1  # [B]
    prefix_mask = jnp.broadcast_to((jnp.arange(t)[None, :] < prefix_len[:, None])[:, None, :], (b, n, t))
    self_mask = jnp.broadcast_to(jnp.eye(n, dtype=bool), (b, n, n))
    cache, spec = st.cache, st.spec

    # 1. pre for new lanes.
    fresh = alive & (ln.depth == 0)
    base = jnp.full((b, n), layout.prelude(0), jnp.int32)
    e, k, v = M.pre(params, ln.token, ln.pos, self_mask, lane_ctx(cache, spec, base, prefix_mask, ln.anc, True), cfg)
    writes = [lane_writes(base, k, v, fresh, n_slots)]
    noise = ar.state_noise(sp, ln.pos, cfg) if random_init else None
    s0 = M.initial_state(e, cfg, noise)
    s = jnp.where(fresh[..., None], s0.astype(ln.s.dtype), ln.s)
    e = jnp.where(fresh[..., None], e.astype(ln.e.dtype), ln.e)

    # 2. d1 core steps, each one batched masked call over all lanes.
    for j in range(d1):
      step = ln.depth + j
      base = layout.core_base + jnp.clip(step, 0, r - 1) * cfg.n_core
      s_new, k, v = M.core_step(params, s, e, ln.pos, self_mask,
                                lane_ctx(cache, spec, base, prefix_mask, ln.anc, False), cfg)
      writes.append(lane_writes(base, k, v, alive, n_slots))
      s = jnp.where(alive[..., None], s_new, s)
    depth = jnp.where(alive, ln.depth + d1, ln.depth)

    # 3. post for lanes at an endpoint (d1, d2, R), each with its own coda cache.
    at_d1 = alive & (depth == d1)
    at_d2 = alive & (depth == d2) if d2 is not None else jnp.zeros_like(alive)
    at_r = alive & (depth == r)
    ridx = jnp.where(at_d1, 0, jnp.where(at_r, len(readouts) - 1, 1))
    base = layout.coda_base + ridx * cfg.n_coda
    logits, k, v = M.post(params, s, ln.pos, self_mask, lane_ctx(cache, spec, base, prefix_mask, ln.anc, False), cfg)
    writes.append(lane_writes(base, k, v, at_d1 | at_d2 | at_r, n_slots))
    spec = apply_lane_writes(spec, writes)
    probs = process(logits)  # [B, N, V]

    # 4a. verification of the root (the one lane at depth R).
    has_root = jnp.any(at_r, axis=1)  # [B]
    root = jnp.argmax(at_r, axis=1)
    bi = jnp.arange(b)
    vkeys = jax.vmap(lambda rid, p: sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_VERIFY))(
        sp.request_ids, ln.pos[bi, root] + 1)
    y, stage = jax.vmap(verify.verify_cascade)(vkeys, probs[bi, root], ln.x1[bi, root], ln.q1[bi, root],
                                               ln.gate[bi, root], ln.x2[bi, root], ln.q2[bi, root])
    want_prop = jnp.where(stage == 1, PROP_FIRST, jnp.where(stage == 2, PROP_SECOND, -1))
    is_child = alive & (ln.parent == root[:, None]) & (ln.prop == want_prop[:, None]) & (ln.token == y[:, None])
    kept_found = jnp.any(is_child, axis=1) & has_root
    kept = jnp.argmax(is_child, axis=1)
    source = jnp.where(kept_found, jnp.where(stage == 2, PROP_SECOND, PROP_FIRST), PROP_RESTART)

    # Commit: the root's entries move into the prefix at its position; the token y is appended.
    commit_pos = jnp.where(has_root, ln.pos[bi, root], t)
    moved_k = spec["k"][:, bi, :, root]  # [B, n_slots, KV, D] (advanced indices lead)
    moved_v = spec["v"][:, bi, :, root]
    cache = {"k": cache["k"].at[:, bi, :, commit_pos].set(moved_k, mode="drop"),
             "v": cache["v"].at[:, bi, :, commit_pos].set(moved_v, mode="drop")}
    tokens = st.tokens.at[bi, jnp.where(has_root, st.length, t)].set(y, mode="drop")
    length = st.length + has_root
    n_new = st.n_new + has_root
    done = st.done | (has_root & ((y == sp.eos_id) | (n_new >= sp.max_new)))

    # The commit that finishes a request spawns nothing after it: count it by its verification stage.
    stage_source = jnp.where(stage == 1, PROP_FIRST, jnp.where(stage == 2, PROP_SECOND, PROP_RESTART))
    source = jnp.where(done & ~st.done, stage_source, source)

    # Prune: keep the kept child's subtree; drop the root. With no kept child, everything goes.
    keep_tree = is_child[bi, kept][:, None] & (_onehot_rows(kept, n) | ln.anc[bi, :, kept])
    survive = jnp.where(has_root[:, None], keep_tree & kept_found[:, None], alive) & ~done[:, None]
    anc = ln.anc & survive[:, :, None] & survive[:, None, :]

    # 4b. drafting at d1 and the gated second proposal at d2 (for every lane; used where at an endpoint).
    k1 = keys_for(ln.pos + 1, sampling.PURPOSE_X1)
    x1_new = jax.vmap(jax.vmap(sampling.sample_token))(k1, probs)
    x1 = jnp.where(at_d1, x1_new, ln.x1)
    q1 = jnp.where(at_d1[..., None], probs, ln.q1)
    if d2 is not None:
      k2 = keys_for(ln.pos + 1, sampling.PURPOSE_X2)
      g_new, x2_new, q2_new = jax.vmap(jax.vmap(verify.second_proposal))(k2, ln.q1, ln.x1, probs)
      gate = jnp.where(at_d2, g_new, ln.gate)
      x2 = jnp.where(at_d2, x2_new, ln.x2)
      q2 = jnp.where(at_d2[..., None], q2_new, ln.q2)
    else:
      gate, x2, q2 = ln.gate, ln.x2, ln.q2

    # 5. spawn children into free lanes: first proposals before second ones; skip when full.
    can_spawn = survive & (ln.pos + 1 < st.limit[:, None])
    want1 = can_spawn & at_d1
    want2 = can_spawn & at_d2 & gate
    free = ~survive
    req = jnp.concatenate([want1, want2], axis=1)  # [B, 2N] in priority order
    req_rank = jnp.cumsum(req, axis=1) - 1
    free_rank = jnp.where(free, jnp.cumsum(free, axis=1) - 1, -1)  # [B, N]
    n_free = jnp.sum(free, axis=1)
    # A second proposal grows a subtree of up to (R - d2)/d1 + 1 lanes before its parent is verified; it is
    # granted only if that much room is left after the first proposals, so that second branches do not
    # starve the first-proposal pipeline of lanes. (Decided at spawn time, before anything depends on x2's
    # value or on verification randomness: still exact.)
    n_first = jnp.sum(want1, axis=1)
    room2 = n_free - ((r - dd2) // d1 + 1)
    granted1 = req[:, :n] & (req_rank[:, :n] < n_free[:, None])
    granted2 = req[:, n:] & (req_rank[:, n:] < jnp.minimum(n_free, n_first + room2)[:, None])
    granted = jnp.concatenate([granted1, granted2], axis=1)
    match = granted[:, :, None] & (req_rank[:, :, None] == free_rank[:, None, :])  # [B, 2N, N]
    assigned = jnp.any(match, axis=1)  # [B, N] slot receives a child
    src = jnp.argmax(match, axis=1)  # [B, N] which request fills the slot
    parent = jnp.where(src >= n, src - n, src)
    child_prop = jnp.where(src >= n, PROP_SECOND, PROP_FIRST)
    child_tok = jnp.where(src >= n, x2[bi[:, None], parent], x1[bi[:, None], parent])
    skipped1 = jnp.sum(want1 & ~granted[:, :n], axis=1)
    skipped2 = jnp.sum(want2 & ~granted[:, n:], axis=1)
    gate = gate & ~(want2 & ~granted[:, n:])  # a second proposal without a lane is withdrawn (still exact)

    # Restart: when no child was kept, a fresh lane carries y from depth 0.
    restart = has_root & ~kept_found & ~done
    restart_slot = jnp.argmax(~survive & ~assigned, axis=1)
    rs = restart[:, None] & _onehot_rows(restart_slot, n)

    new_lane = assigned | rs
    par_anc = anc[bi[:, None], parent]  # [B, N, N]
    new_anc = jnp.where(rs[..., None], False, par_anc | _onehot_rows(parent, n))
    anc = jnp.where(new_lane[..., None], new_anc, anc)
    lanes = LaneTable(
        alive=survive | new_lane,
        pos=jnp.where(assigned, ln.pos[bi[:, None], parent] + 1, jnp.where(rs, st.length[:, None], ln.pos)),
        token=jnp.where(assigned, child_tok, jnp.where(rs, y[:, None], ln.token)),
        depth=jnp.where(new_lane, 0, depth),
        parent=jnp.where(assigned, parent, jnp.where(rs, -1, ln.parent)),
        prop=jnp.where(assigned, child_prop, jnp.where(rs, PROP_RESTART, ln.prop)),
        anc=anc,
        s=s, e=e, x1=x1, q1=q1, x2=x2, q2=q2,
        gate=jnp.where(new_lane, False, gate))

    live = jnp.sum(alive, axis=1)
    ss = st.stats
    cnt = lambda c: c.astype(jnp.int32)
    stats = LoopSpecStats(
        ticks=ss.ticks + cnt(active),
        first=ss.first + cnt(has_root & (source == PROP_FIRST)),
        second=ss.second + cnt(has_root & (source == PROP_SECOND)),
        restart=ss.restart + cnt(has_root & (source == PROP_RESTART)),
        last_source=jnp.where(has_root, source, ss.last_source),
        reject_first=ss.reject_first + cnt(has_root & (stage != 1)),
        gate_evals=ss.gate_evals + jnp.sum(at_d2, axis=1),
        gate_opens=ss.gate_opens + (jnp.sum(at_d2 & g_new, axis=1) if d2 is not None else 0),
        skipped_first=ss.skipped_first + skipped1,
        skipped_second=ss.skipped_second + skipped2,
        live_sum=ss.live_sum + live,
        live_max=jnp.maximum(ss.live_max, live))
    return LoopSpecState(cache=cache, spec=spec, lanes=lanes, tokens=tokens, length=length, n_new=n_new,
                         done=done, limit=st.limit, stats=stats, iterations=st.iterations + 1)

  return tick, readouts


@functools.partial(jax.jit, static_argnames=("cfg", "d1", "d2", "greedy", "random_init"), donate_argnames=("state",))
def decode_loop(params, state: LoopSpecState, sp: ar.SamplingParams, *, cfg: ModelConfig, d1: int,
                d2: Optional[int], greedy: bool, random_init: bool):
  tick, _ = make_tick(params, sp, cfg, d1, d2, greedy, random_init)
  return jax.lax.while_loop(lambda st: ~jnp.all(st.done), tick, state)


@functools.partial(jax.jit, static_argnames=("cfg", "capacity", "readouts"))
def initial_state(cache, tokens, lengths, sp: ar.SamplingParams, cfg: ModelConfig, capacity: int,
                  readouts: tuple) -> LoopSpecState:
  """One root lane per request carrying the last prompt token from depth 0."""
  b = tokens.shape[0]
  n = capacity
  e_dim, v = cfg.hidden_size, cfg.vocab_size
  dt = jnp.dtype(cfg.dtype)
  layout = M.SlotLayout(cfg, len(readouts))
  spec_shape = (layout.n_slots, b, cfg.num_kv_heads, n, cfg.head_dim)
  zeros_i = jnp.zeros((b, n), jnp.int32)
  first = jnp.zeros((b, n), bool).at[:, 0].set(True)
  bi = jnp.arange(b)
  lanes = LaneTable(
      alive=first, pos=zeros_i.at[:, 0].set(lengths - 1), token=zeros_i.at[:, 0].set(tokens[bi, lengths - 1]),
      depth=zeros_i, parent=zeros_i - 1, prop=zeros_i, anc=jnp.zeros((b, n, n), bool),
      s=jnp.zeros((b, n, e_dim), dt), e=jnp.zeros((b, n, e_dim), dt), x1=zeros_i - 1,
      q1=jnp.zeros((b, n, v), jnp.float32), x2=zeros_i - 1, q2=jnp.zeros((b, n, v), jnp.float32),
      gate=jnp.zeros((b, n), bool))
  zb = jnp.zeros((b,), jnp.int32)
  stats = LoopSpecStats(ticks=zb, first=zb, second=zb, restart=zb, last_source=zb, reject_first=zb,
                        gate_evals=zb, gate_opens=zb, skipped_first=zb, skipped_second=zb, live_sum=zb,
                        live_max=zb)
  return LoopSpecState(cache=cache, spec={"k": jnp.zeros(spec_shape, dt), "v": jnp.zeros(spec_shape, dt)},
                       lanes=lanes, tokens=tokens, length=lengths, n_new=zb, done=jnp.zeros((b,), bool),
                       limit=lengths + sp.max_new - 1, stats=stats, iterations=jnp.int32(0))


def summarize(st: LoopSpecState, cfg: ModelConfig, d1: int, d2: Optional[int]) -> dict:
  """Host-side statistics (sums over requests) including the release's mean accepted length."""
  r = cfg.recurrence
  dd2 = r if d2 is None else d2
  s = jax.tree_util.tree_map(np.asarray, st.stats)
  n = int(np.asarray(st.n_new).sum())
  first, second, restart = int(s.first.sum()), int(s.second.sum()), int(s.restart.sum())
  rej1 = second + restart
  cycles = n * d1 + rej1 * (dd2 - d1) + restart * (r - dd2)
  ticks = int(s.ticks.sum())
  evals = int(s.gate_evals.sum())
  return {
      "tokens_generated": n, "ticks": ticks, "ticks_max": int(s.ticks.max()),
      "core_step_calls": int(np.asarray(st.iterations)) * d1,
      "mean_accepted_length": r * n / max(cycles, 1),
      "tokens_per_r_steps": r * n / max(ticks * d1, 1),
      "commits": {"first": first, "second": second, "restart": restart},
      "reject_first": int(s.reject_first.sum()),
      "gate_open_rate": int(s.gate_opens.sum()) / max(evals, 1), "gate_evals": evals,
      "skipped_spawns": int(s.skipped_first.sum() + s.skipped_second.sum()),
      "skipped_first": int(s.skipped_first.sum()), "skipped_second": int(s.skipped_second.sum()),
      "mean_live_lanes": float(s.live_sum.sum()) / max(ticks, 1), "max_live_lanes": int(s.live_max.max()),
      "per_request": {k: np.asarray(getattr(s, k)).tolist() for k in
                      ("ticks", "first", "second", "restart", "last_source", "reject_first")},
  }


def generate_loopspec(model, prompt_arr, len_arr, sp, *, total, greedy, random_init, d1, d2, lane_capacity,
                      mesh=None):
  from loopspec_jax import api
  cfg = model.config
  validate(cfg, d1, d2, lane_capacity)
  d1 = int(d1)
  d2 = None if d2 is None else int(d2)
  cap = lane_capacity or default_capacity(cfg.recurrence, d1, d2)
  readouts = (d1, cfg.recurrence) if d2 is None else (d1, d2, cfg.recurrence)
  t0 = time.perf_counter()
  from loopspec_jax import sharding
  cache, tokens = sharding.entry(ar.prefill_state, mesh)(model.params, prompt_arr, len_arr, sp, cfg=cfg,
                                                         readout_depths=readouts, total_len=total,
                                                         random_init=random_init)
  jax.block_until_ready(cache)
  t1 = time.perf_counter()
  lengths0 = np.asarray(len_arr)
  state = sharding.entry(initial_state, mesh)(cache, tokens, len_arr, sp, cfg=cfg, capacity=cap, readouts=readouts)
  out = sharding.entry(decode_loop, mesh)(model.params, state, sp, cfg=cfg, d1=d1, d2=d2, greedy=greedy,
                                          random_init=random_init)
  jax.block_until_ready(out.tokens)
  t2 = time.perf_counter()
  stats = summarize(out, cfg, d1, d2)
  b = prompt_arr.shape[0]
  stats.update({"method": "loopspec", "d1": d1, "d2": d2, "lane_capacity": cap, "batch": b,
                "prefill_seconds": t1 - t0, "decode_seconds": t2 - t1,
                "tokens_per_second": stats["tokens_generated"] / max(t2 - t1, 1e-9),
                "core_step_calls_per_token": stats["core_step_calls"] * b / max(stats["tokens_generated"], 1)})
  return api.GenerateResult(api.collect_tokens(out.tokens, lengths0, out.n_new), stats)
