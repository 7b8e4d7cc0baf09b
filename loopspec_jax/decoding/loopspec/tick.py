"""One LoopSpec tick as a composition of pure phases (the body of the decode `lax.while_loop`).

  advance    pre for the lanes at depth 0, d1 core steps over every lane, post (coda + LM head) on the
             lanes at an endpoint depth (d1, d2, R) only; speculative KV written under stable lane ids
  verify     the root (the one lane at depth R) against its first / second proposal (cascade)
  commit     the root's entries move into the committed prefix; the verified token is appended
  prune      keep only the kept child's subtree
  draft      x1 at d1, the gated residual x2 at d2 (greedy: argmax, no keys and no distributions)
  spawn      children into the new stage's rows (`lanes.allocate_lanes`), or a restart at depth 0
  count      per-request counters

Shapes: B requests, G = R / d1 stages of W lanes (N = G * W), E hidden, V vocabulary, T cache positions.
Random draws use per-(request, position, purpose) keys (`sampling.request_key`), so outputs do not depend
on batch layout or scheduling.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import common
from loopspec_jax.decoding import sampling
from loopspec_jax.decoding import verify
from loopspec_jax.decoding.loopspec import lanes as L
from loopspec_jax.decoding.loopspec import second as second_lib
from loopspec_jax.decoding.loopspec.state import (
    LaneTable,
    LoopSpecState,
    LoopSpecStats,
    PipelineShape,
    PROP_FIRST,
    PROP_RESTART,
    PROP_SECOND,
)
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import entry


class Advanced(NamedTuple):
  """What `advance` returns: states in stage order, endpoint logits in readout order, the new KV stores."""

  s: jax.Array  # [B, N, E]
  e: jax.Array  # [B, N, E]
  logits: jax.Array  # [B, nR * W, V] float32: rows of readout r at r * W .. r * W + W - 1
  spec: object  # SpecKV


class Verified(NamedTuple):
  has_root: jax.Array  # [B] bool
  root: jax.Array  # [B] stable id of the root
  y: jax.Array  # [B] committed token
  stage: jax.Array  # [B] 1: x1 accepted, 2: x2 accepted, 0: neither (residual / argmax)
  gate: jax.Array  # [B] bool: the root had a second proposal (verified when x1 is rejected)
  q_read: jax.Array = None  # [B] float, sampled only: depends on the root's q1/q2 rows (orders later writes)


class Drafts(NamedTuple):
  x1: jax.Array  # [B, W] proposals of the lanes at d1 (group 0)
  gate: jax.Array  # [B, W] open gates of the lanes at d2 (all False without d2)
  x2: jax.Array  # [B, W]


def advance(
    params, st: LoopSpecState, sp: common.SamplingParams, cfg: ModelConfig, shape: PipelineShape, random_init: bool
) -> Advanced:
  """Moves every lane d1 recurrent steps deeper: pre (group 0), d1 core steps, post (endpoints).

  Rows are in group order (`lanes.group_rows`). Only the first c columns of every stage are computed, c the
  narrowest width of `shape.ladder` holding every live lane (`lanes.live_columns`; the other columns hold
  no live lane), one `lax.switch` branch per width: a tick costs G * c rows of compute whatever W is. The
  branches only read the carried buffers and return fixed-shape results (rows outside the c columns: zeros,
  or the old states); the speculative stores are written after the switch, so XLA updates them in place.
  """
  ln, spec = st.lanes, st.spec
  g, w = shape.n_groups, shape.width
  n = ln.alive.shape[1]
  rows = L.group_rows(st.iterations, g, w)  # [N] stable id of each group-order row
  widths = shape.ladder
  branches = [functools.partial(compute_cols, params, st, cfg, shape.at_cols(c)) for c in widths]
  s_go, e_go = ln.s[:, rows], ln.e[:, rows]
  # Fresh lanes' initial-state noise, drawn once per tick outside the branches (each branch reads its c columns).
  noise = common.state_noise(sp, ln.pos[:, rows[:w]], cfg) if random_init else None
  if len(widths) == 1:
    e0, pre_kv, s, core_kv, logits, coda_kv = branches[0](s_go, e_go, noise)
  else:
    branch = L.ladder_index(L.live_columns(ln.alive, w), widths)
    e0, pre_kv, s, core_kv, logits, coda_kv = jax.lax.switch(branch, branches, s_go, e_go, noise)
  fresh = rows[:w]
  prelude = spec.prelude
  for l in range(pre_kv[0].shape[0]):
    prelude = L.write_rows(prelude, l, None, kvcache.ordered(fresh, e0, n), pre_kv[0][l], pre_kv[1][l])
  e = e_go.at[:, :w].set(e0.astype(ln.e.dtype))
  core = spec.core
  row_group = jnp.arange(n) // w
  for i, (k, v) in enumerate(zip(*core_kv)):
    core = L.write_rows(core, i, row_group, kvcache.ordered(rows, s, n), k, v)
  ends = jnp.asarray([gr * w + i for gr in shape.endpoint_groups for i in range(w)], jnp.int32)
  coda = spec.coda
  readout_of_row = jnp.repeat(jnp.arange(len(shape.readouts), dtype=jnp.int32), w)
  for l in range(coda_kv[0].shape[0]):
    coda = L.write_rows(coda, l, readout_of_row, kvcache.ordered(rows[ends], logits, n), coda_kv[0][l], coda_kv[1][l])
  back = rows  # the row permutation is an involution: the same gather returns to stage order
  new_spec = spec.replace(prelude=prelude, core=core, coda=coda)
  return Advanced(s=s[:, back], e=e[:, back], logits=logits, spec=new_spec)


def widen(x, axis: int, parts: int, cols: int, width: int):
  """x's axis `axis` of parts * cols rows (part p's rows at p * cols ..) padded with zeros to parts * width."""
  if cols == width:
    return x
  sh = x.shape
  y = x.reshape(sh[:axis] + (parts, cols) + sh[axis + 1 :])
  pad = [(0, 0)] * (axis + 1) + [(0, width - cols)] + [(0, 0)] * (x.ndim - axis - 1)
  return jnp.pad(y, pad).reshape(sh[:axis] + (parts * width,) + sh[axis + 1 :])


def compute_cols(params, st: LoopSpecState, cfg: ModelConfig, shape: PipelineShape, s, e, noise):
  """The model compute of one tick on the first c = `shape.c` columns of every stage (a `lax.switch` branch).

  s, e [B, N, E] in group order; noise [B, W, E] the fresh lanes' initial-state noise (None: zero init).
  The speculative stores and the ancestry are read cut to those columns' ids (`lanes.id_columns`), so the reads and the rows both scale with c. Returns, padded to W columns: (e0
  [B, W, E], pre (k, v) [L, B, W, KV, D], s [B, N, E] (rows outside the columns unchanged), core (k, v) lists
  of [B, N, KV, D], logits [B, nR * W, V] float32, coda (k, v) [L, B, nR * W, KV, D]); padded rows are zeros,
  written under ids of dead lanes, which nothing reads."""
  ln, spec, cache = st.lanes, st.spec, st.cache
  g, w, c = shape.n_groups, shape.width, shape.c
  b = ln.alive.shape[0]
  rows = L.group_rows(st.iterations, g, w, c)  # [G * c]
  cut = lambda kv, axis: tuple(L.id_columns(x, g, w, c, axis) for x in kv)
  prefix_mask = jnp.arange(cache.length)[None, :] < (st.length - 1)[:, None]  # [B, T]
  anc = L.id_columns(ln.anc[:, rows], g, w, c, 2)  # [B, G * c rows, G * c ids]
  pos = ln.pos[:, rows]
  sub = lambda x: x.reshape((b, g, w) + x.shape[2:])[:, :, :c].reshape((b, g * c) + x.shape[2:])
  # pre: the c lanes of group 0 are exactly the lanes at depth 0.
  one = lambda kv: tuple(x[None] for x in kv)  # a single group: [1, B, KV, T or N, D]
  pre_ctx = lambda l: L.grouped_attend(
      one(cache.prelude[l]), one(cut(spec.prelude[l], 2)), prefix_mask, anc[:, :c], cfg
  )
  e0, pk, pv = M.pre(params, ln.token[:, rows[:c]], pos[:, :c], None, pre_ctx, cfg)
  s0 = M.initial_state(e0, cfg, None if noise is None else noise[:, :c])
  x = sub(s).at[:, :c].set(s0.astype(s.dtype))
  e_c = sub(e).at[:, :c].set(e0.astype(e.dtype))
  ks, vs = [], []
  for j in range(shape.d1):
    ctx = lambda l: L.grouped_attend(
        cache.core[j * cfg.n_core + l], cut(spec.core[j * cfg.n_core + l], 3), prefix_mask, anc, cfg
    )
    x, k, v = M.core_step(params, x, e_c, pos, None, ctx, cfg)
    ks += [widen(k[l], 1, g, c, w) for l in range(k.shape[0])]
    vs += [widen(v[l], 1, g, c, w) for l in range(v.shape[0])]
  # post on the endpoint rows only, each readout reading its own coda cache.
  n_r = len(shape.readouts)
  ends = jnp.asarray([gr * c + i for gr in shape.endpoint_groups for i in range(c)], jnp.int32)
  ctx = lambda l: L.grouped_attend(cache.coda[l], cut(spec.coda[l], 3), prefix_mask, anc[:, ends], cfg)
  logits, ck, cv = M.post(params, x[:, ends], pos[:, ends], None, ctx, cfg)
  if c < w:
    x = s.reshape((b, g, w) + s.shape[2:]).at[:, :, :c].set(x.reshape((b, g, c) + x.shape[2:])).reshape(s.shape)
  return (
      widen(e0, 1, 1, c, w),
      (widen(pk, 2, 1, c, w), widen(pv, 2, 1, c, w)),
      x,
      (ks, vs),
      widen(logits, 1, n_r, c, w),
      (widen(ck, 2, n_r, c, w), widen(cv, 2, n_r, c, w)),
  )


def distributions(logits, sp: common.SamplingParams):
  """The shared logits processing (temperature, top-k, top-p) of sampled decoding, [..., V] float32."""
  return common.row_distributions(logits, sp)


def lane_keys(sp: common.SamplingParams, pos, purpose):
  """Keys [B, S, 2] for the draws of lanes at positions pos [B, S] (the drawn token is at pos + 1)."""
  f = lambda rid, p: sampling.request_key(sp.base_key, rid, p + 1, purpose)
  return jax.vmap(lambda rid, ps: jax.vmap(lambda p: f(rid, p))(ps))(sp.request_ids, pos)


def verify_root(
    st: LoopSpecState, adv: Advanced, dist, sp: common.SamplingParams, shape: PipelineShape, greedy: bool
) -> Verified:
  """Cascade verification of the root, the one live lane at depth R (group G - 1).

  dist: the endpoint rows' processed distributions [B, nR * W, V] (None when greedy)."""
  ln = st.lanes
  g, w = shape.n_groups, shape.width
  b = ln.alive.shape[0]
  bi = jnp.arange(b)
  last = L.group_rows(st.iterations, g, w)[(g - 1) * w :]  # [W] ids of the lanes at depth R
  at_r = ln.alive[:, last] & ~st.done[:, None]
  has_root = jnp.any(at_r, axis=1)
  root_w = jnp.argmax(at_r, axis=1)
  root = last[root_w]
  row = (len(shape.readouts) - 1) * w + root_w
  x1, x2, gate = ln.x1[bi, root], ln.x2[bi, root], ln.gate[bi, root]
  q_read = None
  if greedy:  # the cascade on one-hot distributions: argmax matching
    y = sampling.greedy_token(adv.logits[bi, row])
    stage = jnp.where(y == x1, 1, jnp.where(gate & (y == x2), 2, 0))
  else:
    keys = jax.vmap(lambda rid, p: sampling.request_key(sp.base_key, rid, p + 1, sampling.PURPOSE_VERIFY))(
        sp.request_ids, ln.pos[bi, root]
    )
    q1, q2 = L.read_rows(ln.q1, root), L.read_rows(ln.q2, root)
    y, stage = jax.vmap(verify.verify_cascade)(keys, dist[bi, row], x1, q1, gate, x2, q2)
    q_read = q1[:, 0] + q2[:, 0]
  y, stage = y.astype(jnp.int32), stage.astype(jnp.int32)
  return Verified(has_root=has_root, root=root, y=y, stage=stage, gate=gate & has_root, q_read=q_read)


