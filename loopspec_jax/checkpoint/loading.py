"""`load`: a bundled model by name, one of the project's own checkpoints, or an HF checkpoint directory.

It sits below the decoders (a drafter given by name, `method="draft"`, loads through it) and below `api`,
which re-exports it as `loopspec_jax.load`.
"""

from __future__ import annotations

import os
from typing import Optional

import jax
import jax.numpy as jnp

from loopspec_jax.checkpoint import hf as hf_checkpoint
from loopspec_jax.checkpoint import native
from loopspec_jax.models.model import LoopedModel
from loopspec_jax.parallel import sharding


def load(
    path: str, *, family: Optional[str] = None, dtype: str = "float32", mesh=None, sharding_rules=None
) -> LoopedModel:
  """Loads a bundled model by name, one of the project's own checkpoints, or an HF checkpoint directory.

  HF directories hold config.json plus model.safetensors or a sharded model.safetensors.index.json; the
  family is detected from config and tensor names unless forced with `family=`. With a `mesh` (axes
  'data', 'model') the parameters are placed sharded by `sharding.RULES` (or `sharding_rules`).
  """
  if not os.path.isdir(path) and path in native.bundled_models():
    path = native.bundled_path(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(
        f"no checkpoint directory or bundled model named {path!r} " f"(bundled: {native.bundled_models()})"
    )
  if native.is_native(path):
    model = native.load(path, dtype)
    if family is not None and family != model.config.family:
      raise ValueError(f"{path} holds a {model.config.family!r} model, not {family!r}")
  else:
    cfg, np_params = hf_checkpoint.read_hf(path, family=family, dtype=dtype)
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.dtype(dtype)), np_params)
    model = LoopedModel(cfg, params, native.load_tokenizer(path), source=path)
  if mesh is not None:  # heads laid out for the mesh (sharding.padded_config): the config follows the parameters
    model = sharding.shard_model(model, mesh, sharding_rules)
  return model
