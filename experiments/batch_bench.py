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
import time

from absl import flags
import jax
from ml_collections import config_flags

from loopspec_configs.mesh import _base as mesh_configs
from loopspec_jax import methods as methods_lib
from loopspec_jax.experiment.batch_bench import benchmark
from loopspec_jax.experiment.batch_bench import markdown
from loopspec_experiments import common
from loopspec_jax.parallel import distributed
from loopspec_jax.parallel import sharding

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("batch_bench.py"), "Batch benchmark settings.", flag_values=FLAGS
)


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