def commit(st: LoopSpecState, spec, ver: Verified, sp: common.SamplingParams):
  """The root's entries into the prefix at its position; y appended. Returns (cache, tokens, length, n_new,
  done); requests without a root this tick are unchanged."""
  b, t = st.tokens.shape
  bi = jnp.arange(b)
  root_pos = st.lanes.pos[bi, ver.root]
  # The commit index depends on y, i.e. on every read of this tick: the writes are ordered after them.
  cache = L.commit_entries(st.cache, spec, ver.root, jnp.where(ver.has_root & (ver.y >= 0), root_pos, t - 1))
  n_commit = ver.has_root.astype(jnp.int32)
  tokens, length, n_new, done, _ = common.commit_tokens(
      st.tokens, st.length, st.n_new, st.done, ver.y[:, None], n_commit, sp
  )
  return cache, tokens, length, n_new, done


def prune(ln: LaneTable, ver: Verified, done):
  """Which lanes survive: with a root, only the kept child's subtree; finished requests keep nothing.
  Returns (survive [B, N], kept_found [B])."""
  b, n = ln.alive.shape
  bi = jnp.arange(b)
  want = jnp.where(ver.stage == 1, PROP_FIRST, jnp.where(ver.stage == 2, PROP_SECOND, -1))
  is_child = ln.alive & (ln.parent == ver.root[:, None]) & (ln.prop == want[:, None]) & (ln.token == ver.y[:, None])
  kept_found = jnp.any(is_child, axis=1) & ver.has_root
  kept = jnp.argmax(is_child, axis=1)
  subtree = (jnp.arange(n)[None, :] == kept[:, None]) | ln.anc[bi, :, kept]
  survive = jnp.where(ver.has_root[:, None], subtree & kept_found[:, None], ln.alive) & ~done[:, None]
  return survive, kept_found


