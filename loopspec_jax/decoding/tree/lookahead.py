"""Lookahead decoding (Fu et al., ICML 2024) on the one tree verifier: Jacobi iteration plus an n-gram pool.

Per request the state holds a Jacobi window of W guesses for the positions after the root, and a ring buffer
of n-grams (N tokens each; filled from the prompt at the start, then from the Jacobi trajectory). One round
is ONE full-depth pass over one tree (`tree/verify.py`):
- the lookahead branch: the window as a chain root -> g_1 -> ... -> g_W (node j at position p0 + j);
- the verification branch: up to G pool n-grams whose first token is the root's, most recent first, each a
  chain of its N - 1 remaining tokens under the root (shared prefixes, also with the window, are merged).
The verifier draws AR's token after every node and accepts the longest matching path (window or n-gram),
so output is AR's, greedy and sampled. Then, from the draws y_j after the window nodes:
- Jacobi step: the next window is y shifted by the c committed tokens (the guess for position p0 + c + i + 1
  is y after window node c + i; slots past the window repeat the last draw);
- pool update: for every window node j = 0..W (0: the root) the N - 1 tokens of the chain ending at it
  (committed tokens before the root where the chain is shorter) followed by the draw y_j form an n-gram of
  the Jacobi trajectory: W + 1 of them are added per round. (The paper's 2D window keeps N - 1 levels of
  one-position columns and reads n-grams along its diagonals; here the window is one causal chain per pass,
  so each of its nodes already sees N - 1 trajectory tokens before it.)
The pool never looks at this round's draws before they are drawn, so the drafts are deterministic and
verification is exact. `window=W, ngram=N, guesses=G`; a tree of 1 + W + G (N - 1) nodes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding.method import Method
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.parallel import entry
from loopspec_jax.parallel.logical import axes_field

DEFAULTS = {"window": 5, "ngram": 4, "guesses": 5}
POOL_PER_WINDOW = 16  # ring-buffer slots per window column


@flax.struct.dataclass
class LookaheadState:
  """Per request: the window [B, W] of guesses for positions p0 + 1 .. p0 + W; the n-gram ring buffer
  [B, P, N] (-1: empty) and how many n-grams were ever added [B] (n-gram number q lives in slot q % P)."""

  window: jax.Array = axes_field("batch", None)
  pool: jax.Array = axes_field("batch", None, None)
  added: jax.Array = axes_field("batch")


def prompt_pool(tokens, lengths, n: int, slots: int):
  """The ring buffer [B, slots, n] holding the prompt's last `slots` n-grams (numbers 0..count-1 in slots
  0..count-1, oldest first), and count [B]."""
  b, t = tokens.shape
  k = jnp.arange(slots)
  count = jnp.clip(lengths - n + 1, 0, slots).astype(jnp.int32)
  start = lengths[:, None] - n - (count[:, None] - 1 - k[None, :])  # n-gram k of the last `count`
  ok = k[None, :] < count[:, None]
  idx = jnp.clip(start[:, :, None] + jnp.arange(n)[None, None, :], 0, t - 1)
  grams = jnp.take_along_axis(tokens, idx.reshape(b, -1), axis=1).reshape(b, slots, n)
  return jnp.where(ok[:, :, None], grams, -1).astype(jnp.int32), count


def initial_extra(tokens, lengths, window: int, ngram: int) -> LookaheadState:
  pool, added = prompt_pool(tokens, lengths, ngram, POOL_PER_WINDOW * window)
  # first guesses: the prompt's last tokens (deterministic; any guess is verified)
  idx = jnp.clip(lengths[:, None] - window + jnp.arange(window)[None, :], 0, tokens.shape[1] - 1)
  return LookaheadState(window=jnp.take_along_axis(tokens, idx, axis=1).astype(jnp.int32), pool=pool, added=added)


def build_tree(root, la: LookaheadState, guesses: int) -> tv.Tree:
  """The round's tree [B, 1 + W + G (N - 1)]: the window chain, then the G most recent pool n-grams that
  start with the root token, each a chain under the root (invalid when fewer match)."""
  b, w = la.window.shape
  slots, n = la.pool.shape[1:]
  age = (la.added[:, None] - 1 - jnp.arange(slots)[None, :]) % slots  # 0: the newest n-gram
  match = (la.pool[:, :, 0] == root[:, None]) & (la.pool[:, :, 0] >= 0)
  score, pick = jax.lax.top_k(jnp.where(match, -age, -2 * slots), guesses)  # [B, G]
  ok = score > -2 * slots
  grams = jnp.take_along_axis(la.pool, pick[:, :, None], axis=1)[:, :, 1:]  # [B, G, N - 1]
  m = n - 1
  first = 1 + w + m * jnp.arange(guesses)[:, None]  # node index of each n-gram's first continuation token
  cand_parent = jnp.where(jnp.arange(m)[None, :] == 0, 0, first + jnp.arange(m)[None, :] - 1).reshape(-1)
  tokens = jnp.concatenate([root[:, None], la.window, grams.reshape(b, -1)], axis=1)
  parent = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.arange(w), cand_parent]).astype(jnp.int32)
  depth = jnp.concatenate([jnp.arange(w + 1), jnp.tile(jnp.arange(1, m + 1), guesses)]).astype(jnp.int32)
  valid = jnp.concatenate([jnp.ones((b, 1 + w), bool), jnp.repeat(ok, m, axis=1)], axis=1)
  bk = lambda x: jnp.broadcast_to(x[None], (b,) + x.shape)
  return tv.Tree(tokens=tokens.astype(jnp.int32), parent=bk(parent), depth=bk(depth), valid=valid)


def jacobi_update(la: LookaheadState, tokens, p0, y, n_commit, live) -> LookaheadState:
  """The next window and the pool after a round (module docstring). tokens [B, T] the committed tokens
  before this round's commit; y [B, K] draws after every node (window nodes are 1..W); n_commit [B]."""
  b, w = la.window.shape
  slots, n = la.pool.shape[1:]
  yw = y[:, : w + 1]  # draw after the root and after each window node
  back = jnp.arange(-(n - 2), 1)  # the root and the n - 2 committed tokens before it
  hist = jnp.take_along_axis(tokens, jnp.clip(p0[:, None] + back[None, :], 0, tokens.shape[1] - 1), axis=1)
  chain = jnp.concatenate([hist, la.window], axis=1)  # [B, N - 1 + W]: node j's token at index j + n - 2
  ctx = jnp.arange(w + 1)[:, None] + jnp.arange(n - 1)[None, :]  # [W + 1, N - 1]: the n-1 tokens ending at j
  grams = jnp.concatenate([chain[:, ctx], yw[:, :, None]], axis=2)  # [B, W + 1, N]
  ok = live[:, None] & (p0[:, None] + jnp.arange(w + 1)[None, :] >= n - 2)  # enough history before the root
  q = la.added[:, None] + jnp.cumsum(ok, axis=1) - 1
  slot = jnp.where(ok, q % slots, slots)
  pool = la.pool.at[jnp.arange(b)[:, None], slot].set(grams.astype(jnp.int32), mode="drop")
  # Jacobi shift: the guess for window slot i is the draw after node c + i (past the window: the last one)
  k = jnp.minimum(n_commit[:, None] + jnp.arange(w)[None, :], w)
  window = jnp.where(live[:, None], jnp.take_along_axis(yw, k, axis=1), la.window)
  return LookaheadState(window=window.astype(jnp.int32), pool=pool, added=la.added + jnp.sum(ok, axis=1))


