"""Depth analysis: how close each depth's readout is to depth R along full-depth decoded text (the command line
of loopspec_jax/experiment/depths.py).

Per (task, sampling) of the config: agreement, TV and KL of every depth against depth R at the generated
positions, resumable (<out_dir>/depths.jsonl), written as depths_<task>_<sampling>.json / .png and
depth_fits.md; the library module's docstring has the details.

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
