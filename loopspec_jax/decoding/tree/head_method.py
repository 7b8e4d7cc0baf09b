"""What the head methods (medusa, eagle, mtp) share as `Method`s: the `heads` argument (a head artefact, a
bundled head's name or a head directory, loaded once per process), their spec and label, and the checks made
before anything compiles (a head of the method's kind, trained for this target: `artefact.check_target`).

A head method is a frozen dataclass deriving from `HeadMethod` with a `heads` field and its envelope fields;
it sets `kind` (the artefact kind it decodes with) and `example` (a bundled head, for error messages).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import ClassVar

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding.method import Method
from loopspec_jax.heads import artefact


@functools.lru_cache(maxsize=None)
def _load(name: str) -> artefact.Heads:
  return artefact.load(name)


def load_heads(value):
  """A head artefact from `value`: an artefact as is, a bundled name or directory loaded (once per process)."""
  return _load(value) if isinstance(value, str) else value


def heads_name(heads):
  """How a spec names `heads`: a bundled head by its name, another by its directory; None if unnamed."""
  src = getattr(heads, "source", None)
  if src and os.path.dirname(src) == os.path.abspath(artefact.ASSETS):
    return os.path.basename(src)
  return src


def check_kind(method: str, heads, kind: str, example: str) -> None:
  """ValueError unless `heads` is a loaded artefact of `kind` (before compiling)."""
  if heads is None:
    raise ValueError(f"method={method!r} needs heads=<a {kind!r} head artefact (lj.load_heads({example!r}))>")
  if not isinstance(heads, artefact.Heads):
    raise ValueError(f"method={method!r} needs heads=<a head artefact>, got a {type(heads).__name__}")
  if heads.kind != kind:
    raise ValueError(f"method={method!r} needs an {kind!r} head, got a {heads.kind!r} head ({heads.source})")


@dataclasses.dataclass(frozen=True)
class HeadMethod(Method):
  """Base of the head methods (module docstring); subclasses declare `heads` and their envelope fields."""

  kind: ClassVar[str] = ""
  example: ClassVar[str] = ""

  def __post_init__(self):
    object.__setattr__(self, "heads", load_heads(getattr(self, "heads")))

  @property
  def envelope(self) -> dict:
    """The given arguments but the head, in field order."""
    return {k: v for k, v in self.args.items() if k != "heads"}

  @property
  def label(self) -> str:
    args = ",".join(f"{k}={v}" for k, v in self.envelope.items())
    return self.name + (f"({args})" if args else "")

  @property
  def spec(self) -> str:
    name = heads_name(getattr(self, "heads"))
    args = ([f"heads={name}"] if name else []) + [f"{k}={v}" for k, v in self.envelope.items()]
    return self.name + (":" + ",".join(args) if args else "")

  def validate(self, cfg: ModelConfig) -> None:
    check_kind(self.name, getattr(self, "heads"), self.kind, self.example)
    self.validate_envelope(cfg)

  def validate_envelope(self, cfg: ModelConfig) -> None:
    """The method's own argument checks (its `resolve`)."""

  def check_target(self, model) -> None:
    check_kind(self.name, getattr(self, "heads"), self.kind, self.example)
    artefact.check_target(getattr(self, "heads"), model)
