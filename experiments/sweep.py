"""(d1, d2) and chain-gamma sweep against AR, compared with the cost identity and Theorem 2's prediction: the
command line of the library's sweep (loopspec_jax/experiment/sweep.py, whose docstring describes the rows, the
resumable sweep.jsonl and the tables; the grid, statistics, tables and greedy replay are its sweep_*.py).

  loopspec-sweep                                    # configs/sweeps/default.py
  loopspec-sweep --config=sweeps/default.py:quick   # a few configurations
  loopspec-sweep --config.mode=replay               # greedy gamma of every pair by replay (no decoding)
  loopspec-sweep --config.mode=project              # the grid's loops projected onto an accelerator
  loopspec-sweep --config.mode=headline             # the headline table of several models' sweeps
"""

from __future__ import annotations

import os

from absl import flags
from ml_collections import config_flags

from loopspec_configs.models import model_config
from loopspec_experiments import common
from loopspec_jax.experiment import sweep_grid
from loopspec_jax.experiment import sweep_report
from loopspec_jax.experiment.sweep import SweepInterrupted, load_drafter, project_costs, run_sweep
from loopspec_jax.experiment.sweep_grid import method_specs
from loopspec_jax.experiment.sweep_replay import replay_rows
from loopspec_jax.experiment.sweep_stats import jackknife_se
from loopspec_jax.experiment.timing import measure
from loopspec_jax.parallel import distributed

# public names (tests and notebooks use them from here): the run, the grid and the jackknife of sweep_stats
__all__ = [
    "SweepInterrupted",
    "run_sweep",
    "replay_rows",
    "method_specs",
    "jackknife_se",
    "load_drafter",
    "measure",
    "project_costs",
    "run",
]

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("sweeps/default.py"), "Sweep settings.", flag_values=FLAGS
)


def main(argv):
  del argv
  distributed.initialize_from_env()  # a no-op for one process
  cfg = _CONFIG.value
  mode = cfg.get("mode", "engine")
  if mode == "project":  # the loops of the configured engine grid (replayed pairs share d1)
    pcfg = model_config(cfg.projection_model)
    # no projected loop for a separate drafter: its cost depends on the drafter, not on (d1, d2)
    specs = method_specs(cfg, pcfg.recurrence)
    project_costs(
        cfg, [dict(method=m.name, **sweep_grid.grid_fields(m)) for m in specs if not m.separate_drafter], pcfg
    )
    return
  if mode == "headline":
    text = sweep_report.headline_markdown(
        common.split_list(cfg.headline_dirs), cfg.get("headline_wall_clock") or "sweep"
    )
    print(text)
    if common.is_main_process():
      common.atomic_write_text(cfg.headline_out, text + "\n")
    return
  model = common.load_model(cfg)
  res = replay_rows(cfg, model) if mode == "replay" else run_sweep(cfg, model)
  name = "replay" if mode == "replay" else "sweep"
  print(res["table"])
  print(f"rows in {os.path.join(cfg.out_dir, name + '.jsonl')}, table in {os.path.join(cfg.out_dir, name + '.md')}")


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