def draft(st: LoopSpecState, adv: Advanced, dist, sp: common.SamplingParams, shape: PipelineShape, greedy: bool, after):
  """x1 for the lanes now at d1 (group 0) and the gated second proposal for those at d2; stored under the
  lanes' ids. Returns (lanes with x1/q1/x2/q2/gate updated, Drafts of the two groups).

  Sampled: q1/q2 [B, N, V] are read (the root's rows in `verify_root`, the d2 lanes' q1 here) by one-hot
  dots, and the write indices depend on float values of those reads (`after`: `Verified.q_read`), so XLA
  updates both tables in place instead of copying them every tick."""
  ln = st.lanes
  n = ln.alive.shape[1]
  w = shape.width
  rows = L.group_rows(st.iterations, shape.n_groups, w)
  ids1 = rows[:w]
  lg1 = adv.logits[:, :w]
  ids2 = None if shape.d2 is None else rows[shape.endpoint_groups[1] * w :][:w]
  if greedy:
    x1 = sampling.greedy_token(lg1)
    ln = ln.replace(x1=ln.x1.at[:, ids1].set(x1))
  else:
    q1 = dist[:, :w]
    x1 = jax.vmap(jax.vmap(sampling.sample_token))(lane_keys(sp, ln.pos[:, ids1], sampling.PURPOSE_X1), q1)
    at1 = kvcache.ordered(ids1, after, n)
    if ids2 is not None:  # the second proposal reads the d2 lanes' q1 before this tick's q1 rows land
      keys = lane_keys(sp, ln.pos[:, ids2], sampling.PURPOSE_X2)
      q1_d2 = L.read_rows(ln.q1, ids2, shared=True)
      propose = functools.partial(second_lib.propose, second=shape.second, gate=shape.gate, min_mass=shape.gate_mass)
      gate, x2, q2 = jax.vmap(jax.vmap(propose))(keys, q1_d2, ln.x1[:, ids2], dist[:, w : 2 * w])
      at1 = kvcache.ordered(at1, q1_d2, n)
    ln = ln.replace(x1=ln.x1.at[:, ids1].set(x1), q1=ln.q1.at[:, at1].set(q1, mode="drop"))
  if shape.d2 is None:
    return ln, Drafts(x1=x1, gate=jnp.zeros_like(x1, bool), x2=x1)
  if greedy:
    gate, x2 = second_lib.propose_greedy(adv.logits[:, w : 2 * w], ln.x1[:, ids2], second=shape.second, gate=shape.gate)
    ln = ln.replace(x2=ln.x2.at[:, ids2].set(x2), gate=ln.gate.at[:, ids2].set(gate))
  else:
    q2_table = ln.q2.at[:, kvcache.ordered(ids2, after, n)].set(q2, mode="drop")
    ln = ln.replace(x2=ln.x2.at[:, ids2].set(x2), q2=q2_table, gate=ln.gate.at[:, ids2].set(gate))
  return ln, Drafts(x1=x1, gate=gate, x2=x2)


