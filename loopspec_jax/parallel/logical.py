"""Logical axis names declared where state is defined: `axes_field(*names)` for dataclass fields.

A decode-state dataclass declares each field's logical axes next to the field (as MaxText declares them
where the cache is made), e.g. `tokens: jax.Array = axes_field("batch", "length")`; the axes apply to every
array leaf under that field (a tuple of (k, v) buffers shares one declaration). A field without a declaration
that holds a dataclass (e.g. `DecodeState.cache`, a `KVCache`) defers to that dataclass's own declarations.

`leaf_axes` / `map_with_axes` read the declarations off a pytree: the axes of a leaf are those of the first
declared field on its path from the root. Nothing guesses axes from names or ranks: an array leaf that no
declaration covers, or whose rank differs from its declaration, raises an error naming its path.
`parallel.sharding` turns the axes into shardings.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax

AXES = "logical_axes"


def axes_field(*names, **kwargs):
  """A pytree dataclass field whose array leaves have the logical axes `names` (None: never sharded)."""
  return flax.struct.field(pytree_node=True, metadata={AXES: tuple(names)}, **kwargs)


@functools.lru_cache(maxsize=None)
def _declared_by_class(cls) -> dict:
  return {f.name: f.metadata[AXES] for f in dataclasses.fields(cls) if AXES in f.metadata}


def declared_axes(obj) -> dict:
  """{field name: logical axes} of a dataclass instance or class (fields without a declaration omitted)."""
  return _declared_by_class(obj if isinstance(obj, type) else type(obj))


def _is_dataclass_instance(x) -> bool:
  return dataclasses.is_dataclass(x) and not isinstance(x, type)


def _child(node, key):
  """The child of a container node under one key of a jax key path."""
  if isinstance(key, jax.tree_util.GetAttrKey):
    return getattr(node, key.name)
  if isinstance(key, jax.tree_util.SequenceKey):
    return node[key.idx]
  if isinstance(key, jax.tree_util.DictKey):
    return node[key.key]
  raise TypeError(f"cannot follow key {key!r} into a {type(node).__name__} (no declared logical axes there)")


def leaf_axes(root, path, leaf) -> tuple:
  """Logical axes of the array `leaf` found at key `path` (as from `jax.tree_util.tree_flatten_with_path`)
  in `root`: the declaration of the first dataclass field on the path.

  Raises ValueError when no field on the path declares axes, or when the declaration's length differs from
  the leaf's rank.
  """
  node = root
  for i, key in enumerate(path):
    if _is_dataclass_instance(node) and isinstance(key, jax.tree_util.GetAttrKey):
      axes = declared_axes(node).get(key.name)
      if axes is not None:
        if len(axes) != len(leaf.shape):
          raise ValueError(
              f"{type(node).__name__}.{key.name} declares logical axes {axes}, but its leaf "
              f"{jax.tree_util.keystr(tuple(path))} has shape {tuple(leaf.shape)}"
          )
        return axes
    node = _child(node, key)
  raise ValueError(
      f"no logical axes declared for leaf {jax.tree_util.keystr(tuple(path)) or '(root)'} of shape "
      f"{tuple(leaf.shape)} (declare them with axes_field on its dataclass field)"
  )


def map_with_axes(fn: Callable[[tuple, Any], Any], tree) -> Any:
  """`fn(logical axes, leaf)` for every leaf of `tree`, in a tree of the same structure (see `leaf_axes`)."""
  return jax.tree_util.tree_map_with_path(lambda path, x: fn(leaf_axes(tree, path, x), x), tree)
