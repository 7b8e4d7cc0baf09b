"""The registry of decoding methods and the ONE parser of method specs.

A method is a frozen dataclass (`decoding.method.Method`) defined in its own module; adding one means
writing that module and adding its class to `_CLASSES` below. Everything that names methods (`generate`,
the experiments' configs, the server, the lm-eval backend, the cost report) goes through `parse` / `build`.
"auto" (`decoding/auto.py`) is the planner's settings: `api.generate` and the serving engine hand it to the
planner (`planner.py`, a layer above this one), which picks one of the other methods.

Spec syntax: 'name' or 'name:key=value,key=value' ('none' is None; numbers are read as int or float;
'gamma=auto' stays a string); the leading values may also be given positionally in the order the class
declares (`Method.positional`): 'loopspec:2,8' == 'loopspec:d1=2,d2=8'.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Type, Union

from loopspec_jax.decoding import stats
from loopspec_jax.decoding.method import Method
from loopspec_jax.decoding.auto import Auto
from loopspec_jax.decoding.autoregressive import AR
from loopspec_jax.decoding.chain import Chain
from loopspec_jax.decoding.draft import Draft
from loopspec_jax.decoding.lookup import Lookup
from loopspec_jax.decoding.loopspec.decoder import LoopSpec
from loopspec_jax.decoding.tree.dflash import DFlash
from loopspec_jax.decoding.tree.eagle import Eagle
from loopspec_jax.decoding.tree.lookahead import Lookahead
from loopspec_jax.decoding.tree.medusa import Medusa
from loopspec_jax.decoding.tree.mtp import MTP
from loopspec_jax.decoding.tree.self_spec import TreeSelf

_CLASSES = (AR, Chain, LoopSpec, Draft, Lookup, TreeSelf, Lookahead, Medusa, Eagle, MTP, DFlash, Auto)
REGISTRY: Dict[str, Type[Method]] = {cls.name: cls for cls in _CLASSES}
NAMES = tuple(REGISTRY)
# each method's figures from its raw counts, handed down to `DecodeStats.summary` (which sits below the methods)
stats.DERIVED.update({name: cls.derived for name, cls in REGISTRY.items()})

__all__ = [
    "Method",
    "REGISTRY",
    "NAMES",
    "argument_names",
    "build",
    "default_depths",
    "parse",
    "parse_list",
    "parse_value",
    "resolve",
] + [c.__name__ for c in _CLASSES]


def method_class(name: str) -> Type[Method]:
  if name not in REGISTRY:
    raise ValueError(f"unknown method {name!r}; expected one of {NAMES}")
  return REGISTRY[name]


def build(method: Union[str, Method], **kwargs) -> Method:
  """A `Method` from a name (or spec) and keyword arguments, or a `Method` as is.

  Keywords that are None are ignored (generate's defaults); a keyword the method does not take is a
  ValueError naming it, so nothing given is silently dropped."""
  given = {k: v for k, v in kwargs.items() if v is not None}
  if isinstance(method, Method):
    if given:
      raise ValueError(f"method={method.label} is a Method object: give its arguments to it, not {sorted(given)}")
    return method
  if not isinstance(method, str):
    raise ValueError(f"method must be a name, a spec string or a Method object, got {type(method).__name__}")
  base = parse(method)
  cls = type(base)
  allowed = {f.name for f in dataclasses.fields(cls)}
  extra = sorted(k for k in given if k not in allowed)
  if extra:
    raise ValueError(f"method={cls.name!r} takes no {'/'.join(extra)} (its arguments: {sorted(allowed) or 'none'})")
  return dataclasses.replace(base, **given)


# The (d1, d2) the theory and our sweeps favour per family (docs/depth-analysis.md): the depths chain and
# LoopSpec take when none are given, and the demo's; and chain's draft length when none is given.
DEFAULT_CHAIN_GAMMA = 4
DEFAULT_DEPTHS = {"huginn": (2, 8), "raven-llama": (2, 8), "raven-olmo": (2, 8), "ouro": (1, 2)}


def default_depths(cfg) -> tuple:
  """(d1, d2) of `DEFAULT_DEPTHS` for the model's family, or (1, None) where they do not fit its R."""
  r = cfg.recurrence
  d1, d2 = DEFAULT_DEPTHS.get(cfg.family, (1, 2))
  if r % d1 or not d1 < d2 < r or d2 % d1:
    d1, d2 = 1, None
  return d1, d2


def with_default_depths(m: Method, cfg) -> Method:
  """Chain or LoopSpec without a `d1`: the family's default depths (`default_depths`; a given d2 stays);
  chain without a `gamma`: `DEFAULT_CHAIN_GAMMA`."""
  if isinstance(m, Chain) and m.gamma is None:
    m = dataclasses.replace(m, gamma=DEFAULT_CHAIN_GAMMA)
  if not isinstance(m, (Chain, LoopSpec)) or m.d1 is not None:
    return m
  d1, d2 = default_depths(cfg)
  if isinstance(m, Chain):
    return dataclasses.replace(m, d1=d1)
  return dataclasses.replace(m, d1=d1, d2=d2 if m.d2 is None else m.d2)


def build_checked(method: Union[str, Method], model, **kwargs) -> Method:
  """`build(method, **kwargs)` checked against the target `LoopedModel` (its config, and what needs the model
  itself, e.g. a drafter's tokenizer): every check a method makes, before anything compiles. Chain and
  LoopSpec without depths take the family's defaults (`with_default_depths`)."""
  m = with_default_depths(build(method, **kwargs), model.config)
  m.validate(model.config)
  m.check_target(model)
  return m


def argument_names(method: Union[str, Method]) -> tuple:
  """The argument (field) names of a method, given by name, spec or object: ('d1', 'd2', ...)."""
  cls = type(method) if isinstance(method, Method) else method_class(str(method).partition(":")[0].strip())
  return tuple(f.name for f in dataclasses.fields(cls))


def parse(spec: Union[str, Method]) -> Method:
  """'loopspec:d1=2,d2=8' (or 'loopspec:2,8') -> LoopSpec(d1=2, d2=8); a Method passes through."""
  if isinstance(spec, Method):
    return spec
  name, _, rest = str(spec).strip().partition(":")
  cls = method_class(name.strip())
  fields = [f.name for f in dataclasses.fields(cls)]
  kw, named = {}, False
  for i, item in enumerate(filter(None, (x.strip() for x in rest.split(",")))):
    key, sep, value = item.partition("=")
    named = named or bool(sep)
    if not sep:
      if named or i >= len(cls.positional):
        raise ValueError(f"method argument {item!r} of {spec!r} is not of the form name=value")
      key, value = cls.positional[i], item
    key = key.strip()
    if key not in fields:
      raise ValueError(f"method {cls.name!r} (spec {spec!r}) takes no {key!r}; its arguments: {fields or 'none'}")
    kw[key] = parse_value(value.strip())
  return cls(**kw)


def parse_list(text) -> list:
  """';'-separated specs (or a sequence of specs / Methods) -> [Method, ...]."""
  items = text.split(";") if isinstance(text, str) else list(text)
  return [parse(s) for s in items if not (isinstance(s, str) and not s.strip())]


def parse_value(text: str):
  """'4' -> 4, '0.25' -> 0.25, 'none' -> None, anything else stays a string ('auto')."""
  if text.lower() == "none":
    return None
  for conv in (int, float):
    try:
      return conv(text)
    except ValueError:
      pass
  return text
