"""Every decode loop compiled for a TPU without a TPU: memory, KV copies in loops and two cost estimates.

For each (model, method, target, mesh, batch, context) the decoder's loop is compiled from abstract values
for a TPU topology (`loopspec_jax.analysis.aot`, libtpu from the `[tpu]` extra) and one JSON row is appended
to <out_dir>/rows.jsonl: the TPU compiler's memory analysis (and whether it fits one chip's HBM; a program
over HBM is refused by the compiler, which names its temporaries), the KV copies inside while bodies, XLA's
cost_analysis (flops, bytes, optimal_seconds: the whole program, one loop iteration and what is outside the
loop) beside the repository's HLO parser on the same TPU HLO (one iteration of the outer loop), and the ideal
bytes of one AR token (`cost.ar_token_bytes`). Rows already in the file are skipped, so a run resumes.

  loopspec-aot
  loopspec-aot --config.models=huginn:0125 --config.methods="ar;loopspec:d1=2,d2=8" --config.targets=tpu:v5p

Settings: configs/aot.py.
"""

from __future__ import annotations

import gzip
import json
import os

from absl import flags
import jax
from ml_collections import config_flags

from loopspec_jax.analysis import aot, cost
from loopspec_jax.configs import models as model_configs
from loopspec_jax.experiments import common

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file("config", common.config_path("aot.py"), "AOT settings.", flag_values=FLAGS)
KEY = ("model", "method", "target", "mesh", "batch", "context")


def depths(cfg) -> dict:
  """LoopSpec / chain draft depths of a model: (2, 8) at R = 32 (the paper's Huginn setting), else R/16, R/4."""
  r = cfg.recurrence
  return {"d1": 2, "d2": 8} if r >= 32 else {"d1": max(1, r // 16), "d2": max(2, r // 4)}


def parser_row(r: aot.AotLoop, cfg, batch: int, context: int) -> dict:
  """The HLO parser on the TPU HLO (one iteration of the outer loop) and the ideal AR token."""
  ideal = cost.ar_token_bytes(cfg, context, batch)
  row = {"ideal_bytes": ideal["weights"] + ideal["kv"]}
  if r.compiled:
    step = cost.analyze_hlo(r.hlo, r.kv_dims, r.slot_bytes)
    row.update(parser_bytes=step.total_bytes, parser_flops=step.flops, parser_bytes_by_category=dict(step.bytes))
  return row


def hlo_path(hlo_dir: str, key: tuple) -> str:
  return os.path.join(hlo_dir, "_".join(str(k) for k in key).replace(":", "-").replace(",", "-") + ".hlo.gz")


def measure(spec: str, method: str, target: str, mesh: tuple, batch: int, context: int, dtype: str, hlo_dir=None):
  """One row; with hlo_dir, the TPU HLO is kept there (gzip) for `reparse`."""
  cfg = model_configs.model_config(spec).replace(dtype=dtype, max_len=context)
  r = aot.compile_loop(cfg, method, target, mesh, batch=batch)
  row = {
      "model": spec,
      "method": method,
      "target": r.target,
      "mesh": "x".join(map(str, mesh)),
      "batch": batch,
      "context": context,
      "compiled": r.compiled,
      "error": r.error,
      "compile_seconds": r.compile_seconds,
      **{k: r.memory.get(k) for k in ("argument_bytes", "temp_bytes", "output_bytes", "alias_bytes", "hbm_bytes")},
      "fits": r.memory.get("fits"),
      "loop_copies": r.loop_copies,
      "xla_bytes": r.xla_cost.get("bytes accessed"),
      "xla_flops": r.xla_cost.get("flops"),
      "xla_optimal_seconds": r.xla_cost.get("optimal_seconds"),
      "parser_bytes": None,
      "parser_flops": None,
      "host": common.machine_description(),
      "jax": jax.__version__,
  }
  row.update(parser_row(r, cfg, batch, context))
  if hlo_dir and r.compiled:
    os.makedirs(hlo_dir, exist_ok=True)
    with gzip.open(hlo_path(hlo_dir, tuple(row[k] for k in KEY)), "wt") as fh:
      fh.write(r.hlo)
  return row


def reparse(path: str, hlo_dir: str, dtype: str):
  """Recomputes the parser's fields of every row whose HLO was kept in hlo_dir (after a parser change)."""
  with open(path) as fh:
    rows = [json.loads(line) for line in fh if line.strip()]
  for row in rows:
    src = hlo_path(hlo_dir, tuple(row[k] for k in KEY))
    if not row["compiled"] or not os.path.exists(src):
      continue
    cfg = model_configs.model_config(row["model"]).replace(dtype=dtype, max_len=row["context"])
    loop = cost.abstract_loop(cfg, row["method"], batch=row["batch"], **aot.stand_in_arguments(cfg, row["method"]))
    with gzip.open(src, "rt") as fh:
      hlo = fh.read()
    slot = cost.slot_bytes(cfg, row["batch"], loop.total_len)
    step = cost.analyze_hlo(hlo, cost.kv_leaf_dims(loop.state), slot)
    row.update(parser_bytes=step.total_bytes, parser_flops=step.flops, parser_bytes_by_category=dict(step.bytes))
  common.atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def grid(f) -> list:
  """(model, method spec, target, mesh, batch, context) of every row asked for."""
  out = []
  for i, spec in enumerate(common.split_list(f.models)):
    d = depths(model_configs.model_config(spec))
    specs = [m.strip().format(**d) for m in (f.methods if i == 0 else f.other_methods).split(";") if m.strip()]
    for method in specs:
      for target in common.split_list(f.targets):
        for mesh in common.split_list(f.meshes):
          for batch in common.split_list(f.batches):
            for context in common.split_list(f.contexts):
              out.append((spec, method, target, tuple(int(x) for x in mesh.split("x")), int(batch), int(context)))
  return out


def done_keys(path: str) -> set:
  if not os.path.exists(path):
    return set()
  with open(path) as fh:
    rows = [json.loads(line) for line in fh if line.strip()]
  return {tuple(r[k] for k in KEY) for r in rows}


def main(argv):
  del argv
  f = _CONFIG.value
  reason = aot.tpu_unavailable()
  if reason:
    raise SystemExit(f"loopspec-aot: {reason}")
  path = os.path.join(f.out_dir, "rows.jsonl")
  os.makedirs(f.out_dir, exist_ok=True)
  if f.reparse:
    return reparse(path, f.hlo_dir, f.dtype)
  done = done_keys(path)
  for spec, method, target, mesh, batch, context in grid(f):
    key = (spec, method, aot.parse_target(target).name, "x".join(map(str, mesh)), batch, context)
    if key in done:
      continue
    row = measure(spec, method, target, mesh, batch, context, f.dtype, f.hlo_dir)
    with open(path, "a") as fh:
      fh.write(json.dumps(row) + "\n")
    gb = lambda k: f"{row[k] / 1e9:.2f}" if row.get(k) is not None else "-"
    print(
        f"{spec} {method} {key[2]} {key[3]} b{batch} ctx{context}: compiled={row['compiled']} fits={row['fits']} "
        f"temp={gb('temp_bytes')} GB copies={row['loop_copies']} parser={gb('parser_bytes')} xla={gb('xla_bytes')} GB "
        f"({row['compile_seconds']:.0f} s)",
        flush=True,
    )


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