def spawn(
    st: LoopSpecState,
    ln: LaneTable,
    survive,
    kept_found,
    ver: Verified,
    dr: Drafts,
    length_before,
    done,
    shape: PipelineShape,
):
  """New lanes into the new stage (the rows the root's stage frees): children of surviving proposers, first
  proposals first; or, when no child was kept, a restart carrying y from depth 0. Returns (lanes,
  skipped_first, skipped_second, spawns asked)."""
  g, w = shape.n_groups, shape.width
  b, n = survive.shape
  bi = jnp.arange(b)[:, None]
  rows = L.group_rows(st.iterations, g, w)
  ids1 = rows[:w]
  ids2 = rows[shape.endpoint_groups[1] * w :][:w] if shape.d2 is not None else ids1
  new_ids = rows[(g - 1) * w :]  # the root's stage: free after this tick's verification
  ok = lambda ids: survive[:, ids] & (ln.pos[:, ids] + 1 < st.limit[:, None])
  want1 = ok(ids1)
  want2 = ok(ids2) & dr.gate if shape.d2 is not None else jnp.zeros_like(want1)
  assigned, src, granted1, granted2 = L.allocate_lanes(want1, want2)
  from_second = src >= w
  parent = jnp.where(from_second, ids2[src % w], ids1[src % w])  # [B, W]
  child_tok = jnp.where(from_second, dr.x2[bi, src % w], dr.x1[bi, src % w])
  restart = ver.has_root & ~kept_found & ~done
  rs = restart[:, None] & (jnp.arange(w)[None, :] == 0)
  new = assigned | rs
  anc = ln.anc & survive[:, :, None] & survive[:, None, :]
  par_anc = anc[bi, parent] | (jnp.arange(n)[None, None, :] == parent[..., None])  # [B, W, N]
  anc = anc.at[:, new_ids].set(jnp.where(assigned[..., None], par_anc, False))
  put = lambda old, val: old.at[:, new_ids].set(jnp.where(new, val, old[:, new_ids]))
  gate = ln.gate.at[:, ids2].set(ln.gate[:, ids2] & (granted2 | ~want2)) if shape.d2 is not None else ln.gate
  lanes = ln.replace(
      alive=put(survive, new),
      anc=anc,
      pos=put(ln.pos, jnp.where(assigned, ln.pos[bi, parent] + 1, length_before[:, None])),
      token=put(ln.token, jnp.where(assigned, child_tok, ver.y[:, None])),
      parent=put(ln.parent, jnp.where(assigned, parent, -1)),
      prop=put(ln.prop, jnp.where(assigned, jnp.where(from_second, PROP_SECOND, PROP_FIRST), PROP_RESTART)),
      gate=put(gate, False),
      x1=put(ln.x1, -1),
      x2=put(ln.x2, -1),
  )
  skipped1 = jnp.sum(want1 & ~granted1, axis=1)
  skipped2 = jnp.sum(want2 & ~granted2, axis=1)
  demand = jnp.sum(want1, axis=1) + jnp.sum(want2, axis=1)
  return lanes, skipped1, skipped2, demand


