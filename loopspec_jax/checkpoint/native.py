"""The project's own checkpoints: orbax parameters + `loopspec_config.json` (+ tokenizer), and the bundled
models shipped under `loopspec_jax/assets/models/`."""

from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import jax.numpy as jnp
import orbax.checkpoint as ocp
from tokenizers import Tokenizer

from loopspec_jax.config import ModelConfig
from loopspec_jax.models import looped as M
from loopspec_jax.models.model import LoopedModel

OWN_CONFIG = "loopspec_config.json"
ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "models")


def bundled_models() -> list:
  """Names of the models shipped inside the package (loadable with `load(name)`)."""
  if not os.path.isdir(ASSETS):
    return []
  return sorted(d for d in os.listdir(ASSETS) if os.path.isdir(os.path.join(ASSETS, d)))


def bundled_path(name: str) -> str:
  return os.path.join(ASSETS, name)


def is_native(path: str) -> bool:
  return os.path.exists(os.path.join(path, OWN_CONFIG))


def load_tokenizer(path: str):
  tok_path = os.path.join(path, "tokenizer.json")
  if not os.path.exists(tok_path):
    return None
  return Tokenizer.from_file(tok_path)


def save(model: LoopedModel, path: str):
  """Saves params with orbax and the config (and tokenizer) beside them; `load(path)` round-trips exactly."""
  path = os.path.abspath(path)
  os.makedirs(path, exist_ok=True)
  ckpt = ocp.StandardCheckpointer()
  target = os.path.join(path, "params")
  if os.path.exists(target):
    shutil.rmtree(target)
  ckpt.save(target, model.params)
  ckpt.wait_until_finished()
  with open(os.path.join(path, OWN_CONFIG), "w") as f:
    f.write(model.config.to_json())
  if model.tokenizer is not None:
    model.tokenizer.save(os.path.join(path, "tokenizer.json"))


def load(path: str, dtype: Optional[str]) -> LoopedModel:
  path = os.path.abspath(path)
  with open(os.path.join(path, OWN_CONFIG)) as f:
    cfg = ModelConfig.from_dict(json.load(f))
  abstract = M.abstract_params(cfg)
  ckpt = ocp.StandardCheckpointer()
  params = ckpt.restore(os.path.join(path, "params"), abstract)
  if dtype is not None and dtype != cfg.dtype and dtype != "float32":
    cfg = cfg.replace(dtype=dtype)
    params = M.cast_params(params, jnp.dtype(dtype))
  return LoopedModel(cfg, params, load_tokenizer(path), source=path)
