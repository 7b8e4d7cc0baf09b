"""Public peak dense bf16 FLOP/s, HBM bandwidth and per-op overhead of the accelerators the cost model projects onto.

Figures are per chip, dense (no 2:4 sparsity), as published by the vendors:
  H100 SXM5: 989.4 TFLOP/s bf16 dense (the datasheet's 1979 is with sparsity), 3.35 TB/s HBM3
             (NVIDIA H100 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h100).
  H200 SXM:  989.4 TFLOP/s bf16 dense (1979 with sparsity), 4.8 TB/s HBM3e
             (NVIDIA H200 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h200).
  TPU v4:    275 TFLOP/s bf16, 1200 GB/s HBM2 (cloud.google.com/tpu/docs/v4, "System architecture").
  TPU v5e:   197 TFLOP/s bf16, 819 GB/s HBM2 (cloud.google.com/tpu/docs/v5e).
  TPU v5p:   459 TFLOP/s bf16, 2765 GB/s HBM2e (cloud.google.com/tpu/docs/v5p).
Bandwidth in bytes/s (decimal: 1 TB/s = 1e12 B/s), FLOP/s in FLOP/s.

Per-op overhead (`op_overhead_s`, seconds per kernel of the loop body; `hardware.Hardware`) has no vendor
datasheet figure; these are the sources, and the projection is reported over 0 / 1 / 3 / 5 us
(`loopspec-cost-report --config=cost/sensitivity.py`) because of that uncertainty:
  GPU, kernels launched one by one: a CUDA launch costs about 3-6 us of host time per kernel and a short
      kernel leaves a gap of that order on the GPU when launches cannot run ahead (NVIDIA Technical Blog,
      "Getting Started with CUDA Graphs", developer.nvidia.com/blog/cuda-graphs: 2.9 us kernels took 3.8 us
      each launched back to back; 4-6 us per launch measured in "pegainfer (3): From Launch Overhead to CUDA
      Graph"). A decode loop on XLA GPU is a `while` whose body re-launches its kernels each iteration, so
      the default here is 3 us (`op_overhead_no_graphs_s`).
  GPU with CUDA graphs / XLA command buffers (`--xla_gpu_enable_command_buffer`, on by default for fusions
      in recent XLA): a graph replays its kernels without per-launch host work; the same NVIDIA blog measures
      3.4 us for a 2.9 us kernel, about 0.5 us of gap per kernel, so 1 us is used (`op_overhead_graphs_s`).
  TPU: the whole while loop runs on the chip (no host launch per op); each fusion still has a fixed
      start-up (pipeline fill, DMA setup) of order 1 us or less. No public figure; 0.5 us is an estimate.
"""

import ml_collections

_GPU_SOURCE = (
    "no-graph launch ~3 us/kernel (NVIDIA blog 'Getting Started with CUDA Graphs'; pegainfer 4-6 us); "
    "CUDA graphs / XLA command buffers ~0.5-1 us/kernel (same blog)"
)
_TPU_SOURCE = "estimate: on-chip while loop, no host launch per op; ~0.5 us per fusion start-up (no public figure)"
ACCELERATORS = {
    "h100": {
        "label": "H100 SXM",
        "peak_flops": 989.4e12,
        "hbm_bandwidth": 3.35e12,
        "op_overhead_s": 3e-6,
        "op_overhead_no_graphs_s": 3e-6,
        "op_overhead_graphs_s": 1e-6,
        "overhead_source": _GPU_SOURCE,
    },
    "h200": {
        "label": "H200",
        "peak_flops": 989.4e12,
        "hbm_bandwidth": 4.8e12,
        "op_overhead_s": 3e-6,
        "op_overhead_no_graphs_s": 3e-6,
        "op_overhead_graphs_s": 1e-6,
        "overhead_source": _GPU_SOURCE,
    },
    "tpu_v4": {
        "label": "TPU v4",
        "peak_flops": 275e12,
        "hbm_bandwidth": 1.2e12,
        "op_overhead_s": 0.5e-6,
        "overhead_source": _TPU_SOURCE,
    },
    "tpu_v5e": {
        "label": "TPU v5e",
        "peak_flops": 197e12,
        "hbm_bandwidth": 0.819e12,
        "op_overhead_s": 0.5e-6,
        "overhead_source": _TPU_SOURCE,
    },
    "tpu_v5p": {
        "label": "TPU v5p",
        "peak_flops": 459e12,
        "hbm_bandwidth": 2.765e12,
        "op_overhead_s": 0.5e-6,
        "overhead_source": _TPU_SOURCE,
    },
}


def get_config(arg=None):
  """The table as a ConfigDict; `arg` is an optional comma-separated subset of names (e.g. "h200,tpu_v5e")."""
  names = [a.strip() for a in arg.split(",")] if arg else list(ACCELERATORS)
  unknown = [n for n in names if n not in ACCELERATORS]
  if unknown:
    raise ValueError(f"unknown accelerators {unknown}; known: {sorted(ACCELERATORS)}")
  return ml_collections.ConfigDict({n: ACCELERATORS[n] for n in names})
