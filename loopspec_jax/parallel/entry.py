"""How a decode entry point runs sharded, declared where it is defined.

Every function that `sharding.entry` / `sharding.program` run on a mesh (prefill, each method's initial state and
decode loop) carries an `EntryPoint`: the kinds of its leading array arguments, which of them are donated and
what its output's shardings follow. The decoder module declares it on the function, under its `jax.jit`:

    @functools.partial(jax.jit, static_argnames=(...), donate_argnames=("state",))
    @entry.declare(entry.LOOP)
    def decode_loop(params, state, sp, *, cfg, ...): ...

and `sharding.py` reads it off the function object (`declared`), so a new decoder runs on a mesh by declaring its
entry points, with no table of names to keep in step. `program` does both at once: it declares the entry point
and jits the function with its keyword-only parameters static (the settings a program is compiled for):

    @entry.program(entry.LOOP, donate_argnames=("state",))
    def decode_loop(params, state, sp, *, cfg, ...): ...

This module imports nothing of the library: decoding/ (above parallel/) imports it, and so does `sharding.py`.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Optional

import jax


@dataclasses.dataclass(frozen=True)
class EntryPoint:
  """How one decode entry point runs sharded.

  kinds: the kind of each leading array argument, one of `rules.PARAM_KINDS` ('params': laid out for the
  static `cfg`; 'draft_params': for `dcfg`), 'state' (declared axes), 'replicated' or a tuple of logical axes (see
  `rules.tree_axes`); the arguments after them are static (cfg, dcfg, shape, greedy, cache_group, ...).
  donate: indices (among the array arguments) of the donated ones. out: the index of the argument whose
  shardings the output keeps (a decode loop: state in, state out; the host reads it, so `to_host`), or the
  kind of the output, or a tuple of the kinds of its elements (shardings read off its abstract value).
  """

  kinds: tuple
  donate: tuple = ()
  out: Any = "state"

  def extra(self, *kinds) -> "EntryPoint":
    """This entry point with further array arguments of `kinds` after its own (a drafter's parameters)."""
    return dataclasses.replace(self, kinds=self.kinds + kinds)


TOKENS, LENGTHS = ("batch", "length"), ("batch",)
# (params, tokens [B, T], lengths [B], sp) -> (cache, tokens): `common.prefill_state`.
PREFILL = EntryPoint(("params", TOKENS, LENGTHS, "state"), out=("state", TOKENS))
# (cache, tokens, lengths, sp) -> state: each method's initial state (cache and tokens donated).
INIT = EntryPoint(("state", TOKENS, LENGTHS, "state"), donate=(0, 1))
# (params, state, sp) -> state: each method's decode loop (state donated; the output lies like the input state).
LOOP = EntryPoint(("params", "state", "state"), donate=(1,), out=1)
# A separate drafter (method='draft', chain or tree): its parameters follow the usual arguments, laid out for `dcfg`.
DRAFT_INIT, DRAFT_LOOP = INIT.extra("draft_params"), LOOP.extra("draft_params")
# The head methods (medusa, eagle, mtp, dflash): the head's parameters follow the usual arguments, replicated (a
# head is small beside the target: a block and the LM head at most).
HEAD_LOOP = LOOP.extra("replicated")

_ATTRIBUTE = "sharded_entry_point"


def declare(ep: EntryPoint) -> Callable:
  """A decorator that declares `ep` for the function it wraps (put it under `jax.jit`: the jitted function
  carries the attribute too, `functools.wraps` copies it); returns the function itself."""
  if not isinstance(ep, EntryPoint):
    raise TypeError(f"declare takes an EntryPoint, got {type(ep).__name__}")

  def mark(fn):
    setattr(fn, _ATTRIBUTE, ep)
    return fn

  return mark


def program(ep: EntryPoint, *, donate_argnames: tuple = ()) -> Callable:
  """A decorator that declares `ep` for the function it wraps and jits it with every keyword-only parameter static
  (cfg and the method's settings: one compile per configuration) and `donate_argnames` donated (a decode loop's
  state)."""

  def jitted(fn):
    return jax.jit(declare(ep)(fn), static_argnames=static_argnames(fn), donate_argnames=donate_argnames)

  return jitted


def static_argnames(fn: Callable) -> tuple:
  """The static arguments of an entry point: the keyword-only parameters of its Python function (the
  package's convention, e.g. `decode_loop(params, state, sp, *, cfg, d1, ...)`)."""
  params = inspect.signature(fn).parameters
  return tuple(name for name, p in params.items() if p.kind == p.KEYWORD_ONLY)


def declared(fn) -> Optional[EntryPoint]:
  """The EntryPoint declared for `fn` (a jitted entry point or its Python function), or None."""
  for f in (fn, getattr(fn, "__wrapped__", None)):
    ep = getattr(f, _ATTRIBUTE, None)
    if isinstance(ep, EntryPoint):
      return ep
  return None
