"""TPU v5e-8 (v5litepod-8): one host, 8 chips, 16 GiB HBM each.

(2, 4): two request groups, model-parallel over 4 chips (Ouro: 16 heads / 4; Huginn-0125's 55 heads are
zero-padded to 56 = 4 x 14, so its attention weights and KV caches split like its MLP and vocabulary: 8
requests of 4096 tokens in bf16 take 12.6 GiB per chip, 10 fit; `1x8` holds 11; see
experiments/plan_memory.py and `heads.padded_config`).
"""

from loopspec_configs.mesh._base import mesh_config


def get_config(arg=None):
  return mesh_config(2, 4, "v5litepod-8", arg)