# ---------------------------------------------------------------------------------------------------
# The loop, the stats and the Method
# ---------------------------------------------------------------------------------------------------
def draft(params, st: tv.TreeState, sp, *, guesses: int):
  """The window and pool n-grams below the root as one tree."""
  del params, sp
  root = st.tokens[jnp.arange(st.tokens.shape[0]), st.length - 1]
  return st, build_tree(root, st.extra, guesses)


def after_verify(st: tv.TreeState, new, outputs) -> LookaheadState:
  """The Jacobi and pool update from the target's draws y at every node (live rows only: its own mask)."""
  del new
  y, n_commit = outputs
  return jacobi_update(st.extra, st.tokens, st.length - 1, y, n_commit, ~st.done)


@entry.program(entry.LOOP, donate_argnames=("state",))
def decode_loop(params, state: tv.TreeState, sp, *, cfg: ModelConfig, window, ngram, guesses, greedy, random_init):
  """Rounds of (window + pool n-grams as one tree, one full-depth verify pass, Jacobi and pool update)."""
  drafter = tl.Drafter(
      draft=functools.partial(draft, guesses=guesses),
      max_depth=max(window, ngram - 1),
      after_verify=after_verify,
      mask_done=False,
  )
  return tl.run(params, state, sp, drafter, cfg=cfg, greedy=greedy, random_init=random_init)


