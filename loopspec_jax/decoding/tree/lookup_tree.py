"""Prompt lookup with several matches (`method="lookup", candidates=C > 1`): C continuations, ONE verified tree.

Per request and round: every continuation start c (1 <= c <= L - 1 in the committed text of length L) has a
match length m(c), the largest n <= ngram with tokens[c - n:c] equal to the last n committed tokens (0: none).
Candidates are ranked by (m(c), c): longer matches first, then the most recent, which is exactly the one
match `decoding/lookup.py` drafts from (so candidate 1 is the chain's drafts). The C best starts whose gamma
continuation tokens (tokens[c + (i mod (L - c))], continued periodically into the present as the chain path
does) differ from every better-ranked pick are taken; each becomes a chain of gamma nodes under the root, and
the one tree verifier (`tree/verify.py`: shared prefixes merged by `normalize`, one full-depth pass, AR's
draws at every node, the accepted path written to the cache) checks them all at once. The drafts depend
only on committed tokens, so greedy and sampled output are AR's token for token. A candidate is only drafted
as deep as the budget left after the round's target token (as the chain path offers), and requests without
any match verify the root alone. `candidates=1` is the chain path itself (`lookup.py`); `gamma="auto"`
compiles and always drafts the maximum here (drafts cost nothing).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.parallel import entry

MAX_CANDIDATES = 16


def match_lengths(tokens, length, ngram: int):
  """m [B, T] int32: for continuation start c, the largest n <= ngram with tokens[c - n:c] equal to the last n
  committed tokens tokens[L - n:L], for 1 <= c <= L - 1 (0 elsewhere or without a match)."""
  b, t = tokens.shape
  bi = jnp.arange(b)
  c = jnp.arange(t)[None, :]
  ok = (c >= 1) & (c <= length[:, None] - 1)
  m = jnp.zeros((b, t), jnp.int32)
  for n in range(1, ngram + 1):
    last = tokens[bi, jnp.clip(length - n, 0, t - 1)]
    ok = ok & (c - n >= 0) & (jnp.take_along_axis(tokens, jnp.clip(c - n, 0, t - 1), axis=1) == last[:, None])
    m = m + ok
  return m


def continuations(tokens, length, gamma: int):
  """cont [B, T, gamma]: the gamma tokens from every start c, continued periodically (period L - c)."""
  b, t = tokens.shape
  c = jnp.arange(t)[None, :, None]
  period = jnp.maximum(length[:, None, None] - c, 1)
  idx = jnp.clip(c + jnp.arange(gamma)[None, None, :] % period, 0, t - 1)
  return jnp.take_along_axis(tokens, idx.reshape(b, -1), axis=1).reshape(b, t, gamma)


def pick_candidates(tokens, length, ngram: int, gamma: int, candidates: int):
  """(drafts [B, C, gamma] int32, found [B, C] bool): the C best-ranked starts with distinct continuations
  (module docstring); candidate 0 equals `lookup.ngram_drafts`."""
  t = tokens.shape[1]
  m = match_lengths(tokens, length, ngram)
  key = jnp.where(m > 0, m * t + jnp.arange(t)[None, :], -1)
  cont = continuations(tokens, length, gamma)
  picked, found = [], []
  for _ in range(candidates):
    k = key
    for p in picked:
      k = jnp.where(jnp.all(cont == p[:, None, :], axis=2), -1, k)
    best = jnp.argmax(k, axis=1)
    found.append(jnp.max(k, axis=1) >= 0)
    picked.append(jnp.take_along_axis(cont, best[:, None, None], axis=1)[:, 0])
  return jnp.stack(picked, axis=1).astype(jnp.int32), jnp.stack(found, axis=1)


def build_tree(root, drafts, found, n_max) -> tv.Tree:
  """The tree [B, 1 + C gamma]: candidate i is the chain of nodes 1 + i gamma .. (i + 1) gamma under the root;
  node depth d is valid iff the candidate was found and d <= n_max [B]."""
  b, cands, gamma = drafts.shape
  d = jnp.tile(jnp.arange(1, gamma + 1), cands)
  node = 1 + jnp.arange(cands * gamma)
  parent = jnp.where(d == 1, 0, node - 1)
  bk = lambda x: jnp.broadcast_to(x[None], (b,) + x.shape).astype(jnp.int32)
  valid = jnp.repeat(found, gamma, axis=1) & (d[None, :] <= n_max[:, None])
  return tv.Tree(
      tokens=jnp.concatenate([root[:, None], drafts.reshape(b, -1)], axis=1).astype(jnp.int32),
      parent=bk(jnp.concatenate([jnp.zeros((1,), jnp.int32), parent])),
      depth=bk(jnp.concatenate([jnp.zeros((1,), jnp.int32), d])),
      valid=jnp.concatenate([jnp.ones((b, 1), bool), valid], axis=1),
  )


def draft(params, st: tv.TreeState, sp, *, ngram: int, gamma: int, candidates: int):
  """C n-gram continuations of the committed text below the root as one tree."""
  del params
  drafts, found = pick_candidates(st.tokens, st.length, ngram, gamma, candidates)
  n_max = jnp.where(st.done, 0, jnp.minimum(gamma, jnp.maximum(sp.max_new - st.n_new - 1, 0)))
  return st, build_tree(st.tokens[jnp.arange(st.tokens.shape[0]), st.length - 1], drafts, found, n_max)


@entry.program(entry.LOOP, donate_argnames=("state",))
def decode_loop(params, state: tv.TreeState, sp, *, cfg: ModelConfig, ngram, gamma, candidates, greedy, random_init):
  """Rounds of (C n-gram continuations as one tree, one full-depth verify pass) until every request is done."""
  drafter = tl.Drafter(draft=functools.partial(draft, ngram=ngram, gamma=gamma, candidates=candidates), max_depth=gamma)
  return tl.run(params, state, sp, drafter, cfg=cfg, greedy=greedy, random_init=random_init)


def validate_candidates(candidates) -> int:
  candidates = 1 if candidates is None else candidates
  if isinstance(candidates, bool) or not isinstance(candidates, int) or not 1 <= candidates <= MAX_CANDIDATES:
    raise ValueError(f"lookup needs an integer candidates in 1..{MAX_CANDIDATES}, got {candidates!r}")
  return candidates


def summarize(st: tv.TreeState, cfg: ModelConfig, ngram: int, gamma, gamma_max: int, candidates: int):
  """Raw counts of a several-match lookup run (figures: `verify.tree_figures`)."""
  r = cfg.recurrence
  return common.DecodeStats.of_loop(
      "lookup",
      st,
      r,
      settings={
          "ngram": ngram,
          "candidates": candidates,
          "recurrence": r,
          "gamma": gamma,
          "gamma_max": gamma_max,
          "draft_layer_calls": 0,
          "verify_layer_calls": (1 + candidates * gamma_max) * adaptive.layer_calls(cfg, r),
      },
      per_request=tl.per_request(st),
  )


def make_decoder(cfg: ModelConfig, *, greedy: bool, random_init: bool, ngram: int, gamma, candidates: int):
  """The Decoder of method='lookup' with candidates > 1 (ngram validated by the caller)."""
  g, auto = adaptive.parse_gamma("lookup", gamma)
  stats = functools.partial(
      summarize, cfg=cfg, ngram=ngram, gamma="auto" if auto else g, gamma_max=g, candidates=candidates
  )
  loop_kw = {"ngram": ngram, "gamma": g, "candidates": candidates, "greedy": greedy, "random_init": random_init}
  return common.round_decoder("lookup", cfg, g, tl.initial_state, decode_loop, stats, loop_kw=loop_kw)
