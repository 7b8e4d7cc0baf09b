"""EAGLE on the loop: a token tree drafted by an EAGLE head (`heads/eagle.py`) on the target's own features,
verified by the one tree verifier (`tree/verify.py`).

State: besides the target's cache, the head's own key/value cache [B, KV, T, D] (its entry at position j was
computed from (x_{j+1}, g_j) with the target's true feature g_j) and the pending rows: the target's raw
features of positions q0 .. length - 2 (at most gamma + 1, the accepted path of the last verify pass) whose head
entries are not cached yet.

One round per request (position p0 = length - 1 holds the root, the last committed token):
1. level 0 runs the pending rows through the head in one call (causal among themselves, on top of the head
   cache), writes their entries, and reads the last one out: h_{p0} predicts f_{p0}, and its top-`branch`
   tokens under the target's final norm and LM head are the depth-1 candidates;
2. levels 1 .. gamma - 1 feed each frontier candidate with its parent's output h (EAGLE's autoregression on
   its own features) and expand the EAGLE-2 dynamic top-k tree in a fixed envelope: `self_spec.expand_tree`,
   the same expansion tree self-speculation uses (top `branch` children per frontier node, the `tree_nodes`
   best by cumulative draft log-probability, the top-1 path always kept);
3. the verify pass (`verify.verify_round` with the head's feature readout) checks the tree at full depth,
   commits the accepted path and returns its nodes' features: the next round's pending rows.
Drafts are deterministic (top-k of the head), so sampled output is token-identical to AR's for the same seed.
Drafting costs no core steps: the features come out of the verify pass (feature 'fused' reads the states at
its three depths, all inside the R steps the pass runs anyway); a level is one transformer block and the LM
head. Before the first round the prompt's features come from one full-sequence forward (no cache).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.decoding.tree.head_method import HeadMethod
from loopspec_jax.heads import eagle as E
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import entry
from loopspec_jax.parallel import heads as layout
from loopspec_jax.parallel.logical import axes_field

DEFAULTS = {"gamma": 6, "branch": 4, "tree_nodes": 32}


@flax.struct.dataclass
class HeadState:
  """The head's cache and the pending rows (module docstring)."""

  k: jax.Array = axes_field("batch", None, None, None)  # [B, KV, T, D]
  v: jax.Array = axes_field("batch", None, None, None)  # [B, KV, T, D]
  feat: jax.Array = axes_field("batch", None, None)  # [B, gamma + 1, F] raw target features of positions q0 + i
  q0: jax.Array = axes_field("batch")  # [B]
  hist: jax.Array = axes_field("batch", None)  # [B, gamma + 1] rounds by number of accepted drafts


def verify_features(feature: str, depths: tuple) -> tuple:
  """What the verify pass reads out for a head: ('hidden',) or its three depths."""
  return ("hidden",) if feature == "final" else tuple(depths)


def prologue(params, hp, st: tv.TreeState, sp, *, cfg, feature, depths, random_init):
  """The prompt's head cache (positions < length - 2) and its pending row (position length - 2), from one
  full-sequence forward of the target over the token buffer."""
  b, t = st.tokens.shape
  hcfg = {"feature": feature}
  noise = common.prompt_noise(sp, b, t, cfg, random_init)
  hidden, states = E.target_features(params, st.tokens, st.length, cfg, depths if feature == "fused" else (), noise)
  raw = E.raw_feature(hcfg, hidden, states)  # [B, T, F]
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  nxt = jnp.concatenate([st.tokens[:, 1:], jnp.zeros_like(st.tokens[:, :1])], axis=1)
  _, k, v = E.step(hp, params, nxt, E.first_feature(hp, hcfg, raw), pos, M.causal_mask(st.length, t), [], cfg)
  q0 = st.length - 2
  row = jnp.take_along_axis(raw, jnp.maximum(q0, 0)[:, None, None], axis=1)  # [B, 1, F]
  feat = jnp.zeros_like(st.extra.feat).at[:, :1].set(row)
  return st.replace(extra=st.extra.replace(k=k.transpose(0, 2, 1, 3), v=v.transpose(0, 2, 1, 3), feat=feat, q0=q0))


