"""A seconds-long training config for tests: a tiny Huginn-style model, a handful of steps."""

import math

from loopspec_configs.models._common import model_config
from loopspec_configs.train._base import base_config


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown preset {arg!r} (override fields with --config.<field>=<value>)")
  c = base_config()
  c.name = "smoke"
  c.model = model_config(
      family="huginn",
      vocab_size=2048,
      hidden_size=32,
      num_heads=2,
      num_kv_heads=2,
      head_dim=16,
      intermediate_size=64,
      n_prelude=1,
      n_core=1,
      n_coda=1,
      recurrence=4,
      max_len=64,
      rope_theta=10000.0,
      rope_interleaved=True,
      embed_scale=math.sqrt(32),
      init_std=math.sqrt(2 / (5 * 32)),
      tie_embeddings=True,
      eos_id=0,
  )
  c.steps = 40
  c.batch_size = 4
  c.seq_len = 32
  c.lr = 1e-2
  c.warmup_steps = 5
  c.mean_recurrence = 3.0
  c.max_recurrence = 4
  c.backprop_depth = 2
  c.aux_depths = (1,)
  c.save_every = 10
  c.log_every = 0
  c.eval_every = 0
  c.eval_windows = 2
  c.eval_depths = (1, 2)
  c.card_eval_windows = 2
  c.card_depths = (1, 2, 4)
  c.workdir = "/tmp/loopspec_train/smoke"
  c.export_dir = None
  return c
