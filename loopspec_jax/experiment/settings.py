"""The values of experiment settings as the command line and spec strings spell them: 'none', numbers, lists."""

from __future__ import annotations

from typing import Optional

NONE = "none"  # the one spelling of "no value" on the command line and in spec strings


def parse_optional_int(text) -> Optional[int]:
  """'4' -> 4, 'none' -> None (NONE is the one spelling; ints and None pass through)."""
  if text is None or isinstance(text, int):
    return text
  text = str(text).strip()
  if text == NONE:
    return None
  try:
    return int(text)
  except ValueError as e:
    raise ValueError(f"expected an integer or {NONE!r}, got {text!r}") from e


def parse_number(text):
  """'4' -> 4, '0.25' -> 0.25, 'none' -> None (numbers and None pass through)."""
  try:
    return parse_optional_int(text)
  except ValueError:
    try:
      return float(text)
    except ValueError:
      raise ValueError(f"expected a number or {NONE!r}, got {text!r}") from None


def split_list(text) -> list:
  """'a,b' -> ['a', 'b'] (lists and tuples pass through as strings)."""
  if isinstance(text, (list, tuple)):
    return [str(x).strip() for x in text]
  return [x.strip() for x in str(text).split(",") if x.strip()]
