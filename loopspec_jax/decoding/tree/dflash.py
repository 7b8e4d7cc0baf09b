"""DFlash on the loop: a block of gamma drafts from a DFlash drafter (`heads/dflash.py`) in ONE drafter pass,
verified as a chain in ONE full-depth pass of the target, exact under sampling.

State: besides the target's cache, the drafter's own key / value cache [L, B, KV, T, D] over the committed
positions (its entry at position j: block l's projection of the context feature c_j, from the target's states
at the drafter's depths there), per-request draft / acceptance counters and a histogram of accepted drafts.

One round per request (p0 = length - 1 holds the anchor, the last committed token; its features and those of
later positions are not in the drafter's cache yet):
1. draft: the drafter's one pass over [x_{p0}, mask x gamma] reads its cache below p0 and gives q_1..q_gamma
   (processed with the request's temperature / top-k / top-p); x_i ~ q_i with the key of the draft model's
   proposals at position p0 + i (greedy: argmax). The slots are conditionally independent given the
   prefix, so q_i is x_i's proposal distribution given x_<i as well: a chain proposal.
2. verify: the chain [x_{p0}, x_1..x_gamma] goes through the tree verifier's pass (`tree.verify.tree_pass`:
   prelude, all R core steps, coda; it also returns the states at the drafter's depths) and the standard
   speculative-sampling chain rule (`verify.verify_chain_upto`: accept x_i with min(1, p_i / q_i), at the
   first rejection a draw from norm(max(0, p_i - q_i)), else the bonus from p_{gamma+1}); greedy passes
   one-hot p and q through the same rule, i.e. the longest prefix equal to the target's argmax. The accepted
   path's target entries are written (`tree.verify.write_path`) and the tokens committed.
3. the context: the accepted path's states at positions p0 .. p0 + n_acc (exactly the positions below the
   next anchor) become drafter cache entries (`heads.dflash.context_kv`).
Before the first round the prompt's context comes from one full-sequence forward of the target (no cache).
Drafting runs no core step: the drafter is `layers` blocks over gamma + 1 rows and the LM head.
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
from loopspec_jax.decoding import draft as D
from loopspec_jax.decoding import sampling
from loopspec_jax.decoding import verify
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.decoding.tree.eagle import level_acceptance, rounds_accepting
from loopspec_jax.decoding.tree.head_method import HeadMethod
from loopspec_jax.heads import dflash as F
from loopspec_jax.heads import eagle as E
from loopspec_jax.models import kvcache
from loopspec_jax.parallel import entry
from loopspec_jax.parallel import heads as layout
from loopspec_jax.parallel.logical import axes_field

DEFAULT_GAMMA = 6


@flax.struct.dataclass
class DFlashState:
  """The drafter's cache and the counters (module docstring)."""

  k: jax.Array = axes_field(None, "batch", None, None, None)  # [L, B, KV, T, D]
  v: jax.Array = axes_field(None, "batch", None, None, None)  # [L, B, KV, T, D]
  drafted: jax.Array = axes_field("batch")  # [B] drafts offered to verification
  examined: jax.Array = axes_field("batch")  # [B] drafts verification looked at (accepted + first rejected)
  hist: jax.Array = axes_field("batch", None)  # [B, gamma + 1] rounds by number of accepted drafts


def write_context(hp, fs: DFlashState, raw, pos, keep, cfg: ModelConfig) -> DFlashState:
  """The context entries of raw features [B, S, F] at positions pos [B, S] into the drafter's cache where keep
  [B, S] (others dropped)."""
  k, v = F.context_kv(hp, F.context(hp, raw, cfg), pos, cfg)  # [L, B, KV, S, D]
  t = fs.k.shape[3]
  wpos = jnp.where(keep, pos, t)
  put = lambda buf, x: kvcache.write_stack(buf, x.transpose(0, 1, 3, 2, 4), wpos)  # x: [L, B, S, KV, D]
  return fs.replace(k=put(fs.k, k), v=put(fs.v, v))


def prologue(params, hp, st: tv.TreeState, sp, *, cfg, depths, random_init):
  """The prompt's context entries (every buffer position; those >= p0 are masked, then overwritten) from one
  full-sequence forward of the target over the token buffer."""
  b, t = st.tokens.shape
  noise = common.prompt_noise(sp, b, t, cfg, random_init)
  _, states = E.target_features(params, st.tokens, st.length, cfg, depths, noise)
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  k, v = F.context_kv(hp, F.context(hp, F.raw_feature(states), cfg), pos, cfg)
  return st.replace(extra=st.extra.replace(k=k.astype(st.extra.k.dtype), v=v.astype(st.extra.v.dtype)))


