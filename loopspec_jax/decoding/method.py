"""A decoding method as a value (gemma's `SamplingMethod` pattern): a frozen dataclass whose fields are the
method's arguments, and which owns their validation, its `Decoder`, the figures it derives from its raw
counts, and its label.

Every method lives in its own module as a subclass of `Method` and is listed once in `loopspec_jax.methods`
(the registry and the one parser of method specs); `generate`, the experiments, the server and the lm-eval
backend only ever see `Method` values.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Optional

from loopspec_jax.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Method:
  """Base of every decoding method. Subclasses set `name` and declare their arguments as fields (None: the
  method's default); they override `validate` and, where they derive figures, `derived`, and either set
  `build_decoder` or override `make_decoder`."""

  name: ClassVar[str] = ""
  # fields a spec string may give positionally, in order ('loopspec:2,8' == 'loopspec:d1=2,d2=8')
  positional: ClassVar[tuple] = ()
  # drafts come from outside the target's own depths (a draft model, the prompt): figures per verify pass, no d1
  separate_drafter: ClassVar[bool] = False
  # the module's function building the Decoder from every field: build_decoder(cfg, *, greedy, random_init,
  # **fields) (a staticmethod; None: the class overrides `make_decoder`)
  build_decoder: ClassVar[Optional[Callable]] = None

  def validate(self, cfg: ModelConfig) -> None:
    """Raises ValueError for arguments the model `cfg` cannot take (runs before anything compiles)."""

  def check_target(self, model) -> None:
    """Checks that need the target `LoopedModel` itself (e.g. a drafter's tokenizer); run before compiling."""

  def make_decoder(self, cfg: ModelConfig, *, greedy: bool, random_init: bool):
    """The `decoding.common.Decoder` that runs this method on a model with config `cfg`."""
    if self.build_decoder is None:
      raise NotImplementedError(f"{type(self).__name__}.make_decoder")
    return self.build_decoder(cfg, greedy=greedy, random_init=random_init, **self.fields)

  @classmethod
  def derived(cls, stats) -> dict:
    """The figures this method derives from the raw counts of a `DecodeStats` (summed over any number of
    batches or runs): e.g. accepted length, acceptance rate. Nothing else re-derives them."""
    return {}

  @property
  def fields(self) -> dict:
    """Every argument by name (None: the method's default), in field order."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  @property
  def args(self) -> dict:
    """The arguments that were given (fields that are not None), in field order."""
    return {k: v for k, v in self.fields.items() if v is not None}

  @property
  def spec(self) -> str:
    """The spec string `methods.parse` reads back: 'loopspec:d1=2,d2=8', 'ar'."""
    args = {k: v for k, v in self.args.items() if isinstance(v, (int, float, str))}
    return self.name + (":" + ",".join(f"{k}={v}" for k, v in args.items()) if args else "")

  @property
  def label(self) -> str:
    """A short human label: 'loopspec(d1=2,d2=8)', 'ar'."""
    args = {k: (v if isinstance(v, (int, float, str)) else type(v).__name__) for k, v in self.args.items()}
    return self.name + ("(" + ",".join(f"{k}={v}" for k, v in args.items()) + ")" if args else "")