def count(ss: LoopSpecStats, st: LoopSpecState, ver: Verified, source, at_d2, opens, skipped1, skipped2, demand, cols):
  """Per-request counters after one tick. The release's split counts decode tokens only (a request's commits
  after its first): each rejection of x1 ends as second-skip (no x2), second-accept or second-reject."""
  active = ~st.done
  live = jnp.sum(st.lanes.alive & active[:, None], axis=1)
  c = lambda x: x.astype(jnp.int32)
  hr = ver.has_root
  rej = hr & (st.n_new > 0) & (ver.stage != 1)
  return LoopSpecStats(
      ticks=ss.ticks + c(active),
      first=ss.first + c(hr & (source == PROP_FIRST)),
      second=ss.second + c(hr & (source == PROP_SECOND)),
      restart=ss.restart + c(hr & (source == PROP_RESTART)),
      last_source=jnp.where(hr, source, ss.last_source),
      reject_first=ss.reject_first + c(hr & (ver.stage != 1)),
      gate_evals=ss.gate_evals + jnp.sum(at_d2, axis=1),
      gate_opens=ss.gate_opens + jnp.sum(opens, axis=1),
      skipped_first=ss.skipped_first + skipped1,
      skipped_second=ss.skipped_second + skipped2,
      live_sum=ss.live_sum + live,
      live_max=jnp.maximum(ss.live_max, live),
      demand_max=jnp.maximum(ss.demand_max, demand),
      cols_sum=ss.cols_sum + c(active) * cols,
      decode_reject_first=ss.decode_reject_first + c(rej),
      second_verify=ss.second_verify + c(rej & ver.gate),
      second_accept=ss.second_accept + c(rej & (ver.stage == 2)),
      first_token_ticks=ss.first_token_ticks + c(active & (st.n_new == 0)),
  )


