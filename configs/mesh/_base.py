"""Shared helper of the mesh configs: a (data, model) mesh shape plus the logical axis rules.

Every module here exposes `get_config(arg=None)` returning an `ml_collections.ConfigDict` with
  mesh_shape:  (data, model) device counts (data: requests, model: heads / MLP / vocabulary);
  rules:       ((logical axis, mesh axis or None), ...), by default `loopspec_jax.sharding.RULES`;
  accelerator: the TPU type the shape is meant for (informational).
`arg` overrides the shape: 'data=2,model=4' (or '2,4'). Build the mesh with
`loopspec_jax.sharding.mesh_from_config(cd)` and the rules with `sharding.rules_from_config(cd)`.
"""
from __future__ import annotations

import ml_collections

from loopspec_jax import sharding


def mesh_config(data: int, model: int, accelerator: str = "", arg=None) -> ml_collections.ConfigDict:
  shape = {"data": int(data), "model": int(model)}
  if arg:
    items = [x.strip() for x in str(arg).split(",") if x.strip()]
    if all("=" not in x for x in items) and len(items) == 2:
      shape = {"data": int(items[0]), "model": int(items[1])}
    else:
      for item in items:
        key, _, value = item.partition("=")
        if key.strip() not in shape:
          raise ValueError(f"mesh override {item!r}: expected data=N or model=N")
        shape[key.strip()] = int(value)
  c = ml_collections.ConfigDict()
  c.mesh_shape = (shape["data"], shape["model"])
  c.rules = tuple((name, axis) for name, axis in sharding.RULES)
  c.accelerator = accelerator
  return c


def resolve(spec: str) -> ml_collections.ConfigDict:
  """'v5e_8' or 'v5e_8:data=1,model=8' (a module of this folder plus overrides) -> its ConfigDict."""
  import importlib
  name, _, arg = spec.partition(":")
  name = name.replace("/", ".").removesuffix(".py").split(".")[-1]
  return importlib.import_module(f"configs.mesh.{name}").get_config(arg or None)
