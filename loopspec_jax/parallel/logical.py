"""Logical axis names declared where state is defined: `axes_field(*names)` for dataclass fields.

A decode-state dataclass declares each field's logical axes next to the field (as MaxText declares them
where the cache is made), e.g. `tokens: jax.Array = axes_field("batch", "length")`; the axes apply to every
array leaf under that field (a KV store dict {'k', 'v'} shares one declaration). `parallel.sharding` reads
them with `declared_axes`; nothing guesses axes from names or ranks.
"""
from __future__ import annotations

import dataclasses

import flax.struct

AXES = "logical_axes"


def axes_field(*names, **kwargs):
  """A pytree dataclass field whose array leaves have the logical axes `names` (None: never sharded)."""
  return flax.struct.field(pytree_node=True, metadata={AXES: tuple(names)}, **kwargs)


def declared_axes(obj) -> dict:
  """{field name: logical axes} of a dataclass instance or class (fields without a declaration omitted)."""
  return {f.name: f.metadata[AXES] for f in dataclasses.fields(obj) if AXES in f.metadata}
