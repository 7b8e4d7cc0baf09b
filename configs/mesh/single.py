"""One device: mesh (1, 1) (what `generate(..., mesh=None)` does, but through the sharded entry points)."""

from loopspec_configs.mesh._base import mesh_config


def get_config(arg=None):
  return mesh_config(1, 1, "cpu", arg)
