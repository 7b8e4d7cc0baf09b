"""Train a small looped model: `python experiments/train.py --config=configs/train/tiny_raven.py`.

Builds (or loads from the cache) the offline corpus and tokenizer, trains with periodic orbax checkpoints in
`config.workdir` (a rerun resumes from the last one with the same data order), then exports the model with
`loopspec_jax.save` and a MODEL_CARD.md to `config.export_dir` (relative paths are taken from the repo root).
Override any field: `--config.steps=200 --config.workdir=/tmp/run`.
"""
from __future__ import annotations

import os
import shlex
import sys
import time

from absl import app
from absl import logging
from ml_collections import config_flags

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # `python experiments/train.py` from a bare checkout
  sys.path.insert(0, _ROOT)

from loopspec_jax.train import trainer as T  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_ROOT, "configs", "train", "tiny_raven.py"), "Training settings (configs/train/).",
    lock_config=True)


def train_from_config(config, command: str = "") -> dict:
  """Trains to config.steps (resuming if possible), exports if config.export_dir; returns the final eval."""
  tr = T.Trainer(config)
  t0 = time.time()
  state = tr.train()
  seconds = time.time() - t0
  tr.close()
  ev = None
  if config.export_dir:
    out = config.export_dir if os.path.isabs(config.export_dir) else os.path.join(_ROOT, config.export_dir)
    ev = tr.export(state, out, command=command, train_seconds=seconds)
    print(f"exported to {out}")
    for d, l, a in zip(ev["depths"], ev["loss"], ev["agreement"]):
      print(f"  depth {d:3d}: loss {l:.4f}  agreement with depth {tr.cfg.recurrence}: {a:.2%}")
  return ev


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  cmd = " ".join(shlex.quote(a) for a in ["python", "experiments/train.py"] + sys.argv[1:])
  train_from_config(_CONFIG.value, command=cmd)


def run():
  app.run(main)


if __name__ == "__main__":
  run()
