"""The one token-tree verifier: a static tree of K candidate nodes per request, checked in ONE full-depth pass.

A tree (`Tree`, per request [B, K]): node 0 is the last committed token (at position p0 = length - 1, whose
entries are not in the cache yet), every other node a candidate continuation with `parent` < its own index
(topological order), `depth` = distance to node 0 and `valid` (padding nodes are False). Any drafter (the
loop's own depth-d1 readout, n-grams, heads, a draft model) only has to produce one.

Verification (`verify_round`):
1. `normalize`: validity is inherited from the parent, duplicate siblings are merged (a child of a
   duplicate moves under the first copy), and the ancestor-or-self mask anc [B, K, K] is built by
   ceil(log2(max_depth + 1)) pointer-jumping doublings `anc |= anc[jump]; jump = jump[jump]`.
2. `tree_pass`: all K nodes run through the whole looped model at once (prelude, R core steps, coda, head) at
   positions p0 + depth, attending to the committed prefix in the cache plus (as the queries' own segment,
   under anc) their ancestors. The pass only READS the cache; every node's entries come back as arrays.
3. `accept`: the target's token y_i is drawn at every node i from process_logits(p_i) with the key the
   autoregressive decoder uses at that absolute position (request, p0 + depth_i + 1, PURPOSE_AR; greedy:
   argmax). A node is accepted iff each node on its path from the root carries the draw of its parent; the
   accepted nodes form one path (siblings are distinct), and the emitted tokens are the path's tokens plus
   the draw at its last node. Those are exactly AR's own draws, so sampled output is token-identical to AR's
   for the same seed, request ids and settings (deterministic drafts only: the tree must not depend on
   this round's draws).
4. `write_path`: the accepted path's entries (every slot: prelude, R core steps, each coda readout) are
   gathered out of the K nodes and written at positions p0..p0 + n_acc with one in-place scatter per buffer,
   ordered after every read of the pass. Nothing else of the tree reaches the cache, so there is nothing to
   roll back and no cache-sized copy.
"""

from __future__ import annotations

from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import common
from loopspec_jax.decoding import sampling
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_jax.parallel.logical import axes_field


@flax.struct.dataclass
class Tree:
  """A static token tree per request (see the module docstring); all [B, K]."""

  tokens: jax.Array  # int32; tokens[:, 0] = the last committed token
  parent: jax.Array  # int32; parent[:, 0] = 0, parent[:, i] < i
  depth: jax.Array  # int32; depth[:, 0] = 0, depth[:, i] = depth[:, parent] + 1
  valid: jax.Array  # bool; valid[:, 0] = True


@flax.struct.dataclass
class TreeState:
  """The loop state of every tree decoder (explicit pytree, static shapes). `extra`: a drafter's own state
  (None for tree self-speculation)."""

  cache: kvcache.KVCache  # committed prefix, group 1
  tokens: jax.Array = axes_field("batch", "length")  # [B, T]
  length: jax.Array = axes_field("batch")  # [B]
  n_new: jax.Array = axes_field("batch")  # [B]
  done: jax.Array = axes_field("batch")  # [B]
  rounds: jax.Array = axes_field("batch")  # [B] verify passes per request
  accepted: jax.Array = axes_field("batch")  # [B] draft nodes accepted (and committed)
  nodes: jax.Array = axes_field("batch")  # [B] valid draft nodes verified (root excluded)
  iterations: jax.Array = axes_field()  # [] rounds of the batched loop
  extra: Any = None


def fresh_state(cache, tokens, lengths, extra=None) -> TreeState:
  return TreeState(cache=cache, **common.fresh_counters(tokens, lengths, "rounds", "accepted", "nodes"), extra=extra)


# ---------------------------------------------------------------------------------------------------
# Tree structure (pure, per request; vmap over the batch)
# ---------------------------------------------------------------------------------------------------
def doublings(max_depth: int) -> int:
  """Pointer-jumping steps whose reach 2^n exceeds max_depth: ceil(log2(max_depth + 1))."""
  return max(int(max_depth), 1).bit_length()


