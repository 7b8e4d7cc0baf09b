"""`LoopedModel`: a config, its parameters and an optional tokenizer, the object every entry point takes."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax

from loopspec_jax.config import ModelConfig
from loopspec_jax.models import looped as M


@dataclasses.dataclass
class LoopedModel:
  """A config, its parameters (a pytree of jax arrays) and an optional `tokenizers.Tokenizer`."""

  config: ModelConfig
  params: Any
  tokenizer: Any = None
  source: Optional[str] = None

  @property
  def family(self) -> str:
    return self.config.family

  @property
  def recurrence(self) -> int:
    return self.config.recurrence

  def encode(self, text: str) -> list:
    if self.tokenizer is None:
      raise ValueError("this model has no tokenizer; pass token ids")
    return self.tokenizer.encode(text).ids

  def decode(self, ids) -> str:
    if self.tokenizer is None:
      raise ValueError("this model has no tokenizer")
    return self.tokenizer.decode(list(ids))


def from_config(cfg: ModelConfig, seed: int = 0, **init_kw) -> LoopedModel:
  """A randomly initialised model of a config (tests, planning)."""
  return LoopedModel(cfg, M.init_params(cfg, jax.random.PRNGKey(seed), **init_kw))
