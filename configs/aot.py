"""Settings of the compile-only TPU report (`loopspec-aot`, experiments/aot.py).

  loopspec-aot                                   # the default grid below, rows to results/tpu_aot/<date>/
  loopspec-aot --config.models=huginn:0125 --config.methods=ar --config.targets=tpu:v5p
  loopspec-aot --config=configs/aot.py:full      # issue 43's whole grid (`grids`), resumable
Lists are comma-separated strings (methods: ';'-separated specs, `{d1}` / `{d2}` filled per model).
"""

import ml_collections

from loopspec_jax.analysis import aot

_LOOPSPEC = "ar;loopspec:d1={d1},d2={d2}"
_ALL_MODELS = "huginn:0125,ouro:1p4b,ouro:2p6b,raven_llama:3p2_1b"
# The grid asked for in issue 43: every method of every model on one v5e chip (b1, 2048), and of Huginn-0125
# on one v5p chip too (the table: where a v5e chip refuses a method, the memory it takes); AR and
# LoopSpec on one chip of each generation at batch 1 / 8 and contexts 2048 / 8192; AR and LoopSpec at batch 8
# sharded over the meshes docs/scaling.md recommends (v5e-8: 1x8, 2x4; v5e-16: 1x16, 2x8) at both contexts.
FULL_GRIDS = (
    dict(methods=";".join(aot.METHOD_SPECS), other_methods=";".join(aot.METHOD_SPECS)),
    dict(models="huginn:0125", methods=";".join(aot.METHOD_SPECS), targets="tpu:v5p"),
    dict(methods=_LOOPSPEC, targets="tpu:v5e,tpu:v4,tpu:v5p,tpu:v6e", batches="1,8", contexts="2048,8192"),
    dict(methods=_LOOPSPEC, targets="tpu:v5e:2x4", meshes="1x8,2x4", batches="8", contexts="2048,8192"),
    dict(methods=_LOOPSPEC, targets="tpu:v5e:4x4", meshes="1x16,2x8", batches="8", contexts="2048,8192"),
)


def get_config(arg=None):
  if arg not in (None, "", "full"):
    raise ValueError(f"unknown preset {arg!r}: 'full' (override fields with --config.<field>=<value>)")
  c = ml_collections.ConfigDict()
  c.models = _ALL_MODELS  # configs.models specs
  c.dtype = "bfloat16"
  # every registered method at the first model (`aot.METHOD_SPECS`); the others: `other_methods`
  c.methods = ";".join(aot.METHOD_SPECS)
  c.other_methods = _LOOPSPEC
  c.targets = "tpu:v5e"  # compile targets (analysis/aot.py): one chip of each with mesh 1x1
  c.meshes = "1x1"  # DATAxMODEL
  c.batches = "1"
  c.contexts = "2048"
  c.overrides = ""  # integer ModelConfig fields set on every model, e.g. "n_core=2,recurrence=4" (own out_dir)
  # several grids in one run: each a dict of the fields above that differ (the rest as set here); their union
  c.grids = FULL_GRIDS if arg == "full" else ()
  c.out_dir = "results/tpu_aot/2026-12-06"  # rows.jsonl here (appended; rows already there are skipped)
  c.isolate = True  # compile each row in a fresh process (no memory carried over; a killed compile loses one row)
  c.hlo_dir = ""  # keep each TPU HLO here (gzip, not committed: 10+ MB each); "": not kept
  c.reparse = False  # only recompute the parser's fields of rows.jsonl from the HLO kept in hlo_dir
  c.merge = ""  # folders (newest first): only write out_dir/merged.md, each grid row from the newest that has it
  c.micro = False  # only compile the programs of known traffic (micro.jsonl: XLA's and the parser's counts)
  return c
