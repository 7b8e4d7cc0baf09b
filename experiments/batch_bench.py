"""Batch-size benchmark: decode tokens/s of AR and LoopSpec for B requests decoded together.

LoopSpec keeps B independent lane tables in one compiled loop: every tick runs d1 core-step calls over all
B x N lanes (N ~ R/d1 + 1) and reads out every lane, i.e. about as many core steps per committed token as
AR (d1 * N ~ R + d1) plus N readouts and the lane bookkeeping, but in R/d1 times fewer sequential calls.
At small B the device is latency-bound and the shorter chain wins; as B grows the batch becomes
compute-bound, the extra work shows, and AR overtakes it. The report gives the table and the first B where
LoopSpec is no longer faster: call `generate(..., method='loopspec', speculate_max_batch=K)` with K the
largest B where it still pays, and batches of more than K requests decode with AR instead.

  loopspec-batch-bench
  loopspec-batch-bench --config.batch_sizes=1,4 --config.max_new_tokens=16      # quick
  loopspec-batch-bench --config.mesh=v5e_8        # sharded: a configs/mesh module, optionally ':DATAxMODEL'

Settings: configs/batch_bench.py.
"""

from __future__ import annotations

import os
import statistics
import time

from absl import flags
import jax
from ml_collections import config_flags
import numpy as np

import loopspec_jax
from loopspec_configs.mesh import _base as mesh_configs
from loopspec_jax import methods as methods_lib
from loopspec_experiments import common
from loopspec_jax.parallel import distributed
from loopspec_jax.parallel import sharding

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("batch_bench.py"), "Batch benchmark settings.", flag_values=FLAGS
)


def run_one(model, prompts, method, cfg, mesh):
  """One batched `generate` call of a method."""
  res = loopspec_jax.generate(
      model,
      prompts,
      max_new_tokens=cfg.max_new_tokens,
      method=method,
      temperature=cfg.temperature,
      seed=cfg.seed,
      mesh=mesh,
  )
  return res


def benchmark(model, cfg, mesh=None, progress=print) -> list:
  """One row per batch size: median decode tokens/s of each method (after an untimed compile run)."""
  rng = np.random.RandomState(cfg.seed)
  methods = methods_lib.parse_list(cfg.methods)
  labels = [m.label for m in methods]
  rows = []
  for b in common.split_list(cfg.batch_sizes):
    prompts = [rng.randint(0, model.config.vocab_size, cfg.prompt_len).tolist() for _ in range(int(b))]
    row = {"batch": int(b)}
    outputs = {}
    for method, label in zip(methods, labels):
      t0 = time.perf_counter()
      outputs[label] = run_one(model, prompts, method, cfg, mesh).tokens  # compiles
      compile_s = time.perf_counter() - t0
      stats = [run_one(model, prompts, method, cfg, mesh).stats for _ in range(cfg.repeats)]
      tps = statistics.median(s["tokens_per_second"] for s in stats)
      row[label] = {
          "tokens_per_second": tps,
          "tokens": stats[0]["tokens_generated"],
          "decode_seconds": statistics.median(s["decode_seconds"] for s in stats),
          "first_call_seconds": compile_s,
          "ticks": stats[0].get("ticks"),
      }
      progress(f"B={b:>3} {label:<18} {tps:9.1f} tok/s   (first call {compile_s:.1f} s)")
    ref = labels[0]
    for label in labels[1:]:
      row[label]["speedup_vs_" + ref] = row[label]["tokens_per_second"] / max(row[ref]["tokens_per_second"], 1e-9)
      row[label]["identical_to_" + ref] = (outputs[label] == outputs[ref]) if cfg.temperature == 0 else None
    rows.append(row)
  return rows


def stops_paying(rows: list, ref: str, label: str):
  """The first batch size where `label` is not faster than `ref` (None: it pays at every size measured)."""
  for row in rows:
    if row[label]["tokens_per_second"] <= row[ref]["tokens_per_second"]:
      return row["batch"]
  return None


def markdown(rows: list, labels: list) -> str:
  ref = labels[0]
  head = (
      "| B | "
      + " | ".join(f"{l} tok/s" for l in labels)
      + " | "
      + " | ".join(f"{l} / {ref}" for l in labels[1:])
      + " | identical |"
  )
  lines = [head, "|" + "---|" * (len(labels) * 2 + 1)]
  for row in rows:
    cells = [f"{row[l]['tokens_per_second']:.1f}" for l in labels]
    ratios = [f"{row[l]['speedup_vs_' + ref]:.2f}x" for l in labels[1:]]
    same = all(row[l].get("identical_to_" + ref) for l in labels[1:])
    lines.append(f"| {row['batch']} | " + " | ".join(cells + ratios) + f" | {'yes' if same else 'NO'} |")
  notes = []
  for l in labels[1:]:
    b = stops_paying(rows, ref, l)
    notes.append(
        f"{l} stops paying at B = {b}" if b is not None else f"{l} pays at every measured B (<= {rows[-1]['batch']})"
    )
  return "\n".join(lines) + "\n\n" + "; ".join(notes) + "."


def main(argv):
  del argv
  distributed.initialize_from_env()
  cfg = _CONFIG.value
  mesh = None
  model = common.resolve_model(cfg.model, contraction=cfg.contraction, seed=cfg.seed)
  if cfg.mesh:
    mc = mesh_configs.resolve(cfg.mesh)
    mesh = sharding.plan(sharding.mesh_from_config(mc), sharding.rules_from_config(mc))
    model = sharding.shard_model(model, mesh)
  t0 = time.perf_counter()
  rows = benchmark(model, cfg, mesh, progress=lambda s: print(s, flush=True))
  labels = [m.label for m in methods_lib.parse_list(cfg.methods)]
  machine = (
      f"{os.cpu_count()} CPU cores, {jax.device_count()} x {jax.devices()[0].platform}, jax {jax.__version__}, "
      f"mesh {tuple(mesh.mesh.shape.values()) if mesh is not None else 'none'}"
  )
  text = (
      f"Model {cfg.model} (contraction {cfg.contraction}), prompt {cfg.prompt_len}, "
      f"{cfg.max_new_tokens} new tokens, temperature {cfg.temperature}; {machine}; "
      f"total {time.perf_counter() - t0:.0f} s\n\n" + markdown(rows, labels)
  )
  print(text)
  if common.is_main_process():
    common.write_report(cfg.out_dir, "batch_bench", {"config": cfg.to_dict(), "rows": rows}, text)


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