def propose(hp, params, st: tv.TreeState, sp, *, cfg, gamma: int, greedy: bool):
  """The round's block: (drafts [B, gamma], their distributions q [B, gamma, V] (one-hot when greedy))."""
  b, t = st.tokens.shape
  p0 = st.length - 1
  anchor = st.tokens[jnp.arange(b), p0]
  fs = st.extra
  ctx_mask = jnp.arange(t)[None, :] < p0[:, None]
  logits = F.draft_logits(hp, params, anchor, p0, fs.k, fs.v, ctx_mask, gamma, cfg)  # [B, G, V]
  if greedy:
    drafts = sampling.greedy_token(logits)
    return drafts, jax.nn.one_hot(drafts, logits.shape[-1], dtype=jnp.float32)
  q = D.distributions(logits, sp)
  pos = p0[:, None] + 1 + jnp.arange(gamma)[None, :]
  key = lambda rid, p: sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_X1)
  keys = jax.vmap(lambda rid, ps: jax.vmap(lambda p: key(rid, p))(ps))(sp.request_ids, pos)
  return jax.vmap(jax.vmap(sampling.sample_token))(keys, q).astype(jnp.int32), q


def chain_tree(anchor, drafts) -> tv.Tree:
  """The chain [anchor, x_1..x_G] as a tree [B, G + 1] (node i's parent i - 1)."""
  b, g = drafts.shape
  i = jnp.arange(g + 1, dtype=jnp.int32)
  row = lambda x: jnp.broadcast_to(x, (b, g + 1))
  parent = row(jnp.maximum(i - 1, 0))
  toks = jnp.concatenate([anchor[:, None], drafts], axis=1)
  return tv.Tree(tokens=toks, parent=parent, depth=row(i), valid=jnp.ones((b, g + 1), bool))


def verify_chain_round(params, st: tv.TreeState, sp, drafts, q, n_max, *, cfg, depths, greedy: bool, random_init):
  """One full-depth pass over the chain, the chain rule, the accepted path written and committed. Returns
  (state, n_acc [B], raw features [B, G + 1, F] of the chain's positions p0 .. p0 + G)."""
  b, g = drafts.shape
  p0 = st.length - 1
  lay = kvcache.CacheLayout.of(cfg, 1)
  tree = chain_tree(st.tokens[jnp.arange(b), p0], drafts)
  anc = jnp.broadcast_to(jnp.tril(jnp.ones((g + 1, g + 1), bool)), (b, g + 1, g + 1))
  noise = common.state_noise(sp, p0[:, None] + tree.depth, cfg) if random_init else None
  readouts = ((cfg.recurrence, 0),)
  logits, entries, after = tv.tree_pass(params, st.cache, lay, tree, anc, p0, readouts, cfg, noise, depths)
  if greedy:
    p = jax.nn.one_hot(sampling.greedy_token(logits), logits.shape[-1], dtype=jnp.float32)
  else:
    p = D.distributions(logits, sp)
  vkeys = jax.vmap(lambda rid, pp: sampling.request_key(sp.base_key, rid, pp, sampling.PURPOSE_VERIFY))(
      sp.request_ids, p0 + 1
  )
  n_acc, nxt = jax.vmap(verify.verify_chain_upto)(vkeys, p, drafts, q, n_max)
  path = tree.depth  # the chain: node d at depth d
  cache = tv.write_path(st.cache, lay, entries, path, p0, n_acc, after)
  st = st.replace(cache=cache, **common.commit_round(st, drafts, n_acc, nxt, sp))
  raw = F.raw_feature([entries["features"][d] for d in depths])
  return st, n_acc, raw


# ---------------------------------------------------------------------------------------------------
# The loop, the stats and the Method
# ---------------------------------------------------------------------------------------------------
def draft(hp, params, st: tv.TreeState, sp, *, cfg, gamma: int, greedy: bool):
  """The round's chain proposal (drafts [B, G], q [B, G, V], n_max [B]: the drafts the round may accept)."""
  n_max = D.offered(st, sp, jnp.full(st.length.shape, gamma, jnp.int32))
  drafts, q = propose(hp, params, st, sp, cfg=cfg, gamma=gamma, greedy=greedy)
  return st, (drafts, q, n_max)


def verify_chain(params, st: tv.TreeState, sp, proposal, *, cfg, greedy, random_init, features, **_):
  """`verify_chain_round` as a `Drafter.verify`: (state, n_acc, raw features, n_max)."""
  drafts, q, n_max = proposal
  st, n_acc, raw = verify_chain_round(
      params, st, sp, drafts, q, n_max, cfg=cfg, depths=features, greedy=greedy, random_init=random_init
  )
  return st, n_acc, raw, n_max


def after_verify(hp, st: tv.TreeState, new, outputs, *, cfg, gamma: int) -> DFlashState:
  """The accepted chain's context written into the drafter's cache; the draft and acceptance counts."""
  n_acc, raw, n_max = outputs
  p0, live = st.length - 1, ~st.done
  pos = p0[:, None] + jnp.arange(gamma + 1)[None, :]
  fs = write_context(hp, new.extra, raw, pos, jnp.arange(gamma + 1)[None, :] <= n_acc[:, None], cfg)
  return fs.replace(
      drafted=fs.drafted + jnp.where(live, n_max, 0),
      examined=fs.examined + jnp.where(live, n_acc + (n_acc < n_max), 0),
      hist=fs.hist + jax.nn.one_hot(n_acc, gamma + 1, dtype=jnp.int32) * live[:, None],
  )