def ancestor_mask(parent, max_depth: int):
  """anc [K, K] bool: anc[i, j] iff j is i or an ancestor of i, for parent [K] (parent[0] = 0).

  After n steps of `anc |= anc[jump]; jump = jump[jump]` (anc = eye, jump = parent at the start), anc covers
  ancestors closer than 2^n and jump is the 2^n-th ancestor (saturating at the root)."""
  k = parent.shape[-1]
  anc = jnp.eye(k, dtype=bool)
  jump = parent
  for _ in range(doublings(max_depth)):
    anc = anc | anc[jump]
    jump = jump[jump]
  return anc


def merge_duplicates(tokens, parent, valid, max_depth: int):
  """(parent, valid) [K] with duplicate siblings merged: a valid node whose (canonical parent, token) equals an
  earlier valid node's is made invalid and its children move under that earlier node. Invalid nodes' subtrees
  are invalid. Level by level: after pass d every node of depth <= d knows its canonical index."""
  k = tokens.shape[-1]
  idx = jnp.arange(k)
  valid = jnp.all(jnp.where(ancestor_mask(parent, max_depth), valid[None, :], True), axis=1)
  canon = idx
  for _ in range(max(int(max_depth), 1)):
    cp = canon[parent]
    same = (cp[:, None] == cp[None, :]) & (tokens[:, None] == tokens[None, :]) & valid[None, :]
    same = same & (idx[None, :] <= idx[:, None]) & (idx[None, :] > 0)
    canon = jnp.where(valid & (idx > 0), jnp.argmax(same, axis=1), idx)
  return jnp.where(idx > 0, canon[parent], 0), valid & (canon == idx)


def normalize(tree: Tree, max_depth: int):
  """(tree with duplicates merged, anc [B, K, K] over valid nodes). Invalid nodes attend to themselves only."""

  def one(tokens, parent, valid):
    parent, valid = merge_duplicates(tokens, parent, valid, max_depth)
    anc = ancestor_mask(parent, max_depth) & valid[None, :]
    return parent, valid, anc | jnp.eye(tokens.shape[-1], dtype=bool)

  parent, valid, anc = jax.vmap(one)(tree.tokens, tree.parent, tree.valid)
  return tree.replace(parent=parent, valid=valid), anc


def accept(tree: Tree, anc, y, max_depth: int):
  """The accepted path for target draws y [B, K] (the target's token after each node).

  Node i > 0 matches iff it is valid and tokens[i] == y[parent[i]]; it is accepted iff every node on its path
  matches. Returns (n_acc [B] accepted draft nodes, path [B, max_depth + 1] node index at each depth (0 past
  n_acc), next token [B] = y at the last accepted node)."""
  b, k = tree.tokens.shape
  match = (tree.tokens == jnp.take_along_axis(y, tree.parent, axis=1)) & tree.valid
  match = match.at[:, 0].set(True)
  acc = jnp.all(jnp.where(anc, match[:, None, :], True), axis=2) & tree.valid  # [B, K]
  n_acc = jnp.max(jnp.where(acc, tree.depth, 0), axis=1)
  at = acc[:, None, :] & (tree.depth[:, None, :] == jnp.arange(max_depth + 1)[None, :, None])  # [B, D+1, K]
  path = jnp.sum(jnp.where(at, jnp.arange(k)[None, None, :], 0), axis=2).astype(jnp.int32)
  last = jnp.take_along_axis(path, n_acc[:, None], axis=1)[:, 0]
  return n_acc.astype(jnp.int32), path, jnp.take_along_axis(y, last[:, None], axis=1)[:, 0]


