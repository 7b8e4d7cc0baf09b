"""Shared helper of the model configs in this folder: a complete ModelConfig field set as a ConfigDict.

Every family module here (ouro, huginn, raven_llama, raven_olmo) exposes `get_config(arg)` where `arg` names a
variant (e.g. `huginn.get_config("0125")`), and returns an `ml_collections.ConfigDict` whose keys are exactly the
`loopspec_jax.config.ModelConfig` field names, so `from_config_dict(get_config(variant))` builds the ModelConfig.
Change fields with the one override syntax, `--config.<field>=<value>`, or `model_config(spec, **overrides)`.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from loopspec_jax.config import ModelConfig

_FLOAT_FIELDS = ("rope_theta", "norm_eps", "embed_scale", "init_std")


def model_config(**fields) -> ml_collections.ConfigDict:
  """A ConfigDict holding every ModelConfig field: the given values, the dataclass defaults for the rest."""
  names = [f.name for f in dataclasses.fields(ModelConfig)]
  unknown = sorted(set(fields) - set(names))
  if unknown:
    raise ValueError(f"unknown ModelConfig fields: {unknown}")
  values = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING}
  for key, value in fields.items():
    if key in _FLOAT_FIELDS and isinstance(value, int):
      value = float(value)
    if key == "rope_llama3" and value is not None:
      value = tuple(value)
    values[key] = value
  missing = [n for n in names if n not in values]
  if missing:
    raise ValueError(f"missing ModelConfig fields: {missing}")
  return ml_collections.ConfigDict({n: values[n] for n in names})


def select(family: str, variants: dict, arg) -> ml_collections.ConfigDict:
  """The ConfigDict of variant `arg` of a family module ({name: field dict}); a clear error for unknown names."""
  if arg not in variants:
    raise ValueError(f"unknown {family} variant {arg!r}; known: {sorted(variants)}")
  return model_config(**variants[arg])
