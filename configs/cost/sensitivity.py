"""Accelerator projection of LoopSpec against AR and chain, over per-op overhead (experiments/cost_sensitivity.py).

loopspec-cost-report --config=cost/sensitivity.py        # Huginn-0125 and Ouro-1.4B, bf16, 2048 / 8192, batch 1 / 8
loopspec-cost-report --config=cost/sensitivity.py:tiny   # the bundled models' configs at 256, batch 1 (the test)
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.sensitivity = True  # experiments/cost_report.py runs experiments/cost_sensitivity.py
  c.models = "huginn_0125,ouro_1p4b"
  c.model_settings = {
      "huginn_0125": {
          "spec": "huginn:0125",
          "gamma": 14.5,
          "methods": ("ar", "chain:d1=2,gamma=8", "loopspec:d1=2,d2=8"),
      },
      "ouro_1p4b": {"spec": "ouro:1p4b", "gamma": 3.5, "methods": ("ar", "chain:d1=1,gamma=3", "loopspec:d1=1,d2=2")},
      "tiny_raven": {
          "spec": "bundled:tiny-raven",
          "gamma": 14.5,
          "methods": ("ar", "chain:d1=2,gamma=8", "loopspec:d1=2,d2=8"),
          "contexts": (256,),
      },
  }
  c.contexts = (2048, 8192)
  c.batches = (1, 8)
  # (context, batch) points whose loops are compiled; the others are scaled from the first (batch 1) point.
  # A Huginn-0125 loop takes minutes to compile on a loaded 2-core host: add (8192, 1), (2048, 8), ... to compile more.
  c.compile_points = ((2048, 1),)
  c.dtype = "bfloat16"
  c.overheads_us = (0.0, 1.0, 3.0, 5.0)
  c.accelerators = "h100,h200,tpu_v4,tpu_v5e,tpu_v5p"
  c.out_dir = "results/cost_sensitivity"
  c.docs = "docs/cost-projection.md"  # generated from out_dir/sensitivity.json ("" to skip)
  c.table_only = False  # True: the table from out_dir/sensitivity_costs.json as it is, compiling nothing
  if arg == "tiny":
    c.models = "tiny_raven"
    c.batches = (1,)
    c.out_dir = "/tmp/loopspec_cost_sensitivity_tiny"
    c.docs = ""
  elif arg:
    raise ValueError(f"unknown cost/sensitivity.py variant {arg!r} (tiny)")
  return c
