"""Trains EAGLE heads (loopspec_jax/heads/eagle.py) on features recorded from the frozen tiny-raven target.

    nice -n 10 .venv/bin/python -m loopspec_experiments.train_eagle --out /tmp/eagle_runs --steps 300

Records once a bank of training windows (the target's own corpus, `loopspec_jax.train.data.batch_at`, seed
`--data_seed`) and held-out windows (the held-out Shakespeare tail, `eval_windows`), then trains each feature
choice in `--features` with AdamW and writes, per feature, the head artefact under <out>/<feature>/ and the
figures (steps, wall time, held-out top-1 accuracy per draft level) in <out>/<feature>/train.json.
"""

from __future__ import annotations

import argparse
import json
import os

import loopspec_jax as lj
from loopspec_jax.experiment.eagle_bank import BUNDLED_NAMES
from loopspec_jax.experiment.eagle_bank import bundle
from loopspec_jax.experiment.eagle_bank import feature_banks
from loopspec_jax.experiment.eagle_bank import train_one
from loopspec_jax.heads import artefact
from loopspec_jax.heads import eagle as E


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default="/tmp/eagle_runs")
  ap.add_argument("--features", default="final,fused")
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--crop", type=int, default=128, help="tokens per training window (a random crop)")
  ap.add_argument("--bank", default=None, help="an .npz to cache the recorded features in (reused if present)")
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--unroll", type=int, default=2)
  ap.add_argument("--levels", type=int, default=6)
  ap.add_argument("--train_windows", type=int, default=128)
  ap.add_argument("--heldout_windows", type=int, default=16)
  ap.add_argument("--data_seed", type=int, default=27)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--bundle", default=None, help="feature to bundle from --out (after training)")
  ap.add_argument("--dest", default=None, help="default: the bundled name of --bundle's feature (BUNDLED_NAMES)")
  ap.add_argument("--command", default="")
  args = ap.parse_args(argv)
  model = lj.load("tiny-raven")
  if args.bundle:
    other = [f for f in E.FEATURES if f != args.bundle][0]
    with open(os.path.join(args.out, other, "train.json")) as f:
      other_fig = json.load(f)
    dest = args.dest or os.path.join(artefact.ASSETS, BUNDLED_NAMES[args.bundle])
    bundle(model, os.path.join(args.out, args.bundle), other_fig, dest, 2, args.command)
    return
  train_bank, held_bank = feature_banks(model, args.train_windows, args.heldout_windows, args.data_seed, args.bank)
  os.makedirs(args.out, exist_ok=True)
  for feature in args.features.split(","):
    train_one(model, feature, train_bank, held_bank, args)


if __name__ == "__main__":
  main()
