"""TPU v5e-8 (v5litepod-8): one host, 8 chips, 16 GiB HBM each.

(2, 4): two request groups, model-parallel over 4 chips (Ouro: 16 heads / 4; Huginn-0125's 55 heads do
not divide, so its attention and KV caches are replicated and only MLP and vocabulary split; see
loopspec_jax/experiments/plan_memory.py).
"""

from loopspec_jax.configs.mesh._base import mesh_config


def get_config(arg=None):
  return mesh_config(2, 4, "v5litepod-8", arg)