def level0(hp, params, hs: HeadState, tokens, length, *, cfg, feature):
  """The pending rows through the head, written to its cache. Returns (logits [B, 1, V] of the last row,
  its output h [B, 1, E], the new cache k, v)."""
  b, g1, _ = hs.feat.shape
  t = hs.k.shape[2]
  i = jnp.arange(g1)
  pos = hs.q0[:, None] + i[None, :]  # [B, G+1]
  n_pend = length - 1 - hs.q0
  valid = (i[None, :] < n_pend[:, None]) & (pos >= 0)
  toks = jnp.take_along_axis(tokens, jnp.clip(pos + 1, 0, t - 1), axis=1)
  own = ((i[None, :] <= i[:, None])[None] & valid[:, None, :]) | jnp.eye(g1, dtype=bool)[None]
  cached = jnp.broadcast_to(jnp.arange(t)[None, None, :] < hs.q0[:, None, None], (b, g1, t))
  feat = E.first_feature(hp, {"feature": feature}, hs.feat)
  ctx = [(kvcache.stored(hs.k), kvcache.stored(hs.v), cached)]  # read in the cache's layout
  h, k, v = E.step(hp, params, toks, feat, jnp.maximum(pos, 0), own, ctx, cfg)
  wpos = kvcache.ordered(jnp.where(valid, pos, t), h, t)  # after the read above
  hk, hv = kvcache.write_positions(hs.k, k, wpos), kvcache.write_positions(hs.v, v, wpos)
  last = jnp.maximum(n_pend - 1, 0)
  h_last = jnp.take_along_axis(h, last[:, None, None], axis=1)  # [B, 1, E]
  return M.readout_logits(params, h_last, cfg), h_last, hk, hv


