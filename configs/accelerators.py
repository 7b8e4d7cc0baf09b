"""Public peak dense bf16 FLOP/s and HBM bandwidth of the accelerators the cost model projects onto.

Figures are per chip, dense (no 2:4 sparsity), as published by the vendors:
  H100 SXM5: 989.4 TFLOP/s bf16 dense (the datasheet's 1979 is with sparsity), 3.35 TB/s HBM3
             (NVIDIA H100 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h100).
  H200 SXM:  989.4 TFLOP/s bf16 dense (1979 with sparsity), 4.8 TB/s HBM3e
             (NVIDIA H200 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h200).
  TPU v4:    275 TFLOP/s bf16, 1200 GB/s HBM2 (cloud.google.com/tpu/docs/v4, "System architecture").
  TPU v5e:   197 TFLOP/s bf16, 819 GB/s HBM2 (cloud.google.com/tpu/docs/v5e).
  TPU v5p:   459 TFLOP/s bf16, 2765 GB/s HBM2e (cloud.google.com/tpu/docs/v5p).
Bandwidth in bytes/s (decimal: 1 TB/s = 1e12 B/s), FLOP/s in FLOP/s.
"""

import ml_collections

ACCELERATORS = {
    "h100": {"label": "H100 SXM", "peak_flops": 989.4e12, "hbm_bandwidth": 3.35e12},
    "h200": {"label": "H200", "peak_flops": 989.4e12, "hbm_bandwidth": 4.8e12},
    "tpu_v4": {"label": "TPU v4", "peak_flops": 275e12, "hbm_bandwidth": 1.2e12},
    "tpu_v5e": {"label": "TPU v5e", "peak_flops": 197e12, "hbm_bandwidth": 0.819e12},
    "tpu_v5p": {"label": "TPU v5p", "peak_flops": 459e12, "hbm_bandwidth": 2.765e12},
}


def get_config(arg=None):
  """The table as a ConfigDict; `arg` is an optional comma-separated subset of names (e.g. "h200,tpu_v5e")."""
  names = [a.strip() for a in arg.split(",")] if arg else list(ACCELERATORS)
  unknown = [n for n in names if n not in ACCELERATORS]
  if unknown:
    raise ValueError(f"unknown accelerators {unknown}; known: {sorted(ACCELERATORS)}")
  return ml_collections.ConfigDict({n: ACCELERATORS[n] for n in names})
