"""Helpers shared by the experiment entry points: resolving a model spec, parsing method specs, timing."""
from __future__ import annotations

import importlib
import json
import os
import tempfile
from typing import Optional

import numpy as np

import loopspec_jax
from loopspec_jax import api
from loopspec_jax.config import from_config_dict


def resolve_model(spec: str, *, contraction: Optional[float] = None, seed: int = 0, dtype: str = "float32"):
  """'random:<configs.models module>' builds random weights (optionally contractive); otherwise a bundled
  model name or a checkpoint directory (HF or the project's own) is loaded."""
  if spec.startswith("random:"):
    name, _, arg = spec[len("random:"):].partition(":")
    mod = importlib.import_module(f"configs.models.{name}")
    cfg = from_config_dict(mod.get_config(arg or None)).replace(dtype=dtype)
    return api.from_config(cfg, seed=seed, contraction=contraction)
  return loopspec_jax.load(spec, dtype=dtype)


def parse_method(spec: str) -> tuple:
  """'loopspec:d1=2,d2=8' -> ('loopspec', {'d1': 2, 'd2': 8}); 'ar' -> ('ar', {})."""
  name, _, rest = spec.strip().partition(":")
  kw = {}
  for item in filter(None, (x.strip() for x in rest.split(","))):
    k, v = item.split("=")
    kw[k.strip()] = None if v.strip().lower() == "none" else int(v)
  return name.strip(), kw


def method_label(name: str, kw: dict) -> str:
  if not kw:
    return name
  return name + "(" + ",".join(f"{k}={v}" for k, v in kw.items()) + ")"


def atomic_write_text(path: str, text: str):
  """Write-then-rename so a killed process never leaves a half-written file."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def atomic_write_json(path: str, obj):
  atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default))


def _json_default(x):
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    return float(x)
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(type(x))


def is_main_process() -> bool:
  try:
    import jax
    return jax.process_index() == 0
  except Exception:  # pragma: no cover
    return True
