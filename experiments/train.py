"""Train a small looped model: `loopspec-train --config=train/tiny_raven.py` (configs in configs/).

Builds (or loads from the cache) the offline corpus and tokenizer, trains with periodic orbax checkpoints in
`config.workdir` (a rerun resumes from the last one with the same data order), then exports the model with
`loopspec_jax.save` and a MODEL_CARD.md to `config.export_dir` (a relative path is taken from the checkout
root, the folder holding loopspec_jax/, so the bundled models are rewritten in place).
Override any field: `--config.steps=200 --config.workdir=/tmp/run`.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
import time

from absl import flags
from ml_collections import config_flags

import loopspec_jax
from loopspec_experiments import common
from loopspec_jax.train import trainer as T

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("train/tiny_raven.py"), "Training settings.", flag_values=FLAGS
)
# The folder holding the package: relative export directories (loopspec_jax/assets/models/...) start here.
CHECKOUT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(loopspec_jax.__file__)))


def export_path(export_dir: str) -> str:
  """An absolute export directory: as given, or relative to the checkout root."""
  return export_dir if os.path.isabs(export_dir) else os.path.join(CHECKOUT_ROOT, export_dir)


HEAD_TRAINERS = {  # heads_kind -> (module under loopspec_jax.heads, trainer class)
    "medusa": ("medusa_train", "MedusaTrainer"),
    "eagle": ("eagle_train", "EagleTrainer"),
    "dflash": ("dflash_train", "DFlashTrainer"),
}


def head_trainer(config):
  """The trainer of `config.heads_kind` (train/tiny_raven_medusa.py, train/tiny_raven_eagle.py)."""
  if config.heads_kind not in HEAD_TRAINERS:
    raise ValueError(f"loopspec-train knows no heads_kind {config.heads_kind!r} (known: {sorted(HEAD_TRAINERS)})")
  module, cls = HEAD_TRAINERS[config.heads_kind]
  return getattr(importlib.import_module(f"loopspec_jax.heads.{module}"), cls)(config)


def train_heads_from_config(config, command: str = "") -> dict:
  """Draft heads on a frozen target (`config.heads_kind`): trains to config.steps (resuming from the last
  checkpoint in config.workdir), exports the artefact and its card if config.export_dir."""
  tr = head_trainer(config)
  t0 = time.time()
  state = tr.train()
  seconds = time.time() - t0
  tr.close()
  ev = None
  if config.export_dir:
    out = export_path(config.export_dir)
    ev = tr.export(state, out, command=command, seconds=seconds)
    figures = ev.get("accuracy") or ev.get("level_top1")
    print(f"exported to {out}; held-out top-1: {[round(a, 4) for a in figures]}")
  return ev


def train_from_config(config, command: str = "") -> dict:
  """Trains to config.steps (resuming if possible), exports if config.export_dir; returns the final eval."""
  if config.get("heads_kind"):
    return train_heads_from_config(config, command)
  tr = T.Trainer(config)
  t0 = time.time()
  state = tr.train()
  seconds = time.time() - t0
  tr.close()
  ev = None
  if config.export_dir:
    out = export_path(config.export_dir)
    ev = tr.export(state, out, command=command, train_seconds=seconds)
    print(f"exported to {out}")
    for d, l, a in zip(ev["depths"], ev["loss"], ev["agreement"]):
      print(f"  depth {d:3d}: loss {l:.4f}  agreement with depth {tr.cfg.recurrence}: {a:.2%}")
  return ev


def main(argv):
  del argv
  cmd = " ".join(shlex.quote(a) for a in ["loopspec-train"] + sys.argv[1:])
  train_from_config(_CONFIG.value, command=cmd)


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
