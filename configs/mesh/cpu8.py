"""8 simulated CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8), as the sharding tests use."""

from loopspec_configs.mesh._base import mesh_config


def get_config(arg=None):
  return mesh_config(2, 4, "cpu x8 (simulated)", arg)
