"""Prompt lookup (n-gram) speculation: drafts copied from earlier text, verified at full depth, zero draft cost.

Each round, per request: the last `ngram` committed tokens are searched for in the committed text (prompt and
generated tokens) before them; the most recent occurrence wins, and shorter suffixes are tried when the longest
has none (down to one token). The drafts are the gamma tokens that followed that occurrence, continued
periodically when they run into the present (a match c tokens back predicts period c). The target verifies
them like any drafts (`draft.verify_round`: one full-depth pass over gamma + 1 positions); q is one-hot, so a
draft is accepted with probability p(x) and a rejection draws from p without x, renormalised, which is exact.
A request without any match offers no draft (its round commits one token from p). `gamma="auto"` is
accepted for uniformity and picks the compiled maximum, since drafts cost nothing (`decoding/adaptive.py`).
`candidates=C > 1` drafts the continuations of the C best distinct matches and verifies them as one token
tree (`tree/lookup_tree.py`); `candidates=1` (the default) is this chain path.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Union

import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding.method import Method
from loopspec_jax.decoding import draft
from loopspec_jax.decoding.tree import lookup_tree
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import entry

DEFAULT_NGRAM = 3


def ngram_drafts(tokens, length, ngram: int, gamma: int):
  """Drafts [B, gamma] int32 and whether a match was found [B] for committed tokens [B, T] of length [B].

  A match of the n-token suffix tokens[L-n:L] is a start j with tokens[j:j+n] equal to it and j + n <= L - 1
  (at least one token follows it); the largest n in ngram..1 with a match, then the largest j, wins. Drafts
  are tokens[c + (i mod (L - c))], i < gamma, for the continuation start c = j + n.
  """
  b, t = tokens.shape
  bi = jnp.arange(b)
  padded = jnp.pad(tokens, ((0, 0), (0, ngram)))
  starts = jnp.arange(t)[None, :]
  best = jnp.full((b,), -1, jnp.int32)  # continuation start c of the chosen match (-1: none yet)
  for n in range(ngram, 0, -1):
    ok = starts + n <= length[:, None] - 1
    for i in range(n):
      suffix_tok = tokens[bi, jnp.clip(length - n + i, 0, t - 1)]
      ok = ok & (padded[:, i : i + t] == suffix_tok[:, None])
    j = jnp.max(jnp.where(ok, starts, -1), axis=1)
    best = jnp.where((best < 0) & (j >= 0), j + n, best)
  found = best >= 0
  c = jnp.where(found, best, 0)
  period = jnp.maximum(length - c, 1)
  idx = c[:, None] + jnp.arange(gamma)[None, :] % period[:, None]
  drafts = jnp.take_along_axis(tokens, jnp.clip(idx, 0, t - 1), axis=1)
  return drafts.astype(jnp.int32), found


@entry.program(entry.LOOP, donate_argnames=("state",))
def decode_loop(
    params,
    state: draft.SpecState,
    sp: common.SamplingParams,
    *,
    cfg: ModelConfig,
    ngram: int,
    gamma: int,
    auto: bool,
    greedy: bool,
    random_init: bool,
):
  """Rounds of n-gram lookup + one full-depth verify pass until every request is done."""
  params = M.prepare_params(params, cfg)
  fixed_cost = float(adaptive.layer_calls(cfg, cfg.recurrence))

  def round_(st: draft.SpecState) -> draft.SpecState:
    drafts, found = ngram_drafts(st.tokens, st.length, ngram, gamma)
    n_max = draft.offered(st, sp, draft.gamma_of(st, gamma, auto, 0.0, fixed_cost))
    n_max = jnp.where(found, n_max, 0)
    return draft.verify_round(params, st, sp, drafts, None, n_max, cfg=cfg, greedy=greedy, random_init=random_init)

  return common.loop_until_done(round_, state, sp)


@entry.program(entry.INIT)
def initial_state(cache, tokens, lengths, sp: common.SamplingParams, *, cfg: ModelConfig) -> draft.SpecState:
  del sp, cfg
  return draft.fresh_state(cache, None, tokens, lengths)


def validate_ngram(ngram) -> int:
  ngram = DEFAULT_NGRAM if ngram is None else ngram
  if isinstance(ngram, bool) or int(ngram) != ngram or not 1 <= ngram <= 16:
    raise ValueError(f"lookup needs an integer ngram in 1..16, got {ngram!r}")
  return int(ngram)


def make_decoder(cfg: ModelConfig, *, greedy: bool, random_init: bool, ngram, gamma) -> common.Decoder:
  """The Decoder of method='lookup' (ngram default 3; gamma an integer >= 1 or 'auto')."""
  ngram = validate_ngram(ngram)
  g, auto = adaptive.parse_gamma("lookup", gamma)
  stats = functools.partial(
      draft.summarize,
      cfg=cfg,
      method="lookup",
      gamma="auto" if auto else g,
      gamma_max=g,
      draft_cost=0.0,
      settings={"ngram": ngram},
  )
  loop_kw = {"ngram": ngram, "gamma": g, "auto": auto, "greedy": greedy, "random_init": random_init}
  return common.round_decoder("lookup", cfg, g, initial_state, decode_loop, stats, loop_kw=loop_kw)


@dataclasses.dataclass(frozen=True)
class Lookup(Method):
  """Prompt lookup: the continuation of the latest earlier match of the last `ngram` tokens, `gamma` drafts;
  with `candidates` > 1 the continuations of that many distinct matches, verified as one tree."""

  name = "lookup"
  positional = ("ngram", "gamma")
  separate_drafter = True
  ngram: Optional[int] = None
  gamma: Union[int, str, None] = None
  candidates: Optional[int] = None

  def validate(self, cfg: ModelConfig) -> None:
    validate_ngram(self.ngram)
    adaptive.parse_gamma("lookup", self.gamma)
    lookup_tree.validate_candidates(self.candidates)

  def make_decoder(self, cfg: ModelConfig, *, greedy: bool, random_init: bool) -> common.Decoder:
    c = lookup_tree.validate_candidates(self.candidates)
    if c > 1:
      return lookup_tree.make_decoder(
          cfg, greedy=greedy, random_init=random_init, ngram=validate_ngram(self.ngram), gamma=self.gamma, candidates=c
      )
    return make_decoder(cfg, greedy=greedy, random_init=random_init, ngram=self.ngram, gamma=self.gamma)

  @classmethod
  def derived(cls, stats) -> dict:
    if stats.settings.get("candidates", 1) > 1:
      out = tv.tree_figures(stats)
      out["tokens_per_r_steps"] = out["tau"]
      return out
    return draft.draft_figures(stats)
