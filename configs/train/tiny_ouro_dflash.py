"""tiny-ouro-dflash: a DFlash block drafter on the frozen bundled tiny-ouro (R = 4, the paper's Ouro setting;
`loopspec_jax/heads/dflash.py`), trained resumably by `loopspec-train` (loopspec_jax/heads/dflash_train.py: the
target's states at depths 1, 2, 4 and its distribution per step, batch k of the target's corpus, checkpoints in
`workdir`), exported to the bundled artefact with its model card.

  loopspec-train --config=train/tiny_ouro_dflash.py
"""

from loopspec_configs.train._base import base_config


def dflash_config(target: str, steps: int):
  """The DFlash drafter settings shared by the bundled targets (`target`: a bundled model's name)."""
  c = base_config()
  c.name = f"{target}-dflash"
  c.heads_kind = "dflash"  # loopspec-train trains a head on a frozen target instead of a model
  c.target = target
  c.depths = ()  # () = the default (1, R/2, R)
  c.layers = 2
  c.gamma = 6  # the block the drafter is trained for (block size 7 with the anchor)
  c.decay = 4.0  # slot weights exp(-(i - 1) / decay)
  c.anchors = 8  # blocks per training window
  c.seed = 0
  c.steps = steps
  c.batch_size = 8
  c.seq_len = 128
  c.lr = 3e-3
  c.warmup_steps = 20
  c.min_lr_ratio = 0.1
  c.weight_decay = 0.0
  c.grad_clip = 1.0
  c.log_every = 25
  c.save_every = 50
  c.card_eval_windows = 16
  c.workdir = f"/tmp/loopspec_train/{c.name}"
  c.export_dir = f"loopspec_jax/assets/heads/{c.name}"
  return c


def get_config(arg=None):
  del arg
  return dflash_config("tiny-ouro", steps=400)
