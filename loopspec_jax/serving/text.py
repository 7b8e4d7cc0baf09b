"""Text of a request's committed tokens: stop strings found token by token, and text held back while it may
still become one.

Why token by token: a device call commits a variable number of tokens per slot (speculation commits several
at once, and how many a call commits depends on what else is in the batch), so a stop string must be judged
as if the tokens arrived one at a time. The request ends at the FIRST token whose prefix text contains a stop
string: its text is cut where that stop string starts, and its token ids (and usage) end at that token, so
they are the same however the tokens were batched into calls (vLLM's rule).

Why hold back: a streamed chunk must never send characters that a later token turns into the start of a
stop string, or streamed text would differ from non-streamed text. While the text ends with a proper prefix of
some stop string (or with an incomplete UTF-8 sequence, U+FFFD), those characters wait for the next tokens.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence


def find_stop(text: str, stops: Sequence[str], start: int) -> Optional[int]:
  """Index of the earliest stop string in text[start:] (None when none occurs)."""
  hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
  return min(hits) if hits else None


def held_back(text: str, stops: Sequence[str]) -> int:
  """How many trailing characters of `text` must wait: the longest proper prefix of a stop string that `text`
  ends with, or the trailing U+FFFD of an incomplete UTF-8 sequence, whichever is longer."""
  hold = len(text) - len(text.rstrip("\ufffd"))
  for s in stops:
    for j in range(min(len(s) - 1, len(text)), hold, -1):
      if text.endswith(s[:j]):
        hold = j
        break
  return hold


def first_stop(decode: Callable[[list], str], body: list, stops: Sequence[str], scanned: int) -> Optional[tuple]:
  """(k, cut): the first k > scanned with a stop string in decode(body[:k]), which starts at character `cut`;
  None when decode(body) has none past the characters already scanned (body[:scanned] had no stop string).

  One decode of the whole body settles the common case (no stop string); only when it finds one are the
  prefixes decoded one token at a time, from `scanned + 1` on."""
  longest = max((len(s) for s in stops), default=0)
  if not stops or len(body) <= scanned:
    return None
  start = max(0, len(decode(body[:scanned])) - longest + 1) if scanned else 0
  if find_stop(decode(body), stops, start) is None:
    return None
  for k in range(scanned + 1, len(body) + 1):  # k = len(body) is the text just searched: it returns
    cut = find_stop(decode(body[:k]), stops, start)
    if cut is not None:
      return k, cut
  return None
