"""Settings of the memory planner (`loopspec-plan-memory`, experiments/plan_memory.py).

  loopspec-plan-memory
  loopspec-plan-memory --config.aot_rows=results/tpu_aot/2026-12-07/rows.jsonl --config.out_dir=results/tpu_aot/2026-12-07
  loopspec-plan-memory --config.models=huginn:0125 --config.meshes=1x8,2x4 --config.batches=1,8 \
      --config.device_memory_gib=16 --config.out_dir=results/plan_memory --config.largest_batch_models=""
Lists are comma-separated strings; `none` is an absent value (`--config.d2=none`).
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown preset {arg!r} (override fields with --config.<field>=<value>)")
  c = ml_collections.ConfigDict()
  c.models = "huginn:0125,ouro:2p6b"  # model config specs '<family>:<variant>' (loopspec_configs.models)
  c.dtype = "bfloat16"  # parameter / cache dtype
  c.context = 4096  # context length (cache positions) per request
  c.meshes = "1x8,2x4"  # mesh shapes DATAxMODEL
  c.batches = "1,2,4,8"  # requests per batch (padded to the data axis)
  # models whose largest fitting batch per (mesh, method) to tabulate too ("": none)
  c.largest_batch_models = "huginn:0125,ouro:1p4b,ouro:2p6b,raven_llama:3p2_1b,raven_llama:tinyllama,raven_olmo:2_1b"
  c.methods = "ar,loopspec"
  c.d1 = config_dict.placeholder(int)  # LoopSpec draft depth; none: max(1, R // 8)
  c.d2 = config_dict.placeholder(int)  # LoopSpec second-proposal depth; none: single proposal
  c.lane_capacity = config_dict.placeholder(int)  # LoopSpec lanes per request; none: the default for d1, d2
  c.device_memory_gib = 16.0  # memory per device; larger plans are flagged
  c.mesh_config = config_dict.placeholder(str)  # a configs/mesh module whose rules to use (none: sharding.RULES)
  # the plans beside the TPU compiler's memory analysis (plan_vs_compiler.md in out_dir) instead of the tables:
  c.aot_rows = ""  # a `loopspec-aot` rows.jsonl: its AR / LoopSpec rows ("": none)
  c.aot_compile = False  # compile models x meshes x methods x batches at `context` here (needs libtpu)
  c.aot_target = "tpu:v5e"  # the target aot_compile compiles for (a topology with the meshes' devices)
  c.out_dir = config_dict.placeholder(str)  # write plan_memory.md / .json here (process 0 only); none: print only
  return c
