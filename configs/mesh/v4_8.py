"""TPU v4-8: one host, 4 chips (megacore: one jax device per chip), 32 GiB HBM each.

(2, 2): two request groups, heads / MLP / vocabulary split over 2 chips. Huginn-0125 (3.5B, bf16) fits
replicated too: the `4x1` variant (`v4_8:4x1`) maximises request throughput.
"""

from loopspec_configs.mesh._base import mesh_config


def get_config(arg=None):
  return mesh_config(2, 2, "v4-8", arg)
