"""Shared helper of the mesh configs: a (data, model) mesh shape plus the logical axis rules.

Every module here exposes `get_config(arg=None)` returning an `ml_collections.ConfigDict` with
  mesh_shape:  (data, model) device counts (data: requests, model: heads / MLP / vocabulary);
  rules:       ((logical axis, mesh axis / axes or None), ...) in order of precedence (flax's logical
               partitioning rules), built from `loopspec_jax.parallel.rules.RULES`, the one rules table;
  accelerator: the accelerator the shape is meant for (informational).
`arg` is a named variant of the shape, "DATAxMODEL" (e.g. `v5e_8:1x8`), as in `resolve("v5e_8:1x8")` or
`--config=<package>/configs/mesh/v5e_8.py:1x8`; other fields change with `--config.<field>=<value>`. Build the
mesh with `sharding.mesh_from_config(cd)` and the rules with `sharding.rules_from_config(cd)`.
"""

from __future__ import annotations

import importlib

import ml_collections

from loopspec_jax.parallel import rules


def parse_shape(text: str) -> tuple:
  """'2x4' -> (2, 4): a DATAxMODEL mesh shape."""
  parts = str(text).lower().split("x")
  if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
    raise ValueError(f"mesh shape {text!r}: expected DATAxMODEL, e.g. 2x4")
  return int(parts[0]), int(parts[1])


def mesh_config(data: int, model: int, accelerator: str = "", arg=None) -> ml_collections.ConfigDict:
  """The ConfigDict of a (data, model) mesh; `arg` ("DATAxMODEL") replaces the shape."""
  c = ml_collections.ConfigDict()
  c.mesh_shape = parse_shape(arg) if arg else (int(data), int(model))
  c.rules = tuple((name, axis) for name, axis in rules.RULES)
  c.accelerator = accelerator
  return c


def resolve(spec: str) -> ml_collections.ConfigDict:
  """'v5e_8' or 'v5e_8:1x8' (a module of this folder, optionally with a DATAxMODEL shape) -> its ConfigDict."""
  name, _, arg = spec.partition(":")
  name = name.replace("/", ".").removesuffix(".py").split(".")[-1]
  return importlib.import_module(f"loopspec_configs.mesh.{name}").get_config(arg or None)