def commit_source(ver: Verified, kept_found, newly_done):
  """Where a commit's next lane came from; a commit that finishes its request counts by its stage."""
  by_stage = jnp.where(ver.stage == 1, PROP_FIRST, jnp.where(ver.stage == 2, PROP_SECOND, PROP_RESTART))
  kept = jnp.where(kept_found, by_stage, PROP_RESTART)
  return jnp.where(newly_done, by_stage, kept)


def make_tick(
    params, sp: common.SamplingParams, cfg: ModelConfig, shape: PipelineShape, greedy: bool, random_init: bool
):
  """The while_loop body: one tick of the LoopSpec pipeline for every request (`params` in decode form)."""
  w = shape.width

  def tick(st: LoopSpecState) -> LoopSpecState:
    adv = advance(params, st, sp, cfg, shape, random_init)
    dist = None if greedy else distributions(adv.logits, sp)  # one filtering pass over the endpoint rows
    ver = verify_root(st, adv, dist, sp, shape, greedy)
    cache, tokens, length, n_new, done = commit(st, adv.spec, ver, sp)
    survive, kept_found = prune(st.lanes, ver, done)
    ln, dr = draft(st, adv, dist, sp, shape, greedy, ver.q_read)
    ln = ln.replace(s=adv.s, e=adv.e)
    lanes, skipped1, skipped2, demand = spawn(st, ln, survive, kept_found, ver, dr, st.length, done, shape)
    rows = L.group_rows(st.iterations, shape.n_groups, w)
    if shape.d2 is not None:
      at_d2 = st.lanes.alive[:, rows[shape.endpoint_groups[1] * w :][:w]] & ~st.done[:, None]
    else:
      at_d2 = jnp.zeros((st.lanes.alive.shape[0], w), bool)
    source = commit_source(ver, kept_found, done & ~st.done)
    # the ladder width each request's own lanes need: per request, independent of what it is batched with
    cols = L.ladder_width(L.request_columns(st.lanes.alive, w), shape.ladder)
    stats = count(st.stats, st, ver, source, at_d2, at_d2 & dr.gate, skipped1, skipped2, demand, cols)
    return LoopSpecState(
        cache=cache,
        spec=adv.spec,
        lanes=lanes,
        stats=stats,
        tokens=tokens,
        length=length,
        n_new=n_new,
        done=done,
        limit=st.limit,
        iterations=st.iterations + 1,
    )

  return tick


@entry.program(entry.LOOP, donate_argnames=("state",))
def decode_loop(
    params,
    state: LoopSpecState,
    sp: common.SamplingParams,
    *,
    cfg: ModelConfig,
    shape: PipelineShape,
    greedy: bool,
    random_init: bool,
):
  """Ticks until every request is done; the loop never returns to the host."""
  tick = make_tick(M.prepare_params(params, cfg), sp, cfg, shape, greedy, random_init)
  return common.loop_until_done(tick, state, sp)
