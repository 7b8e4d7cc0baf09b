"""Depth analysis: how close each depth's readout is to depth R along full-depth decoded text (the command line
of loopspec_jax/experiment/depths.py).

For every (task, sampling) of the config: decode each prompt with AR, read out every depth on prompt +
generated tokens in one jitted forward, and record greedy agreement, TV(p_r, p_R) and KL(p_R || p_r) at the
generated positions (loopspec_jax/analysis/depth_metrics.py). Per-prompt records are appended to
<out_dir>/depths.jsonl as they finish, so a rerun skips what is done. Writes per (task, sampling)
depths_<task>_<sampling>.json (per-depth means with standard errors across prompts, power-law fits with their
fit quality, Theorem 2's optimum and best feasible pair), depths_<task>_<sampling>.png, and depth_fits.md (one
table over every (task, sampling) of the run).

  loopspec-measure-depths                                 # configs/sweeps/depths.py
  loopspec-measure-depths --config=sweeps/depths.py:tiny  # test-sized
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from loopspec_jax.experiment import depths
from loopspec_jax.experiment.depths import fits_markdown, format_summary, summary_path
from loopspec_experiments import common

__all__ = ["run_depths", "summary_path", "fits_markdown", "format_summary", "run"]

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("sweeps/depths.py"), "Depth analysis settings.", flag_values=FLAGS
)


def run_depths(cfg, model=None) -> dict:
  """The depth analysis of the config's model (or `model`): {(task, sampling): summary}."""
  return depths.run_depths(cfg, model or common.load_model(cfg))


def main(argv):
  del argv
  run_depths(_CONFIG.value)


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
