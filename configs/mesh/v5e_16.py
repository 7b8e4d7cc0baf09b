"""TPU v5e-16 (v5litepod-16): 4 hosts x 4 chips, 16 GiB HBM each.

Needs `loopspec_jax.parallel.distributed.initialize_from_env()` (one process per host).

(4, 4): one request group per host-sized slice of 4 chips, model-parallel over 4.
"""

from loopspec_configs.mesh._base import mesh_config


def get_config(arg=None):
  return mesh_config(4, 4, "v5litepod-16", arg)