@entry.program(entry.HEAD_LOOP, donate_argnames=("state",))
def decode_loop(params, state: tv.TreeState, sp, head_params, *, cfg: ModelConfig, depths, gamma, greedy, random_init):
  """The prompt's context, then rounds of (one drafter pass, one verify pass of the chain) until all are done."""
  hp = head_params
  prime = functools.partial(prologue, hp=hp, cfg=cfg, depths=depths, random_init=random_init)
  drafter = tl.Drafter(
      draft=functools.partial(draft, hp, cfg=cfg, gamma=gamma, greedy=greedy),
      max_depth=gamma,
      features=depths,
      prime=lambda params, st, sp: prime(params, st=st, sp=sp).extra,
      verify=verify_chain,
      after_verify=functools.partial(after_verify, hp, cfg=cfg, gamma=gamma),
      mask_done=False,  # the drafter's cache of a done row is never read again; the counts mask themselves
  )
  return tl.run(params, state, sp, drafter, cfg=cfg, greedy=greedy, random_init=random_init)


@entry.program(entry.INIT)
def initial_state(cache, tokens, lengths, sp: common.SamplingParams, *, cfg: ModelConfig, gamma: int, n_layers: int):
  del sp
  b, t = tokens.shape
  kv_heads = layout.base_config(cfg).num_kv_heads  # the drafter's own layout, unpadded (heads/dflash.py)
  # the model's dtype: an f32 cache is read by the TPU's default-precision products through a bf16 convert of
  # the whole buffer every round (two 33 MB copies per round at Ouro-1.4B / 2048)
  zk = jnp.zeros((n_layers, b, kv_heads, t, cfg.head_dim), cfg.dtype)
  zb = jnp.zeros((b,), jnp.int32)
  return tv.fresh_state(cache, tokens, lengths, DFlashState(zk, zk, zb, zb, jnp.zeros((b, gamma + 1), jnp.int32)))


def summarize(st: tv.TreeState, cfg: ModelConfig, gamma: int, n_layers: int, depths: tuple):
  """Raw counts of a DFlash run (figures: `draft.draft_figures` plus tau). Per round the drafter runs gamma + 1
  rows through its `n_layers` blocks (and gamma through the LM head); the verify pass gamma + 1 rows through
  all R steps."""
  r = cfg.recurrence
  return common.DecodeStats.of_loop(
      "dflash",
      st,
      r,
      settings={
          "recurrence": r,
          "gamma": gamma,
          "depths": list(depths),
          "drafter_layers": n_layers,
          "draft_layer_calls": n_layers,
          "verify_layer_calls": adaptive.layer_calls(cfg, r),
      },
      per_request={
          "rounds": st.rounds,
          "accepted": st.accepted,
          "drafted": st.extra.drafted,
          "examined": st.extra.examined,
          "first": st.accepted,
          "restart": st.n_new - st.accepted,
      },
      totals=dict(rounds_accepting(st.extra.hist), draft_steps=st.iterations),
  )


def resolve_gamma(cfg: ModelConfig, gamma) -> int:
  """gamma with its default, or a ValueError (before compiling)."""
  g = DEFAULT_GAMMA if gamma is None else gamma
  if isinstance(g, bool) or not isinstance(g, int):
    raise ValueError(f"method='dflash' needs an integer gamma, got {g!r}")
  if not 1 <= g <= min(32, cfg.max_len - 1):
    raise ValueError(f"method='dflash' needs 1 <= gamma <= {min(32, cfg.max_len - 1)}, got {g}")
  return g


@dataclasses.dataclass(frozen=True)
class DFlash(HeadMethod):
  """DFlash: a block of `gamma` drafts from a DFlash block drafter (`heads=lj.load_heads('tiny-ouro-dflash')`)
  in one drafter pass on the target's features at its depths, verified as a chain by the speculative-sampling
  rule in one full-depth pass (exact when sampling; default gamma=6)."""

  name = "dflash"
  kind = F.KIND
  example = "tiny-ouro-dflash"
  positional = ("heads", "gamma")
  heads: Any = dataclasses.field(default=None, compare=False)  # a Heads artefact, or its name / directory
  gamma: Optional[int] = None

  def validate_envelope(self, cfg: ModelConfig) -> None:
    resolve_gamma(cfg, self.gamma)

  def make_decoder(self, cfg: ModelConfig, *, greedy: bool, random_init: bool) -> common.Decoder:
    g = resolve_gamma(cfg, self.gamma)
    hc = self.heads.config
    depths, n_layers = tuple(hc["depths"]), int(hc["layers"])
    stats = functools.partial(summarize, cfg=cfg, gamma=g, n_layers=n_layers, depths=depths)
    init_kw = {"gamma": g, "n_layers": n_layers}
    loop_kw = dict(head_params=self.heads.params, depths=depths, gamma=g, greedy=greedy, random_init=random_init)
    return common.round_decoder("dflash", cfg, g, initial_state, decode_loop, stats, init_kw=init_kw, loop_kw=loop_kw)

  @classmethod
  def derived(cls, stats) -> dict:
    figures = D.draft_figures(stats)
    return dict(figures, tau=figures["tokens_per_pass"], level_acceptance=level_acceptance(stats))
