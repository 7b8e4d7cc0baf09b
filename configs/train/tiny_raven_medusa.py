"""tiny-raven-medusa: 4 Medusa-1 heads on the frozen bundled tiny-raven (`loopspec_jax/heads/medusa.py`).

`loopspec-train --config=train/tiny_raven_medusa.py` trains them (resumable from `workdir`) and exports the
bundled artefact with its model card to `export_dir`.
"""

from loopspec_configs.train._base import base_config


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown preset {arg!r} (override fields with --config.<field>=<value>)")
  c = base_config()
  c.name = "tiny-raven-medusa"
  c.heads_kind = "medusa"  # loopspec-train trains heads on a frozen target instead of a model
  c.target = "tiny-raven"
  c.num_heads = 4
  c.seed = 1
  c.steps = 60
  c.batch_size = 8
  c.seq_len = 128
  c.lr = 3e-3
  c.warmup_steps = 5
  c.min_lr_ratio = 0.1
  c.weight_decay = 0.0
  c.grad_clip = 1.0
  c.log_every = 10
  c.save_every = 10
  c.card_eval_windows = 16
  c.workdir = "/tmp/loopspec_train/tiny-raven-medusa"
  c.export_dir = "loopspec_jax/assets/heads/tiny-raven-medusa"
  return c
