"""MTP drafting (DeepSeek-V3's multi-token-prediction module as the drafter), verified by the one tree verifier.

The target was trained with one MTP module (loopspec_jax/heads/mtp.py): from the depth-R feature h_i behind a
token and the embedding of the token t_{i+1} it predicts t_{i+2}. After each verify pass the verifier hands back
the feature of the last accepted node (`verify_round(..., last_feature="hidden")`), whose draw is the token just emitted
(the next round's root). One round per request:
1. level 1: MTP(feature of the root's parent, root) -> its top-`branch` tokens, children of the root;
2. level j = 2..gamma (optional; the module was trained for one level only): the module runs again on its own
   output h' as the feature and the top-1 token of level j - 1, its top-`branch` tokens children of that top-1
   node (a top-1 spine with siblings, 1 + gamma * branch nodes);
3. the tree goes to `tree/verify.py`: one full-depth pass, AR's draws at every node, the accepted path written.
Drafts are deterministic (top-k of a function of the committed prefix), so greedy output equals AR's and sampled
output is token-identical to AR's for the same seed. In the first round there is no feature yet (prefill does
not keep one): its drafts are marked invalid and the round emits one token, as AR does.
Draft cost per round: gamma runs of one block and the LM head on one row, against the verify pass's
(1 + gamma * branch) rows through prelude, R core steps and the coda.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.decoding.tree.head_method import HeadMethod
from loopspec_jax.heads import mtp as head
from loopspec_jax.parallel import entry
from loopspec_jax.parallel import heads as layout

DEFAULTS = {"gamma": 1, "branch": 1}


def draft_tree(mp, params, feature, has, root, *, cfg: ModelConfig, gamma: int, branch: int) -> tv.Tree:
  """The round's tree [B, 1 + gamma * branch] (module docstring); feature [B, E], has [B] bool, root [B]."""
  b = root.shape[0]
  toks, parents, depths = [root[:, None]], [jnp.zeros((b, 1), jnp.int32)], [jnp.zeros((b, 1), jnp.int32)]
  f, x = feature[:, None, :].astype(jnp.dtype(cfg.dtype)), root[:, None]
  for lvl in range(gamma):
    h = head.hidden(mp, params, f, x, cfg)  # [B, 1, E]
    lg = head.readout(mp, params, h, cfg)
    top = jax.lax.top_k(lg[:, 0], branch)[1].astype(jnp.int32)  # [B, branch]
    parent = 0 if lvl == 0 else 1 + (lvl - 1) * branch  # the previous level's top-1 node
    toks.append(top)
    parents.append(jnp.full((b, branch), parent, jnp.int32))
    depths.append(jnp.full((b, branch), lvl + 1, jnp.int32))
    f, x = h, top[:, :1]
  cat = lambda xs: jnp.concatenate(xs, axis=1)
  n = gamma * branch
  valid = jnp.concatenate([jnp.ones((b, 1), bool), jnp.broadcast_to(has[:, None], (b, n))], axis=1)
  return tv.Tree(tokens=cat(toks), parent=cat(parents), depth=cat(depths), valid=valid)


def draft(mparams, params, st: tv.TreeState, sp, *, cfg: ModelConfig, gamma: int, branch: int):
  """The round's tree from the root (the last committed token) and the last accepted feature."""
  del sp
  root = st.tokens[jnp.arange(st.tokens.shape[0]), st.length - 1]
  return st, draft_tree(mparams, params, st.extra.feature, st.extra.ready, root, cfg=cfg, gamma=gamma, branch=branch)


@entry.program(entry.HEAD_LOOP, donate_argnames=("state",))
def decode_loop(params, state: tv.TreeState, sp, mparams, *, cfg: ModelConfig, gamma, branch, greedy, random_init):
  """Rounds of (MTP drafts from the last accepted feature, one full-depth verify pass) until all are done."""
  drafter = tl.Drafter(
      draft=functools.partial(draft, mparams, cfg=cfg, gamma=gamma, branch=branch),
      max_depth=gamma,
      last_feature="hidden",
      after_verify=tl.keep_last_feature,  # the next round's root's parent
  )
  return tl.run(params, state, sp, drafter, cfg=cfg, greedy=greedy, random_init=random_init)


def summarize(st: tv.TreeState, cfg: ModelConfig, gamma: int, branch: int):
  r = cfg.recurrence
  coda = cfg.n_coda if cfg.is_raven else 0
  return common.DecodeStats.of_loop(
      "mtp",
      st,
      r,
      settings={
          "recurrence": r,
          "gamma": gamma,
          "branch": branch,
          "draft_layer_calls": gamma,  # one block (and the LM head) per level, one row
          "verify_layer_calls": (1 + gamma * branch) * adaptive.layer_calls(cfg, r, coda=bool(coda)),
      },
      per_request=tl.per_request(st),
  )


def resolve(cfg: ModelConfig, gamma, branch) -> dict:
  """The settings with defaults filled in, or a ValueError naming the bad one (before compiling)."""
  env = {k: DEFAULTS[k] if v is None else v for k, v in dict(gamma=gamma, branch=branch).items()}
  for k, v in env.items():
    if isinstance(v, bool) or not isinstance(v, int):
      raise ValueError(f"method='mtp' needs an integer {k}, got {v!r}")
  if not 1 <= env["gamma"] <= min(16, cfg.max_len - 1):
    raise ValueError(f"method='mtp' needs 1 <= gamma <= {min(16, cfg.max_len - 1)}, got {env['gamma']}")
  if not 1 <= env["branch"] <= min(cfg.vocab_size, 64):
    raise ValueError(f"method='mtp' needs 1 <= branch <= {min(cfg.vocab_size, 64)}, got {env['branch']}")
  return env


def check_shapes(heads, model) -> None:
  """ValueError unless the MTP head's parameter shapes fit the target's blocks."""
  base = layout.base_config(model.config)  # a target laid out for a mesh: the head keeps the trained layout
  want = jax.tree_util.tree_map(lambda x: tuple(x.shape), head.init_params_abstract(base))
  got = jax.tree_util.tree_map(lambda x: tuple(x.shape), heads.params)
  if want != got:
    raise ValueError(f"the MTP head's parameter shapes do not fit the target's blocks: {got} vs {want}")


def make_decoder(cfg: ModelConfig, *, greedy: bool, random_init: bool, heads, **settings) -> common.Decoder:
  env = resolve(cfg, **settings)
  stats = functools.partial(summarize, cfg=cfg, **env)
  loop_kw = dict(env, mparams=heads.params, greedy=greedy, random_init=random_init)
  return common.round_decoder("mtp", cfg, env["gamma"], tl.feature_state, decode_loop, stats, loop_kw=loop_kw)


@dataclasses.dataclass(frozen=True)
class MTP(HeadMethod):
  """MTP drafting: the target's own DeepSeek-V3 MTP module (`heads`, kind 'mtp') drafts top-`branch` tokens
  for `gamma` levels (defaults 1 and 1: one draft per round) from the last accepted feature."""

  name = "mtp"
  kind = head.KIND
  example = "tiny-raven-mtp"
  positional = ("gamma", "branch")
  build_decoder = staticmethod(make_decoder)
  heads: Any = dataclasses.field(default=None, compare=False)
  gamma: Optional[int] = None
  branch: Optional[int] = None

  def validate_envelope(self, cfg: ModelConfig) -> None:
    resolve(cfg, self.gamma, self.branch)

  def check_target(self, model) -> None:
    super().check_target(model)
    check_shapes(self.heads, model)

  @classmethod
  def derived(cls, stats) -> dict:
    return tl.full_depth_figures(stats)