# ---------------------------------------------------------------------------------------------------
# The verify pass and the path write
# ---------------------------------------------------------------------------------------------------
def tree_pass(params, cache, layout, tree: Tree, anc, p0, readouts: tuple, cfg: ModelConfig, noise=None, features=()):
  """All K nodes through prelude, R core steps and the readouts in one batched pass; reads the cache only.

  readouts: ((depth, coda index), ...) ascending, the last at depth R (its logits are returned); each runs
  the coda at that depth (its entries are needed for readouts there in later rounds). Returns (logits
  [B, K, V] float32, entries {"pre": (k, v) [Lp, B, K, KV, D], "core": [(first step, k, v) [n, Lc, B, K,
  KV, D] per run of steps between readouts] (kept apart: a concatenation would copy them),
  "coda": {index: (k, v) [Lcd, B, K, KV, D]}}, the last float output (orders the writes after the reads)).
  `features` (a drafter's readout, e.g. EAGLE's): "hidden" (the final hidden state at R, before the final
  norm), "final" (after it: what the LM head reads, Medusa's input) and / or recurrent depths whose states s_d to return; entries["features"] holds them [B, K, E] each.
  """
  b, k = tree.tokens.shape
  t = cache.length
  pos = p0[:, None] + tree.depth
  mask = jnp.broadcast_to(jnp.arange(t)[None, None, :] < p0[:, None, None], (b, k, t))
  e, pk, pv = M.pre(params, tree.tokens, pos, anc, kvcache.prelude_ctx(cache, mask), cfg)
  s = M.initial_state(e, cfg, noise)

  def step(s, i):
    s, kk, vv = M.core_step(params, s, e, pos, anc, kvcache.core_ctx(cache, layout, i, mask), cfg)
    return s, (kk, vv)

  core, coda, first, logits, feats = [], {}, 0, None, {}
  state_depths = {f for f in features if not isinstance(f, str)}
  ridx_of = dict((d, i) for d, i in readouts)
  for depth in sorted(set(ridx_of) | {d for d in state_depths if d <= max(ridx_of)}):
    if depth > first:
      s, (kk, vv) = jax.lax.scan(step, s, jnp.arange(first, depth))
      core.append((first, kk, vv))
      first = depth
    if depth in state_depths:
      feats[depth] = s
    ridx = ridx_of.get(depth)
    if ridx is not None and (depth == cfg.recurrence or layout.n_coda):
      logits, ck, cv, hidden = M.post_hidden(params, s, pos, anc, kvcache.coda_ctx(cache, ridx, mask), cfg)
      coda[ridx] = (ck, cv)
      if depth == cfg.recurrence and "hidden" in features:
        feats["hidden"] = hidden
      if depth == cfg.recurrence and "final" in features:
        feats["final"] = M.final_features(params, hidden, cfg)
  if first != cfg.recurrence or readouts[-1][0] != cfg.recurrence:
    raise ValueError(f"the last readout of a tree pass must be at R={cfg.recurrence}, got {readouts}")
  return logits, {"pre": (pk, pv), "core": core, "coda": coda, "features": feats}, logits


def gather_nodes(x, path):
  """x [..., B, K, KV, D] -> [..., B, P, KV, D]: the entries of nodes path [B, P]."""
  idx = path.reshape((1,) * (x.ndim - 4) + path.shape + (1, 1))
  return jnp.take_along_axis(x, idx, axis=x.ndim - 3)


def write_path(cache, layout, entries, path, p0, n_acc, after):
  """Writes the accepted path's entries (node path[:, d] at position p0 + d for d <= n_acc) into every
  buffer: one scatter per buffer, ordered after the pass's reads (`after`: its last float output)."""
  t = cache.length
  d = jnp.arange(path.shape[1])[None, :]
  pos = jnp.where(d <= n_acc[:, None], p0[:, None] + d, t)
  pos = kvcache.ordered(pos, after, t)
  g = lambda kv: (gather_nodes(kv[0], path), gather_nodes(kv[1], path))
  pk, pv = g(entries["pre"])
  if pk.shape[0]:
    cache = kvcache.write_prelude(cache, pk, pv, pos)
  for first, kk, vv in entries["core"]:
    ck, cv = g((kk, vv))
    cache = kvcache.write_core_steps(cache, layout, first + jnp.arange(ck.shape[0]), ck, cv, pos)
  for ridx, kv in entries["coda"].items():
    ak, av = g(kv)
    if ak.shape[0]:
      cache = kvcache.write_coda(cache, ridx, ak, av, pos)
  return cache


