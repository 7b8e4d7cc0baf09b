"""Tokenizing request text without stalling the server's event loop or serialising requests.

HF `tokenizers` holds the GIL in `encode` and for tens to hundreds of milliseconds at the end of
`encode_batch` (measured on a 1 MiB prompt: /health stalled 60-240 ms on a worker thread), so a long prompt
tokenized in the server's process delays every other request. Short texts (under `SUBPROCESS_CHARS`, a few
milliseconds) are encoded on the calling thread; longer ones in child processes that hold only the tokenizer
(started on first use, `python -c` importing nothing but `tokenizers`; length-prefixed over pipes). Up to
`children` of them run at once, so one long text does not hold up another; a child that died (killed, out of
memory) is replaced and the text sent again once. The ids are those of `tokenizer.encode(text).ids`.

`max_chars(n)` is a cheap bound: a text longer than it has more than n tokens for certain (every token's text
is at most `max_token_chars` characters), so an oversized prompt is refused before it is tokenized.
"""

from __future__ import annotations

import atexit
import json
import struct
import subprocess
import sys
import threading
from typing import Optional

import numpy as np

SUBPROCESS_CHARS = 1 << 13
CHILDREN = 2  # tokenizer processes at most (each a few MB)

_CHILD = r"""
import struct, sys
import numpy as np
import tokenizers
inp, out = sys.stdin.buffer, sys.stdout.buffer
def read():
  head = inp.read(8)
  return None if len(head) < 8 else inp.read(struct.unpack("<Q", head)[0])
tok = tokenizers.Tokenizer.from_str(read().decode("utf-8"))
while True:
  data = read()
  if data is None:
    break
  text = [data[1:].decode("utf-8")]
  ids = np.asarray(tok.encode_batch_fast(text, add_special_tokens=data[:1] == b"1")[0].ids, np.int32).tobytes()
  out.write(struct.pack("<Q", len(ids)) + ids)
  out.flush()
"""


def max_token_chars(tokenizer) -> Optional[int]:
  """The most characters any one token stands for (None: unknown, or a normalizer that may shrink text).

  A vocabulary entry's string is at least as long as the text it covers: byte-level BPE spells each byte as one
  character, WordPiece / SentencePiece only add markers ('##', a space marker)."""
  try:
    spec = json.loads(tokenizer.to_str())
    vocab = tokenizer.get_vocab(with_added_tokens=True)
  except (AttributeError, TypeError, ValueError):
    return None
  if spec.get("normalizer") is not None:
    return None
  return max((len(t) for t in vocab), default=1)


class TextEncoder:
  """encode(text) -> token ids of a `tokenizers.Tokenizer`, long texts in child processes (see the module)."""

  def __init__(self, tokenizer, subprocess_chars: int = SUBPROCESS_CHARS, children: int = CHILDREN):
    self.tokenizer, self.subprocess_chars, self.children = tokenizer, int(subprocess_chars), int(children)
    self.max_token_chars = max_token_chars(tokenizer)
    self._idle: list = []  # started children waiting for a text
    self._started = 0
    self._cond = threading.Condition()
    self._all: list = []
    atexit.register(self.close)

  def max_chars(self, n_tokens: int) -> Optional[int]:
    """Texts longer than this have more than n_tokens tokens (None: no bound known)."""
    return None if self.max_token_chars is None else int(n_tokens) * self.max_token_chars

  def encode(self, text: str, add_special_tokens: bool = True) -> list:
    if len(text) < self.subprocess_chars or not hasattr(self.tokenizer, "to_str"):
      fast = getattr(self.tokenizer, "encode_batch_fast", None)  # releases the GIL while it encodes
      if fast is not None:
        return fast([text], add_special_tokens=add_special_tokens)[0].ids
      return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    child = self._take()
    try:
      try:
        ids = self._child_encode(child, text, add_special_tokens)
      except OSError:  # the child died (killed, out of memory): a fresh one, once
        self._kill(child)
        child = self._spawn()
        ids = self._child_encode(child, text, add_special_tokens)
    except BaseException:
      self._kill(child)
      with self._cond:
        self._started -= 1
        self._cond.notify()
      raise
    with self._cond:
      self._idle.append(child)
      self._cond.notify()
    return ids

  @property
  def pids(self) -> list:
    """Process ids of the children alive now (tests kill one)."""
    return [c.pid for c in self._all if c.poll() is None]

  def _take(self):
    """An idle child, a new one while fewer than `children` run, else waits for one."""
    with self._cond:
      while True:
        while self._idle:
          child = self._idle.pop()
          if child.poll() is None:
            return child
          self._started -= 1
        if self._started < self.children:
          self._started += 1
          break
        self._cond.wait()
    try:
      return self._spawn()
    except BaseException:
      with self._cond:
        self._started -= 1
        self._cond.notify()
      raise

  def _spawn(self):
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    self._all = [c for c in self._all if c.poll() is None] + [child]
    _send(child, self.tokenizer.to_str().encode("utf-8"))
    return child

  @staticmethod
  def _child_encode(child, text: str, add_special_tokens: bool) -> list:
    _send(child, (b"1" if add_special_tokens else b"0") + text.encode("utf-8"))
    head = child.stdout.read(8)
    if len(head) < 8:
      raise BrokenPipeError("the tokenizer process died")
    data = child.stdout.read(struct.unpack("<Q", head)[0])
    return np.frombuffer(data, np.int32).tolist()

  @staticmethod
  def _kill(child) -> None:
    try:
      child.kill()
      child.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
      pass

  def close(self) -> None:
    with self._cond:
      children, self._all, self._idle, self._started = self._all, [], [], 0
    for child in children:
      try:
        child.stdin.close()
        child.wait(timeout=5)
      except (OSError, subprocess.TimeoutExpired):
        child.kill()


def _send(child, data: bytes) -> None:
  child.stdin.write(struct.pack("<Q", len(data)) + data)
  child.stdin.flush()
