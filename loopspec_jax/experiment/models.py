"""Which model an experiment runs: a bundled name, a checkpoint directory, or random weights of a config.

'random:<family>:<variant>' specs (e.g. 'random:huginn:bench_r32') name a model config of the top-level
configs/ folder, which the library never imports: the caller hands in its lookup (`model_config`, a function
from '<family>:<variant>' to a `ModelConfig`, e.g. `loopspec_configs.models.model_config`).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Optional

import loopspec_jax
from loopspec_jax import api
from loopspec_jax import methods
from loopspec_jax.checkpoint import native
from loopspec_jax.config import ModelConfig

RANDOM = "random:"
BUNDLED = "bundled:"
ConfigLookup = Callable[[str], ModelConfig]


def _config_of(spec: str, model_config: Optional[ConfigLookup]) -> ModelConfig:
  """The `ModelConfig` of a '<family>:<variant>' spec through the caller's lookup."""
  if model_config is None:
    raise ValueError(f"model {spec!r} names a model config: pass its lookup (model_config=...)")
  return model_config(spec)


def resolve_model(
    spec: str,
    *,
    model_config: Optional[ConfigLookup] = None,
    contraction: Optional[float] = None,
    seed: int = 0,
    dtype: str = "float32",
):
  """'random:<family>:<variant>' builds random weights (contractive when `contraction` is given) of the config
  `model_config` returns; anything else is a bundled model name or a checkpoint directory (HF or our own)."""
  if spec.startswith(RANDOM):
    cfg = _config_of(spec[len(RANDOM) :], model_config).replace(dtype=dtype)
    return api.from_config(cfg, seed=seed, contraction=contraction)
  return loopspec_jax.load(spec, dtype=dtype)


def model_config_at(spec: str, dtype: str, context: int, model_config: Optional[ConfigLookup] = None) -> ModelConfig:
  """The `ModelConfig` (no weights) of a config spec ("huginn:0125", through `model_config`) or
  "bundled:<name>", at `dtype` with a context of `context` positions (the cost report's models)."""
  if spec.startswith(BUNDLED):
    path = os.path.join(native.bundled_path(spec[len(BUNDLED) :]), native.OWN_CONFIG)
    with open(path) as f:
      cfg = ModelConfig.from_dict(json.load(f))
  else:
    cfg = _config_of(spec, model_config)
  return cfg.replace(dtype=dtype, max_len=context)


def best_depths(model) -> tuple:
  """The (d1, d2) the theory and our sweeps favour for the model's family and depth (`methods.default_depths`)."""
  return methods.default_depths(model.config)


def model_identity(cfg) -> dict:
  """What identifies the model in result keys: the spec, and for random models the contraction and seed."""
  contraction = cfg.get("contraction")
  random = cfg.model.startswith(RANDOM)
  return {"model": cfg.model, "contraction": contraction if random else None, "seed": cfg.seed}


def load_model(cfg, model_config: Optional[ConfigLookup] = None):
  """The model of an experiment config (fields model, contraction, seed)."""
  return resolve_model(
      cfg.model, model_config=model_config, contraction=model_identity(cfg)["contraction"], seed=cfg.seed
  )
