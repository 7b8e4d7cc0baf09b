"""Shared helpers for the model configs in this folder.

Every module here exposes `get_config(arg=None)` returning an `ml_collections.ConfigDict` whose keys are exactly
the `loopspec_jax.config.ModelConfig` field names, so `from_config_dict(get_config())` builds the ModelConfig.
`arg` (as passed by `config_flags`, e.g. `--config=configs/models/ouro_1p4b.py:dtype=bfloat16,recurrence=8`)
is an optional comma-separated list of `field=value` overrides.
"""
from __future__ import annotations

import ast
import dataclasses

import ml_collections

from loopspec_jax.config import ModelConfig


def _parse_value(text: str):
  """A Python literal if it parses as one (ints, floats, tuples, None, True), else the raw string."""
  low = text.strip()
  if low.lower() in ("true", "false"):
    return low.lower() == "true"
  if low.lower() == "none":
    return None
  try:
    return ast.literal_eval(low)
  except (ValueError, SyntaxError):
    return low


def parse_overrides(arg) -> dict:
  """'dtype=bfloat16,recurrence=8' -> {'dtype': 'bfloat16', 'recurrence': 8}. Empty/None -> {}."""
  if not arg:
    return {}
  items, depth, cur = [], 0, ""
  for ch in str(arg):  # split on commas outside brackets, so `rope_llama3=(8.0,1.0,4.0,16)` stays whole
    if ch in "([":
      depth += 1
    elif ch in ")]":
      depth -= 1
    if ch == "," and depth == 0:
      items.append(cur)
      cur = ""
    else:
      cur += ch
  items.append(cur)
  out = {}
  for item in items:
    item = item.strip()
    if not item:
      continue
    if "=" not in item:
      raise ValueError(f"config override {item!r} is not of the form field=value")
    key, value = item.split("=", 1)
    out[key.strip()] = _parse_value(value)
  return out


def model_config(arg=None, **fields) -> ml_collections.ConfigDict:
  """A ConfigDict holding every ModelConfig field: the given values, the dataclass defaults for the rest,
  then the overrides parsed from `arg`."""
  names = [f.name for f in dataclasses.fields(ModelConfig)]
  values = {}
  for f in dataclasses.fields(ModelConfig):
    if f.default is not dataclasses.MISSING:
      values[f.name] = f.default
  for key, value in list(fields.items()) + list(parse_overrides(arg).items()):
    if key not in names:
      raise ValueError(f"unknown ModelConfig field {key!r}")
    if key in ("rope_theta", "norm_eps", "embed_scale", "init_std") and isinstance(value, int):
      value = float(value)
    if key == "rope_llama3" and value is not None:
      value = tuple(value)
    values[key] = value
  missing = [n for n in names if n not in values]
  if missing:
    raise ValueError(f"missing ModelConfig fields: {missing}")
  return ml_collections.ConfigDict({n: values[n] for n in names})
