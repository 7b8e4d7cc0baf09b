"""Tokenizing request text without stalling the server's event loop.

HF `tokenizers` holds the GIL in `encode` and for tens to hundreds of milliseconds at the end of
`encode_batch` (measured on a 1 MiB prompt: /health stalled 60-240 ms on a worker thread), so a long prompt
tokenized in the server's process delays every other request. Short texts (under `SUBPROCESS_CHARS`, a few
milliseconds) are encoded on the calling thread; longer ones in a child process that holds only the
tokenizer (started on first use, `python -c` importing nothing but `tokenizers`; one text at a time,
length-prefixed over pipes). The ids are those of `tokenizer.encode(text).ids`.
"""

from __future__ import annotations

import atexit
import struct
import subprocess
import sys
import threading

import numpy as np

SUBPROCESS_CHARS = 1 << 13

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
  ids = np.asarray(tok.encode_batch_fast([data.decode("utf-8")])[0].ids, np.int32).tobytes()
  out.write(struct.pack("<Q", len(ids)) + ids)
  out.flush()
"""


class TextEncoder:
  """encode(text) -> token ids of a `tokenizers.Tokenizer`, long texts in a child process (see the module)."""

  def __init__(self, tokenizer, subprocess_chars: int = SUBPROCESS_CHARS):
    self.tokenizer, self.subprocess_chars = tokenizer, int(subprocess_chars)
    self._child = None
    self._lock = threading.Lock()

  def encode(self, text: str) -> list:
    if len(text) < self.subprocess_chars or not hasattr(self.tokenizer, "to_str"):
      fast = getattr(self.tokenizer, "encode_batch_fast", None)  # releases the GIL while it encodes
      return fast([text])[0].ids if fast is not None else self.tokenizer.encode(text).ids
    with self._lock:
      return self._child_encode(text)

  def _child_encode(self, text: str) -> list:
    if self._child is None or self._child.poll() is not None:
      self._child = subprocess.Popen(
          [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
      )
      atexit.register(self.close)
      self._send(self.tokenizer.to_str().encode("utf-8"))
    self._send(text.encode("utf-8"))
    head = self._child.stdout.read(8)
    if len(head) < 8:
      self.close()
      raise RuntimeError("the tokenizer process died")
    data = self._child.stdout.read(struct.unpack("<Q", head)[0])
    return np.frombuffer(data, np.int32).tolist()

  def _send(self, data: bytes) -> None:
    self._child.stdin.write(struct.pack("<Q", len(data)) + data)
    self._child.stdin.flush()

  def close(self) -> None:
    child, self._child = self._child, None
    if child is not None:
      try:
        child.stdin.close()
        child.wait(timeout=5)
      except (OSError, subprocess.TimeoutExpired):
        child.kill()
