"""Stop token sequences inside the decode loop: a static table checked at every commit.

A request stops, like at eos, at the first committed token with which its OUTPUT (the new tokens, not the
prompt) ends with one of the stop sequences. The sequences travel in `SamplingParams.stops`, an int32 table
[K, L] (K sequences of at most L tokens, each right-aligned and padded with -1 on the left; a row whose last
entry is -1 is padding). K and L are static (one compiled program per table shape: `stop_table` rounds both
up to a power of two, so a handful of shapes serve every task); `stops=None`, the default, compiles no check
at all. A speculative commit appends up to S tokens at once: `stop_hits` looks at every appended position,
and back L - 1 tokens into the committed output, so a sequence straddling two commits is found too;
`common.commit_tokens` then truncates the commit right after the first completed sequence (the sequence's
tokens are kept, as eos is) and marks the request done. Every method commits through `commit_tokens`, so
every method stops at the same token as AR.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

MAX_STOP_TOKENS = 32  # L at most: the longest stop sequence, in tokens
MAX_STOPS = 64  # K at most


def normalize(stops, vocab_size: Optional[int] = None) -> Optional[Tuple[Tuple[int, ...], ...]]:
  """Stop sequences as a tuple of token-id tuples (hashable, deduplicated, in order); None or () -> None.

  ValueError (before anything compiles) for an empty sequence, a non-integer or out-of-vocabulary id, a
  sequence longer than MAX_STOP_TOKENS or more than MAX_STOPS sequences."""
  if stops is None:
    return None
  if isinstance(stops, (str, bytes)) or not isinstance(stops, Sequence):
    raise ValueError(f"stop sequences must be a list of token-id lists, got {type(stops).__name__}")
  out = []
  for i, seq in enumerate(stops):
    if isinstance(seq, (str, bytes)) or not isinstance(seq, (Sequence, np.ndarray)):
      raise ValueError(f"stop sequence {i} must be a list of token ids, got {seq!r}")
    seq = list(np.asarray(seq).reshape(-1).tolist()) if isinstance(seq, np.ndarray) else list(seq)
    if not seq:
      raise ValueError(f"stop sequence {i} is empty")
    if len(seq) > MAX_STOP_TOKENS:
      raise ValueError(f"stop sequence {i} has {len(seq)} tokens; at most {MAX_STOP_TOKENS} fit the stop table")
    for t in seq:
      if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
        raise ValueError(f"stop sequence {i} has token id {t!r}, not a non-negative integer")
      if vocab_size is not None and t >= vocab_size:
        raise ValueError(f"stop sequence {i} has token id {t} outside the vocabulary [0, {vocab_size})")
    seq = tuple(int(t) for t in seq)
    if seq not in out:
      out.append(seq)
  if len(out) > MAX_STOPS:
    raise ValueError(f"{len(out)} stop sequences; at most {MAX_STOPS} fit the stop table")
  return tuple(out) or None


def _pow2(n: int, floor: int) -> int:
  p = floor
  while p < n:
    p *= 2
  return p


def stop_table(stops) -> Optional[np.ndarray]:
  """The int32 table [K, L] of `normalize`d stop sequences (None for none): K and L rounded up to powers of two
  (K >= 1, L >= 2), each sequence right-aligned, -1 elsewhere."""
  stops = normalize(stops)
  if stops is None:
    return None
  k = _pow2(len(stops), 1)
  width = _pow2(max(len(s) for s in stops), 2)
  table = np.full((k, width), -1, np.int32)
  for i, s in enumerate(stops):
    table[i, width - len(s) :] = s
  return table


def stop_hits(tokens, length, n_new, y, table) -> jax.Array:
  """Whether the output ends with a stop sequence once y[:, j] is appended: bool [B, S].

  tokens [B, T] committed (prompt then output; length [B] of them, n_new [B] of which are output), y [B, S]
  the tokens a commit appends at positions length .. length + S - 1, table [K, L]. Position j looks at the
  L - 1 committed tokens before the commit and y[:, :j + 1]; a sequence token may only match output (never a
  prompt token). Positions past what the commit really appends are for the caller to ignore."""
  b, s = y.shape
  k, width = table.shape
  back = jnp.arange(width - 1) - (width - 1)  # offsets -(L-1) .. -1 from the commit's first position
  pos = jnp.clip(length[:, None] + back[None, :], 0, tokens.shape[1] - 1)
  prev = jnp.take_along_axis(tokens, pos, axis=1)  # [B, L-1]
  window = jnp.concatenate([prev, y], axis=1)  # [B, L-1+S]
  is_output = jnp.concatenate([back[None, :] >= -n_new[:, None], jnp.ones((b, s), bool)], axis=1)
  idx = jnp.arange(s)[:, None] + jnp.arange(width)[None, :]  # [S, L]: the L tokens ending at each position
  win, out = window[:, idx], is_output[:, idx]  # [B, S, L]
  need = table >= 0  # [K, L]
  match = (win[:, :, None, :] == table[None, None]) & out[:, :, None, :]  # [B, S, K, L]
  hit = jnp.all(match | ~need[None, None], axis=-1) & need[None, None, :, -1]  # [B, S, K]
  return jnp.any(hit, axis=-1)


def text_stops(texts: Sequence[str], encode: Callable[[str], list], decode: Callable[[list], str]) -> list:
  """Token sequences that spell the stop strings `texts`, for an early exit inside the decode loop.

  A string's tokens in the output depend on what precedes it (byte-level BPE merges a leading space into the
  word: "Q:" after a space is [" Q", ":"], not ["Q", ":"]), so each string gives two sequences: its own
  encoding and, for a string that does not start with whitespace, the encoding of " " + string. A variant is
  kept only if it decodes to text containing the string: then the loop only ever stops where the text holds a
  stop string, and the text cut at the first stop string (`integrations.lm_eval.cut_at_stops`) is the text a
  decode to the budget would give. Other spellings (a stop string fused into a larger token, "\n\n" as two
  "\n") just do not end the loop early. Empty strings are ignored; a variant longer than MAX_STOP_TOKENS
  tokens is dropped (the text cut still applies)."""
  out = []
  for text in texts:
    if not text:
      continue
    variants = [text] if text[0].isspace() else [text, " " + text]
    for v in variants:
      seq = list(encode(v))
      if seq and len(seq) <= MAX_STOP_TOKENS and text in decode(seq) and tuple(seq) not in out:
        out.append(tuple(seq))
  return out[:MAX_STOPS]


def cut_tokens(tokens: Sequence[int], stops) -> list:
  """`tokens` up to and including the end of the first stop sequence they contain (host-side, for tests and
  for outputs assembled from several decode calls)."""
  stops = normalize(stops) or ()
  tokens = list(tokens)
  for j in range(len(tokens)):
    for s in stops:
      if j + 1 >= len(s) and tuple(tokens[j + 1 - len(s) : j + 1]) == s:
        return tokens[: j + 1]
  return tokens
