"""Medusa-1 decoding (Cai et al., 2024) on the one tree verifier: k heads on the target's final feature.

The state carries, per request, the final feature h_a (`looped.readout_features` at depth R: what the LM head
multiplies) of the node verified last round whose LM-head draw is the current root (the last committed
token). Head i predicts the token i + 2 after h_a's position, i.e. the root's descendant at depth i + 1. One
round per request:
1. drafts (static top-k envelope): head i's top-`branch` tokens, log-probabilities lp_i (log_softmax of the
   head's logits); the pool is the Cartesian product tree of every rank tuple (r_0, ..., r_j), j < k: node
   (r_0..r_j) at depth j + 1 carries head j's rank-r_j token under node (r_0..r_{j-1}), scored by the sum of
   lp_l[r_l] (the product of the head probabilities). The tree is the root plus the `tree_nodes` best pool
   nodes by score (`self_spec.select`: a child never scores above its parent and ties go to the parent, so
   the chosen set is closed under ancestors);
2. verify: the one tree pass (`tree/verify.py`), AR's draws at every node, the accepted path written; the
   pass also reads out the final feature of the last accepted node, the next round's h_a.
The first round's h_a (the feature of the prompt's second-to-last position) is computed by a one-node pass at
the start of the loop call (`prime`); a one-token prompt has none and drafts from a zero feature.
Drafts depend only on committed tokens (never on this round's draws), so verification is exact: greedy output
equals AR's and sampled output is AR's token for token for the same seed. `heads` (a `Heads` artefact of kind
'medusa' for this target), `tree_nodes` (default 16), `branch` (default 4).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.decoding.tree.head_method import HeadMethod, check_kind
from loopspec_jax.decoding.tree.self_spec import select
from loopspec_jax.heads import artefact
from loopspec_jax.heads import medusa as heads_lib
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import entry

DEFAULTS = {"tree_nodes": 16, "branch": 4}
MAX_POOL = 4096


def pool_layout(num_heads: int, branch: int):
  """The static Cartesian-product pool: per level j (depth j + 1) the rank tuples [branch^(j+1), j + 1], and
  the pool parent [P] / depth [P] of every entry (entry 0: the root; levels in order)."""
  ranks, parent, depth, first, prev_first = [], [0], [0], 1, 0
  for j in range(num_heads):
    r = np.asarray(list(itertools.product(range(branch), repeat=j + 1)), np.int32).reshape(-1, j + 1)
    ranks.append(r)
    if j == 0:
      parent += [0] * len(r)
    else:
      parent += (prev_first + np.ravel_multi_index(r[:, :-1].T, (branch,) * j)).tolist()
    depth += [j + 1] * len(r)
    prev_first, first = first, first + len(r)
  return ranks, np.asarray(parent, np.int32), np.asarray(depth, np.int32)


def pool_size(num_heads: int, branch: int) -> int:
  return sum(branch ** (j + 1) for j in range(num_heads))


def build_tree(hparams, feature, root, *, branch: int, tree_nodes: int) -> tv.Tree:
  """The round's tree [B, 1 + tree_nodes] from h_a [B, E] and the root tokens [B] (module docstring)."""
  b = root.shape[0]
  k = hparams["w"].shape[0]
  lp, tok = jax.lax.top_k(jax.nn.log_softmax(heads_lib.head_logits(hparams, feature), axis=-1), branch)  # [B, k, br]
  ranks, parent, depth = pool_layout(k, branch)
  toks, scores = [root[:, None]], [jnp.zeros((b, 1), jnp.float32)]
  for j, r in enumerate(ranks):
    toks.append(tok[:, j, r[:, -1]])
    scores.append(sum(lp[:, l, r[:, l]] for l in range(j + 1)))
  bk = lambda x: jnp.broadcast_to(jnp.asarray(x), (b,) + x.shape)
  cat = lambda xs: jnp.concatenate(xs, axis=1)
  return select(cat(toks).astype(jnp.int32), cat(scores), bk(parent), bk(depth), tree_nodes)


def prime(params, st: tv.TreeState, sp, *, cfg, layout, random_init: bool) -> tl.LastFeature:
  """h_a for requests not ready yet: the final feature at position length - 2 (its token through the whole
  model as a one-node tree, attending to the cached prefix before it), zeros for a one-token prompt."""
  b = st.tokens.shape[0]
  p = jnp.maximum(st.length - 2, 0)
  tok = st.tokens[jnp.arange(b), p][:, None]
  one = lambda x: jnp.broadcast_to(jnp.asarray(x), (b, 1))
  tree = tv.Tree(tokens=tok, parent=one(0), depth=one(0), valid=one(True))
  anc = jnp.ones((b, 1, 1), bool)
  noise = common.state_noise(sp, p[:, None], cfg) if random_init else None
  _, entries, _ = tv.tree_pass(params, st.cache, layout, tree, anc, p, ((cfg.recurrence, 0),), cfg, noise, ("final",))
  final = entries["features"]["final"][:, 0].astype(jnp.float32)
  feat = jnp.where((st.length >= 2)[:, None], final, 0.0)
  ex = st.extra
  return tl.LastFeature(feature=jnp.where(ex.ready[:, None], ex.feature, feat), ready=jnp.ones_like(ex.ready))