@entry.program(entry.INIT)
def initial_state(cache, tokens, lengths, sp, *, cfg: ModelConfig, window: int, ngram: int) -> tv.TreeState:
  del sp, cfg
  return tv.fresh_state(cache, tokens, lengths, initial_extra(tokens, lengths, window, ngram))


def resolve(cfg: ModelConfig, window, ngram, guesses) -> dict:
  """The settings with defaults filled in, or a ValueError naming the bad one (before compiling)."""
  env = {k: DEFAULTS[k] if v is None else v for k, v in dict(window=window, ngram=ngram, guesses=guesses).items()}
  for k, v in env.items():
    if isinstance(v, bool) or not isinstance(v, int):
      raise ValueError(f"method='lookahead' needs an integer {k}, got {v!r}")
  if not 1 <= env["window"] <= 32:
    raise ValueError(f"method='lookahead' needs 1 <= window <= 32, got {env['window']}")
  if not 2 <= env["ngram"] <= 16:
    raise ValueError(f"method='lookahead' needs 2 <= ngram <= 16, got {env['ngram']}")
  if not 1 <= env["guesses"] <= 64:
    raise ValueError(f"method='lookahead' needs 1 <= guesses <= 64, got {env['guesses']}")
  return env


def summarize(st: tv.TreeState, cfg: ModelConfig, window: int, ngram: int, guesses: int):
  r = cfg.recurrence
  return common.DecodeStats.of_loop(
      "lookahead",
      st,
      r,
      settings={
          "recurrence": r,
          "window": window,
          "ngram": ngram,
          "guesses": guesses,
          "draft_layer_calls": 0,
          "verify_layer_calls": (1 + window + guesses * (ngram - 1)) * adaptive.layer_calls(cfg, r),
      },
      per_request=tl.per_request(st),
  )


def make_decoder(cfg: ModelConfig, *, greedy: bool, random_init: bool, **settings) -> common.Decoder:
  env = resolve(cfg, **settings)
  stats, depth = functools.partial(summarize, cfg=cfg, **env), max(env["window"], env["ngram"] - 1)
  init_kw = {"window": env["window"], "ngram": env["ngram"]}
  loop_kw = dict(env, greedy=greedy, random_init=random_init)
  return common.round_decoder(
      "lookahead", cfg, depth, initial_state, decode_loop, stats, init_kw=init_kw, loop_kw=loop_kw
  )


@dataclasses.dataclass(frozen=True)
class Lookahead(Method):
  """Lookahead decoding: a Jacobi `window` and up to `guesses` pool `ngram`s verified as one tree per pass
  (defaults window=5, ngram=4, guesses=5)."""

  name = "lookahead"
  positional = ("window", "ngram", "guesses")
  build_decoder = staticmethod(make_decoder)
  window: Optional[int] = None
  ngram: Optional[int] = None
  guesses: Optional[int] = None

  def validate(self, cfg: ModelConfig) -> None:
    resolve(cfg, self.window, self.ngram, self.guesses)

  @classmethod
  def derived(cls, stats) -> dict:
    return tl.full_depth_figures(stats)
