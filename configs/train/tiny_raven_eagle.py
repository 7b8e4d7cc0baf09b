"""tiny-raven-eagle (fused feature) / tiny-raven-eagle-final: an EAGLE head on the frozen bundled tiny-raven
(`loopspec_jax/heads/eagle.py`), trained resumably by `loopspec-train` (loopspec_jax/heads/eagle_train.py:
the target's features per step, batch k of the target's corpus, checkpoints in `workdir`).

  loopspec-train --config=train/tiny_raven_eagle.py          # the fusion of the states at depths 2, 16, 32
  loopspec-train --config=train/tiny_raven_eagle.py:final    # the post-coda final feature

The bundled tiny-raven-eagle is the fused head (it meets the EAGLE target on both tasks of
docs/heads-benchmark.md); the final-feature head is bundled as tiny-raven-eagle-final.

The bundled head was trained by experiments/train_eagle.py (a recorded feature bank, its MODEL_CARD.md says
how); `export_dir` is unset here so a run does not overwrite it: `--config.export_dir=<dir>` exports.
"""

from loopspec_configs.train._base import base_config


def get_config(arg=None):
  if arg not in (None, "", "final", "fused"):
    raise ValueError(f"unknown preset {arg!r} (final, fused; override fields with --config.<field>=<value>)")
  c = base_config()
  c.feature = arg or "fused"
  c.name = "tiny-raven-eagle" if c.feature == "fused" else "tiny-raven-eagle-final"
  c.heads_kind = "eagle"  # loopspec-train trains a head on a frozen target instead of a model
  c.target = "tiny-raven"
  c.depths = ()  # fused: () = the default (2, R/2, R)
  c.noise = 0.2
  c.unroll = 2
  c.levels = 6  # draft levels the card's held-out accuracy reports
  c.seed = 0
  c.steps = 300
  c.batch_size = 8
  c.seq_len = 128
  c.lr = 3e-3
  c.warmup_steps = 20
  c.min_lr_ratio = 0.1
  c.weight_decay = 0.0
  c.grad_clip = 1.0
  c.log_every = 25
  c.save_every = 25
  c.card_eval_windows = 16
  c.workdir = f"/tmp/loopspec_train/{c.name}"
  c.export_dir = None
  return c