def target_draws(logits, tree: Tree, p0, sp: common.SamplingParams, greedy: bool):
  """y [B, K]: the target's token after every node, AR's draw at that absolute position (see `accept`)."""
  if greedy:
    return sampling.greedy_token(logits)
  probs = common.row_distributions(logits, sp)
  key = lambda rid, p: sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_AR)
  keys = jax.vmap(lambda rid, ps: jax.vmap(lambda p: key(rid, p))(ps))(sp.request_ids, p0[:, None] + tree.depth + 1)
  return jax.vmap(jax.vmap(sampling.sample_token))(keys, probs)


def verify_round(
    params,
    st: TreeState,
    sp,
    tree: Tree,
    *,
    cfg,
    layout,
    readouts,
    max_depth: int,
    greedy: bool,
    random_init: bool,
    features: tuple = (),
    last_feature: Optional[str] = None,
):
  """Verify one tree per request (`params` in the decode form), write the accepted path, commit, count.

  Returns (state, y [B, K] the target's draw after every node, n_committed [B]) (a drafter may learn from y:
  lookahead's Jacobi update). With `features` (see `tree_pass`) a fourth item: the accepted path's features
  [B, max_depth + 1, E * len(features)] (node path[:, d] at depth d, in the order of `features`; rows past
  n_acc are the root's). With `last_feature` ("final": Medusa's input, "hidden":
  an MTP head's), a last item: that feature [B, E] of the last accepted node, whose LM-head draw is the
  round's bonus token."""
  p0 = st.length - 1
  tree, anc = normalize(tree, max_depth)
  noise = common.state_noise(sp, p0[:, None] + tree.depth, cfg) if random_init else None
  wanted = tuple(features) + ((last_feature,) if last_feature and last_feature not in features else ())
  logits, entries, after = tree_pass(params, st.cache, layout, tree, anc, p0, readouts, cfg, noise, wanted)
  y = target_draws(logits, tree, p0, sp, greedy)
  n_acc, path, nxt = accept(tree, anc, y, max_depth)
  cache = write_path(st.cache, layout, entries, path, p0, n_acc, after)
  drafts = jnp.take_along_axis(tree.tokens, path[:, 1:], axis=1)  # [B, max_depth]
  live = ~st.done
  n_nodes = jnp.sum(tree.valid, axis=1) - 1
  upd = common.commit_round(st, drafts, n_acc, nxt, sp)
  n_commit = upd["length"] - st.length
  st = st.replace(cache=cache, **upd, nodes=st.nodes + jnp.where(live, n_nodes, 0))
  out = (st, y, n_commit)
  if features:
    feats = jnp.concatenate([entries["features"][f] for f in features], axis=-1)  # [B, K, F]
    out += (jnp.take_along_axis(feats, path[:, :, None], axis=1),)
  if last_feature:
    last = jnp.take_along_axis(path, n_acc[:, None], axis=1)  # [B, 1]
    out += (jnp.take_along_axis(entries["features"][last_feature], last[:, :, None], axis=1)[:, 0],)
  return out


def tree_figures(stats) -> dict:
  """Figures of a tree run: tau = tokens per full-depth verify pass, accepted draft nodes per pass, nodes
  verified per pass, acceptance per verified node, drafting's share of the row layer calls (settings
  `draft_layer_calls` / `verify_layer_calls` per round)."""
  st, rounds = stats.settings, stats.count("rounds")
  out = stats.pass_figures("nodes", rounds * st.get("draft_layer_calls", 0), rounds * st.get("verify_layer_calls", 1))
  per_round = lambda name: stats.count(name) / max(rounds, 1)
  return dict(
      out, tau=out["tokens_per_pass"], accepted_per_pass=per_round("accepted"), nodes_per_pass=per_round("nodes")
  )