def draft_tree(params, hp, st: tv.TreeState, *, cfg, feature, gamma, branch, tree_nodes):
  """The round's tree drafted by the head (module docstring) and the head state after level 0."""
  b, t = st.tokens.shape
  p0 = st.length - 1
  root = st.tokens[jnp.arange(b), p0]
  hs = st.extra

  def level(carry, lvl, toks, order, past_mask):
    if lvl == 0:
      logits, h, hk, hv = level0(hp, params, hs, st.tokens, st.length, cfg=cfg, feature=feature)
      return logits, (hk, hv, None, h)
    hk, hv, past, h_prev = carry
    s = toks.shape[1]
    parent_h = jnp.take_along_axis(h_prev, (order // branch)[:, :, None], axis=1)
    pos = jnp.broadcast_to((p0 + lvl - 1)[:, None], (b, s))
    cached = jnp.broadcast_to(jnp.arange(t)[None, None, :] < p0[:, None, None], (b, s, t))
    ctx = [(kvcache.stored(hk), kvcache.stored(hv), cached)]
    if past is not None:
      ctx.append((past[0], past[1], past_mask[:, :, 1:]))
    eye = jnp.broadcast_to(jnp.eye(s, dtype=bool), (b, s, s))
    h, k, v = E.step(hp, params, toks, parent_h, pos, eye, ctx, cfg)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    past = (k, v) if past is None else tuple(jnp.concatenate([a, n], axis=2) for a, n in zip(past, (k, v)))
    return M.readout_logits(params, h, cfg), (hk, hv, past, h)

  tree, (hk, hv, _, _) = self_spec.expand_tree(level, None, root, gamma=gamma, branch=branch, tree_nodes=tree_nodes)
  return tree, hs.replace(k=hk, v=hv)


# ---------------------------------------------------------------------------------------------------
# The loop, the stats and the Method
# ---------------------------------------------------------------------------------------------------
def draft(hp, params, st: tv.TreeState, sp, *, cfg, feature, gamma, branch, tree_nodes):
  """The head's tree; the head's state advanced by drafting (its KV cache) goes on in st.extra."""
  del sp
  tree, hs = draft_tree(params, hp, st, cfg=cfg, feature=feature, gamma=gamma, branch=branch, tree_nodes=tree_nodes)
  return st.replace(extra=hs), tree


def after_verify(st: tv.TreeState, new, outputs, *, gamma: int) -> HeadState:
  """The accepted path's features for the next round, its first position, the acceptance histogram."""
  hs, live = new.extra, ~st.done
  hist = hs.hist + (jax.nn.one_hot(new.accepted - st.accepted, gamma + 1, dtype=jnp.int32) * live[:, None])
  return hs.replace(feat=outputs[-1].astype(hs.feat.dtype), q0=st.length - 1, hist=hist)


@entry.program(entry.HEAD_LOOP, donate_argnames=("state",))
def decode_loop(
    params, state, sp, head_params, *, cfg, feature, depths, gamma, branch, tree_nodes, greedy, random_init
):
  """The prompt's head features, then rounds of (draft a tree with the head, verify it) until all are done."""
  hp, envelope = head_params, dict(gamma=gamma, branch=branch, tree_nodes=tree_nodes)
  prime = functools.partial(prologue, hp=hp, cfg=cfg, feature=feature, depths=depths, random_init=random_init)
  drafter = tl.Drafter(
      draft=functools.partial(draft, hp, cfg=cfg, feature=feature, **envelope),
      max_depth=gamma,
      features=verify_features(feature, depths),
      prime=lambda params, st, sp: prime(params, st=st, sp=sp).extra,
      after_verify=functools.partial(after_verify, gamma=gamma),
      mask_done=False,  # the features and first position of done rows are never read again
  )
  return tl.run(params, state, sp, drafter, cfg=cfg, greedy=greedy, random_init=random_init)


@entry.program(entry.INIT)
def initial_state(cache, tokens, lengths, sp: common.SamplingParams, *, cfg: ModelConfig, gamma: int, width: int):
  del sp
  b, t = tokens.shape
  kv_heads = layout.base_config(cfg).num_kv_heads  # the head's own layout, unpadded (heads/eagle.py step)
  zk = jnp.zeros((b, kv_heads, t, cfg.head_dim), jnp.float32)
  zh = jnp.zeros((b, gamma + 1), jnp.int32)
  extra = HeadState(zk, zk, jnp.zeros((b, gamma + 1, width), jnp.float32), lengths - 2, zh)
  return tv.fresh_state(cache, tokens, lengths, extra)


def summarize(st: tv.TreeState, cfg: ModelConfig, feature: str, gamma: int, branch: int, tree_nodes: int):
  """Raw counts of an EAGLE run (figures: `verify.tree_figures`). Per round the head runs gamma + 1 pending
  rows and (gamma - 1) * branch frontier rows through its one block (and the LM head); the verify pass runs
  1 + tree_nodes rows through all R steps. Drafting runs no core step."""
  r = cfg.recurrence
  draft_rows = gamma + 1 + (gamma - 1) * branch
  return common.DecodeStats.of_loop(
      "eagle",
      st,
      r,
      settings={
          "recurrence": r,
          "feature": feature,
          "gamma": gamma,
          "branch": branch,
          "tree_nodes": tree_nodes,
          "draft_blocks_per_round": gamma,
          "draft_layer_calls": draft_rows,
          "verify_layer_calls": (1 + tree_nodes) * adaptive.layer_calls(cfg, r),
      },
      per_request=tl.per_request(st),
      totals=rounds_accepting(st.extra.hist),
  )


def rounds_accepting(hist) -> dict:
  """The totals `rounds_accepting_k`, k = 0..gamma: rounds that accepted at least k drafts, from the per-request
  histograms hist [B, gamma + 1] of rounds by accepted drafts (`level_acceptance` reads them)."""
  hist = jax.device_get(hist).sum(axis=0)
  return {f"rounds_accepting_{k}": int(hist[k:].sum()) for k in range(hist.shape[0])}


def level_acceptance(stats) -> list:
  """Per draft level k = 1..gamma: the fraction of rounds that accepted a depth-k draft among those that
  accepted depth k - 1 (from the totals `rounds_accepting_k`)."""
  t, out, k = stats.totals, [], 1
  while f"rounds_accepting_{k}" in t:
    out.append(t[f"rounds_accepting_{k}"] / max(t[f"rounds_accepting_{k - 1}"], 1))
    k += 1
  return out


def resolve(cfg: ModelConfig, gamma, branch, tree_nodes) -> dict:
  """The envelope with defaults filled in, or a ValueError naming the bad argument (before compiling)."""
  env = {k: DEFAULTS[k] if v is None else v for k, v in dict(gamma=gamma, branch=branch, tree_nodes=tree_nodes).items()}
  for k, v in env.items():
    if isinstance(v, bool) or not isinstance(v, int):
      raise ValueError(f"method='eagle' needs an integer {k}, got {v!r}")
  if not 1 <= env["branch"] <= min(cfg.vocab_size, 64):
    raise ValueError(f"method='eagle' needs 1 <= branch <= {min(cfg.vocab_size, 64)}, got {env['branch']}")
  if not 1 <= env["gamma"] <= min(32, cfg.max_len - 1):
    raise ValueError(f"method='eagle' needs a tree depth 1 <= gamma <= {min(32, cfg.max_len - 1)}, got {env['gamma']}")
  most = self_spec.pool_size(env["branch"], env["gamma"])
  if not 1 <= env["tree_nodes"] <= min(most, 512):
    raise ValueError(
        f"method='eagle' needs 1 <= tree_nodes <= {min(most, 512)} (branch={env['branch']}, gamma={env['gamma']} "
        f"draft {most} candidates), got {env['tree_nodes']}"
    )
  return env


@dataclasses.dataclass(frozen=True)
class Eagle(HeadMethod):
  """EAGLE: a tree of `tree_nodes` drafts from an EAGLE head (`heads=lj.load_heads('tiny-raven-eagle')`) on
  the target's features, `gamma` levels deep, top-`branch` per frontier node, verified in one full-depth pass
  (defaults gamma=6, branch=4, 32 nodes)."""

  name = "eagle"
  kind = E.KIND
  example = "tiny-raven-eagle"
  positional = ("heads", "gamma", "branch", "tree_nodes")
  heads: Any = dataclasses.field(default=None, compare=False)  # a Heads artefact, or its name / directory
  gamma: Optional[int] = None
  branch: Optional[int] = None
  tree_nodes: Optional[int] = None

  def validate_envelope(self, cfg: ModelConfig) -> None:
    resolve(cfg, self.gamma, self.branch, self.tree_nodes)

  def make_decoder(self, cfg: ModelConfig, *, greedy: bool, random_init: bool) -> common.Decoder:
    env = resolve(cfg, self.gamma, self.branch, self.tree_nodes)
    hc = self.heads.config
    feature, depths = hc["feature"], tuple(hc["depths"])
    stats = functools.partial(summarize, cfg=cfg, feature=feature, **env)
    init_kw = {"gamma": env["gamma"], "width": E.feature_width(hc)}
    # the head's parameters travel as a keyword (traced, not static), like method='draft''s drafter
    loop_kw = dict(
        env, head_params=self.heads.params, feature=feature, depths=depths, greedy=greedy, random_init=random_init
    )
    return common.round_decoder(
        "eagle", cfg, env["gamma"], initial_state, decode_loop, stats, init_kw=init_kw, loop_kw=loop_kw
    )

  @classmethod
  def derived(cls, stats) -> dict:
    return dict(tv.tree_figures(stats), level_acceptance=level_acceptance(stats))
