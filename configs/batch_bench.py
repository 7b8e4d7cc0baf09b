"""Settings of the batch-size benchmark (`loopspec-batch-bench`, experiments/batch_bench.py).

loopspec-batch-bench
loopspec-batch-bench --config.batch_sizes=1,4 --config.max_new_tokens=16      # quick
loopspec-batch-bench --config.mesh=v5e_8        # sharded: a configs/mesh module, optionally ':DATAxMODEL'
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown preset {arg!r} (override fields with --config.<field>=<value>)")
  c = ml_collections.ConfigDict()
  c.model = "random:huginn:bench_r32"  # 'random:<family>:<variant>', a bundled model or a checkpoint dir
  c.contraction = ml_collections.FieldReference(0.05, field_type=float)  # 'random:' models only; none: off
  c.seed = 0
  c.batch_sizes = "1,4,16,64"  # comma-separated
  c.methods = ("ar", "loopspec:d1=4")  # method specs; the first is the reference of the ratios
  c.prompt_len = 16
  c.max_new_tokens = 24
  c.repeats = 2
  c.temperature = 0.0
  c.mesh = config_dict.placeholder(str)  # configs/mesh module (e.g. 'v5e_8', 'cpu8:8x1'); none: one device
  c.out_dir = "results/batch_bench"
  return c
