"""Log-probabilities for `logprobs` / `echo` completions: the full-depth model's, of the prompt and of what
was generated, from one full-sequence forward after the request finishes.

They are the target distribution's raw log-probabilities (full depth R, before temperature / top-k / top-p),
the numbers lm-eval's `local-completions` sums to score a loglikelihood task, and the same numbers as the
in-process lm-eval backend (`integrations/lm_eval.py LoopSpecLM.logprobs`: the same readout at depth R, the
sequence padded with eos to a power-of-two length so that a handful of lengths compile).
"""

from __future__ import annotations

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


def completion_logprobs(model, prompt: list, completion: list, top: int, echo: bool, text_of) -> dict:
  """OpenAI's `logprobs` object of a completion: tokens, token_logprobs, top_logprobs (the `top` most likely
  tokens at each position, as {token text: logprob}) and text_offset; with `echo` the prompt's tokens come
  first (the first one has no logprob: None). `text_of(ids)` decodes token ids."""
  seq = list(prompt) + list(completion)
  lp = next_token_logprobs(model, seq[:-1]) if len(seq) > 1 else np.zeros((0, model.config.vocab_size))
  first = 0 if echo else len(prompt)
  tokens, token_lp, top_lp, offsets, offset = [], [], [], [], 0
  for i in range(first, len(seq)):
    piece = text_of([seq[i]])
    tokens.append(piece)
    offsets.append(offset)
    offset += len(piece)
    if i == 0:
      token_lp.append(None)
      top_lp.append(None)
      continue
    row = lp[i - 1]
    token_lp.append(float(row[seq[i]]))
    best = np.argsort(-row)[: max(top, 1)] if top > 0 else []
    top_lp.append({text_of([int(t)]): float(row[t]) for t in best} | {piece: float(row[seq[i]])} if top > 0 else {})
  return {"tokens": tokens, "token_logprobs": token_lp, "top_logprobs": top_lp, "text_offset": offsets}
