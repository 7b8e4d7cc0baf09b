"""Settings of the compile-only TPU report (`loopspec-aot`, experiments/aot.py).

  loopspec-aot                                   # the default grid below, rows to results/tpu_aot/<date>/
  loopspec-aot --config.models=huginn:0125 --config.methods=ar --config.targets=tpu:v5p
Lists are comma-separated strings (methods: ';'-separated specs, `{d1}` / `{d2}` filled per model).
"""

import ml_collections

from loopspec_jax.analysis import aot


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown preset {arg!r} (override fields with --config.<field>=<value>)")
  c = ml_collections.ConfigDict()
  c.models = "huginn:0125,ouro:1p4b,ouro:2p6b,raven_llama:3p2_1b"  # configs.models specs
  c.dtype = "bfloat16"
  # every registered method at the first model (`aot.METHOD_SPECS`); the others: `other_methods`
  c.methods = ";".join(aot.METHOD_SPECS)
  c.other_methods = "ar;loopspec:d1={d1},d2={d2}"
  c.targets = "tpu:v5e"  # compile targets (analysis/aot.py): one chip of each with mesh 1x1
  c.meshes = "1x1"  # DATAxMODEL
  c.batches = "1"
  c.contexts = "2048"
  c.overrides = ""  # integer ModelConfig fields set on every model, e.g. "n_core=2,recurrence=4" (own out_dir)
  c.out_dir = "results/tpu_aot/2026-12-06"  # rows.jsonl here (appended; rows already there are skipped)
  c.hlo_dir = ""  # keep each TPU HLO here (gzip, not committed: 10+ MB each); "": not kept
  c.reparse = False  # only recompute the parser's fields of rows.jsonl from the HLO kept in hlo_dir
  c.merge = ""  # folders (newest first): only write out_dir/merged.md, each grid row from the newest that has it
  c.micro = False  # only compile the programs of known traffic (micro.jsonl: XLA's and the parser's counts)
  return c
