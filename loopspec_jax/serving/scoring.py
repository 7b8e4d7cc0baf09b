"""Log-probabilities for `logprobs` / `echo` completions: the full-depth model's, of the prompt and of what
was generated, from one full-sequence forward after the request finishes.

They are the target distribution's raw log-probabilities (full depth R, before temperature / top-k / top-p),
the numbers lm-eval's `local-completions` sums to score a loglikelihood task, and the same numbers as the
in-process lm-eval backend (`integrations/lm_eval.py LoopSpecLM.logprobs`: the same readout at depth R, the
sequence padded with eos to a power-of-two length so that a handful of lengths compile).
"""

from __future__ import annotations

import functools
import json
from typing import Optional

import numpy as np

import loopspec_jax

_MIN_PAD = 32  # as integrations/lm_eval.py: the same padded shapes, the same compiled readouts


def pad_length(n: int, max_len: int) -> int:
  p = _MIN_PAD
  while p < n:
    p *= 2
  return min(p, max_len)


def log_softmax(logits: np.ndarray) -> np.ndarray:
  x = np.asarray(logits, np.float64)
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def next_token_logprobs(model, ids: list) -> np.ndarray:
  """float64 [T, V]: log p(next token | ids[:t + 1]) at full depth, for each position t of `ids`."""
  cfg = model.config
  n = len(ids)
  pad = cfg.eos_id if cfg.eos_id is not None and cfg.eos_id >= 0 else 0
  padded = list(ids) + [pad] * (pad_length(n, cfg.max_len) - n)
  return log_softmax(loopspec_jax.readouts(model, padded, depths=[cfg.recurrence])[0, :n])


@functools.lru_cache(maxsize=8)
def _byte_decoder(tokenizer) -> Optional[dict]:
  """GPT-2's byte-level alphabet reversed (character -> byte) when `tokenizer` decodes byte-level, else None."""
  try:
    if json.loads(tokenizer.to_str()).get("decoder", {}).get("type") != "ByteLevel":
      return None
  except (AttributeError, TypeError, ValueError):
    return None
  keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
  extra = [b for b in range(256) if b not in keep]
  return {chr(b): b for b in keep} | {chr(256 + i): b for i, b in enumerate(extra)}


def token_bytes(model, token: int) -> bytes:
  """The exact bytes one token adds to the decoded text (b'' for a special token the decoder skips). Byte-level
  tokenizers: the token's own bytes, also when it holds only part of a character; others: its decoded text."""
  tok = model.tokenizer
  if tok is None:
    return b""
  text = model.decode([int(token)])
  table = _byte_decoder(tok)
  piece = tok.id_to_token(int(token)) if table is not None and text else None
  if piece is not None and all(c in table for c in piece):
    return bytes(table[c] for c in piece)
  return text.encode("utf-8")


def token_string(data: bytes) -> str:
  """A token's text as OpenAI writes it: its UTF-8 text, or 'bytes:\\xe2\\x80' for part of a character."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def completion_logprobs(model, prompt: list, completion: list, top: int, echo: bool, text_chars=None) -> dict:
  """OpenAI's `logprobs` object of a completion: tokens, token_logprobs, top_logprobs (the `top` most likely
  tokens at each position, as {token: logprob}), text_offset, and `bytes` (each token's UTF-8 bytes, as OpenAI's
  chat logprobs give them); with `echo` the prompt's tokens come first (the first one has no logprob: None).

  Tokens are byte-exact (`token_string`): their bytes join to the text, and text_offset[i] is the character of
  the text where token i's first byte lies. `text_chars`: the completion's text was cut there (a stop string):
  tokens that start at or after the cut are left out and the last one is clipped to it, so text, tokens and
  offsets end together (the choice's token_ids and usage still end at the token that completed the stop)."""
  seq = list(prompt) + list(completion)
  lp = next_token_logprobs(model, seq[:-1]) if len(seq) > 1 else np.zeros((0, model.config.vocab_size))
  first = 0 if echo else len(prompt)
  data = [token_bytes(model, t) for t in seq[first:]]
  cut, full = None, model.decode(completion) if text_chars is not None else ""
  if text_chars is not None and text_chars < len(full):
    head = sum(len(d) for d in data[: len(seq) - len(completion) - first])  # the echoed prompt's bytes
    cut = head + len(full[:text_chars].encode("utf-8"))
  out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": [], "bytes": []}
  done = b""
  for i, piece in zip(range(first, len(seq)), data):
    if cut is not None and len(done) >= cut:
      break
    if cut is not None:
      piece = piece[: max(cut - len(done), 0)]
    out["text_offset"].append(len(done.decode("utf-8", "ignore")))
    out["tokens"].append(token_string(piece))
    out["bytes"].append(list(piece))
    done += piece
    if i == 0:
      out["token_logprobs"].append(None)
      out["top_logprobs"].append(None)
      continue
    row = lp[i - 1]
    out["token_logprobs"].append(float(row[seq[i]]))
    best = np.argsort(-row)[:top] if top > 0 else []
    alts = {token_string(token_bytes(model, int(t))): float(row[t]) for t in best}
    out["top_logprobs"].append(alts | {out["tokens"][-1]: float(row[seq[i]])} if top > 0 else {})
  return out