def draft(hparams, params, st: tv.TreeState, sp, *, branch: int, tree_nodes: int):
  """The heads' tree from h_a (the last accepted node's final feature) below the root."""
  del params, sp
  root = st.tokens[jnp.arange(st.tokens.shape[0]), st.length - 1]
  return st, build_tree(hparams, st.extra.feature, root, branch=branch, tree_nodes=tree_nodes)


@entry.program(entry.HEAD_LOOP, donate_argnames=("state",))
def decode_loop(params, state: tv.TreeState, sp, hparams, *, cfg: ModelConfig, branch, tree_nodes, greedy, random_init):
  """Rounds of (the heads' tree from h_a, one full-depth verify pass, h_a of the last accepted node)."""
  layout = kvcache.CacheLayout.of(cfg, 1)
  drafter = tl.Drafter(
      draft=functools.partial(draft, hparams, branch=branch, tree_nodes=tree_nodes),
      max_depth=hparams["w"].shape[0],
      last_feature="final",
      prime=functools.partial(prime, cfg=cfg, layout=layout, random_init=random_init),
      after_verify=tl.keep_last_feature,  # h_a of the last accepted node
  )
  return tl.run(params, state, sp, drafter, cfg=cfg, greedy=greedy, random_init=random_init)


def head_layer_calls(cfg: ModelConfig, num_heads: int) -> float:
  """The heads' weight flops per round (one feature row through every head) in units of one target block's."""
  block = sum(int(np.prod(s)) for s in M.layer_shapes(cfg).values())
  e, v = cfg.hidden_size, cfg.vocab_size
  return num_heads * (e * e + e + e * v) / block


def summarize(st: tv.TreeState, cfg: ModelConfig, num_heads: int, branch: int, tree_nodes: int):
  r = cfg.recurrence
  return common.DecodeStats.of_loop(
      "medusa",
      st,
      r,
      settings={
          "recurrence": r,
          "num_heads": num_heads,
          "branch": branch,
          "tree_nodes": tree_nodes,
          "draft_layer_calls": head_layer_calls(cfg, num_heads),
          "verify_layer_calls": (1 + tree_nodes) * adaptive.layer_calls(cfg, r),
      },
      per_request=tl.per_request(st),
  )


def resolve(cfg: ModelConfig, heads, tree_nodes, branch) -> dict:
  """The envelope with defaults filled in, or a ValueError naming the bad argument (before compiling)."""
  check_kind("medusa", heads, heads_lib.KIND, Medusa.example)
  for key, want in (("hidden_size", cfg.hidden_size), ("vocab_size", cfg.vocab_size)):
    if heads.config.get(key) != want:
      raise ValueError(f"the medusa heads have {key} {heads.config.get(key)}, the model {want}")
  env = {k: DEFAULTS[k] if v is None else v for k, v in dict(tree_nodes=tree_nodes, branch=branch).items()}
  for k, v in env.items():
    if isinstance(v, bool) or not isinstance(v, int):
      raise ValueError(f"method='medusa' needs an integer {k}, got {v!r}")
  k = int(heads.config["num_heads"])
  if not 1 <= env["branch"] <= min(cfg.vocab_size, 64):
    raise ValueError(f"method='medusa' needs 1 <= branch <= {min(cfg.vocab_size, 64)}, got {env['branch']}")
  most = pool_size(k, env["branch"])
  if most > MAX_POOL:
    raise ValueError(f"method='medusa': {k} heads x branch {env['branch']} make a pool of {most} > {MAX_POOL} nodes")
  if not 1 <= env["tree_nodes"] <= min(most, 512):
    raise ValueError(
        f"method='medusa' needs 1 <= tree_nodes <= {min(most, 512)} ({k} heads, branch {env['branch']}), "
        f"got {env['tree_nodes']}"
    )
  env["num_heads"] = k
  return env


def make_decoder(cfg: ModelConfig, *, greedy: bool, random_init: bool, heads, tree_nodes, branch) -> common.Decoder:
  env = resolve(cfg, heads, tree_nodes, branch)
  stats = functools.partial(summarize, cfg=cfg, **env)
  # hparams traced: another head of the same shapes reuses the compiled loop
  loop_kw = dict(
      hparams=heads.params, branch=env["branch"], tree_nodes=env["tree_nodes"], greedy=greedy, random_init=random_init
  )
  return common.round_decoder("medusa", cfg, env["num_heads"], tl.feature_state, decode_loop, stats, loop_kw=loop_kw)


@dataclasses.dataclass(frozen=True)
class Medusa(HeadMethod):
  """Medusa-1: a tree of `tree_nodes` drafts from the top-`branch` tokens of each Medusa head (`heads`, an
  artefact or a bundled head's name), verified in one full-depth pass (defaults 16 nodes, branch 4)."""

  name = "medusa"
  kind = heads_lib.KIND
  example = "tiny-raven-medusa"
  positional = ("heads", "tree_nodes", "branch")
  build_decoder = staticmethod(make_decoder)
  heads: Union[artefact.Heads, str, None] = dataclasses.field(default=None, compare=False)
  tree_nodes: Optional[int] = None
  branch: Optional[int] = None

  def validate_envelope(self, cfg: ModelConfig) -> None:
    resolve(cfg, self.heads, self.tree_nodes, self.branch)

  @classmethod
  def derived(cls, stats) -> dict:
    return tl.full_depth_figures(stats)
