"""Model configs: one module per family with a variant argument; `model_config("ouro:tiny")` builds one.

Specs are "<family module>:<variant>":
  ouro:tiny ouro:1p4b ouro:2p6b                 huginn:tiny huginn:0125 huginn:bench_r32
  raven_llama:tiny raven_llama:3p2_1b raven_llama:tinyllama     raven_olmo:tiny raven_olmo:2_1b
As a config file: `--config=<package>/configs/models/huginn.py:0125 --config.recurrence=16`.
"""

from __future__ import annotations

import ml_collections

from loopspec_jax.config import ModelConfig, from_config_dict
from loopspec_configs.models import huginn, ouro, raven_llama, raven_olmo

MODULES = {"ouro": ouro, "huginn": huginn, "raven_llama": raven_llama, "raven_olmo": raven_olmo}
SPECS = tuple(f"{name}:{variant}" for name, mod in MODULES.items() for variant in mod.VARIANTS)


def config_dict(spec: str) -> ml_collections.ConfigDict:
  """The ConfigDict (ModelConfig fields) of a spec like "huginn:0125"."""
  name, _, variant = spec.partition(":")
  if name not in MODULES or variant not in MODULES[name].VARIANTS:
    raise ValueError(f"unknown model config {spec!r}; known: {list(SPECS)}")
  return MODULES[name].get_config(variant)


def model_config(spec: str, **overrides) -> ModelConfig:
  """The ModelConfig of a spec like "ouro:tiny", with field overrides (e.g. recurrence=3)."""
  return from_config_dict(config_dict(spec)).replace(**overrides)
