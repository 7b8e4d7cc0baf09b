"""One decode loop for every tree and chain drafter: a `Drafter` says how a round drafts and learns, `run` does the rest.

Every tree decoder (self-speculation, lookahead, lookup, draft trees, Medusa, EAGLE, MTP, DFlash) runs the same
rounds until every request is done (`common.loop_until_done`, one lax.while_loop on device):
1. `draft(params, st, sp) -> (st, proposal)`: the round's proposal (a `tv.Tree`, or what `verify` reads) from
   the committed state and the drafter's own state `st.extra` (which drafting may advance: a drafter's KV cache);
2. `verify(params, st, sp, proposal, **settings) -> (state, *outputs)`: one full-depth pass, the accepted path
   written and committed (default `tv.verify_round`: AR's draws at every node, so greedy output equals AR's);
3. `after_verify(st, new, outputs) -> extra`: the drafter's state after verification (e.g. the feature of the
   last accepted node); with `mask_done` the loop keeps the old state in rows already done before the round.
Each decoder's jitted `decode_loop` (its static arguments: one compile per configuration) builds its `Drafter`
from closures over those static settings and calls `run` inside its trace, so the drafter needs no hashing.
The initial states drafters share are here too: `initial_state` (no state of the drafter's own) and
`feature_state` (`LastFeature`: the last accepted node's feature, Medusa's and MTP's).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import flax.struct
import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import specinfer
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import entry
from loopspec_jax.parallel.logical import axes_field


@dataclasses.dataclass(frozen=True)
class Drafter:
  """How one decoder drafts and learns (module docstring). readouts: ((depth, coda index), ...) of the verify
  pass (None: one readout at R); max_depth: the deepest draft level; features / last_feature: what the verify
  pass hands back (see `tv.verify_round`); prime(params, state, sp) -> extra: the drafter's state before the
  first round (None: the initial state's)."""

  draft: Callable
  max_depth: int
  readouts: Optional[tuple] = None
  features: tuple = ()
  last_feature: Optional[str] = None
  prime: Optional[Callable] = None
  verify: Callable = tv.verify_round
  after_verify: Optional[Callable] = None
  mask_done: bool = True


def keep_live(live, new, old):
  """Every leaf of `new` where the row is live [B], of `old` elsewhere (leaves [B, ...])."""
  pick = lambda n, o: jnp.where(live.reshape(live.shape + (1,) * (n.ndim - 1)), n, o)
  return jax.tree_util.tree_map(pick, new, old)


def verify_sampled(params, st, sp, proposal, *, replacement: bool, rule: str, greedy, features, last_feature, **kw):
  """`specinfer.verify_round` for a proposal (tree, q) of sampled drafts, as a `Drafter.verify` (a 1-tuple)."""
  del greedy, features, last_feature  # sampled drafts only: no features handed back
  tree, q = proposal
  return (specinfer.verify_round(params, st, sp, tree, q, replacement=replacement, rule=rule, **kw),)


def sampled_verify(drafts: str) -> Callable:
  """The `Drafter.verify` of sampled drafts: drafts "sample" / "distinct" (children drawn with / without
  replacement, multi-step verification) or "kseq" (i.i.d. children, K-SEQ)."""
  rule = "kseq" if drafts == "kseq" else "specinfer"
  return functools.partial(verify_sampled, replacement=drafts != "distinct", rule=rule)


def run(
    params, state: tv.TreeState, sp: common.SamplingParams, drafter: Drafter, *, cfg: ModelConfig, greedy, random_init
):
  """Rounds of (draft, one full-depth verify pass, the drafter's update) until every request is done; call it
  inside a jitted decode loop (params in the checkpoint form: prepared here)."""
  params = M.prepare_params(params, cfg)
  readouts = drafter.readouts or ((cfg.recurrence, 0),)
  settings = dict(
      cfg=cfg,
      layout=kvcache.CacheLayout.of(cfg, len(readouts)),
      readouts=readouts,
      max_depth=drafter.max_depth,
      greedy=greedy,
      random_init=random_init,
      features=drafter.features,
      last_feature=drafter.last_feature,
  )
  if drafter.prime is not None:
    state = state.replace(extra=drafter.prime(params, state, sp))

  def round_(st: tv.TreeState) -> tv.TreeState:
    st, proposal = drafter.draft(params, st, sp)
    new, *outputs = drafter.verify(params, st, sp, proposal, **settings)
    if drafter.after_verify is None:
      return new
    extra = drafter.after_verify(st, new, tuple(outputs))
    return new.replace(extra=keep_live(~st.done, extra, st.extra) if drafter.mask_done else extra)

  return common.loop_until_done(round_, state, sp)


@entry.program(entry.INIT)
def initial_state(cache, tokens, lengths, sp: common.SamplingParams, *, cfg: ModelConfig) -> tv.TreeState:
  """The loop state of a drafter with no state of its own (self-speculation, lookup trees)."""
  del sp, cfg
  return tv.fresh_state(cache, tokens, lengths)


@flax.struct.dataclass
class LastFeature:
  """The state of a drafter that drafts from one feature per request (Medusa, MTP): feature [B, E] float32,
  the feature of the last accepted node (`Drafter.last_feature`); ready [B]: it has been computed."""

  feature: jax.Array = axes_field("batch", None)
  ready: jax.Array = axes_field("batch")


@entry.program(entry.INIT)
def feature_state(cache, tokens, lengths, sp: common.SamplingParams, *, cfg: ModelConfig) -> tv.TreeState:
  """The loop state of a `LastFeature` drafter: a zero feature, not ready (before the first round)."""
  del sp
  b = tokens.shape[0]
  extra = LastFeature(jnp.zeros((b, cfg.hidden_size), jnp.float32), jnp.zeros((b,), bool))
  return tv.fresh_state(cache, tokens, lengths, extra)


def keep_last_feature(st: tv.TreeState, new, outputs) -> LastFeature:
  """`Drafter.after_verify` of a `LastFeature` drafter: the feature of the last accepted node, now ready."""
  del new
  return LastFeature(outputs[-1].astype(jnp.float32), jnp.ones_like(st.extra.ready))


def per_request(st: tv.TreeState) -> dict:
  """The per-request counts of a tree decoder's statistics [B] each: rounds, accepted draft nodes, verified
  nodes, tokens first emitted (the accepted drafts) and restarts (the rest: a round's bonus tokens)."""
  return {
      "rounds": st.rounds,
      "accepted": st.accepted,
      "nodes": st.nodes,
      "first": st.accepted,
      "restart": st.n_new - st.accepted,
  }


def full_depth_figures(stats) -> dict:
  """`tv.tree_figures` of a drafter that runs no recurrent steps of its own: tokens per R core steps = tau."""
  out = tv.tree_figures(stats)
  out["tokens_per_r_steps"] = out["tau"]
  return out
