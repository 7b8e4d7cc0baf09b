"""tiny-raven: a Huginn-style looped model (prelude 1, core 2 x R = 32, coda 1), ~1.2M parameters (~4.6 MB)."""

import math

from loopspec_configs.models._common import model_config
from loopspec_configs.train._base import base_config

HIDDEN = 128


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown preset {arg!r} (override fields with --config.<field>=<value>)")
  c = base_config()
  c.name = "tiny-raven"
  c.model = model_config(
      family="huginn",
      vocab_size=2048,
      hidden_size=HIDDEN,
      num_heads=4,
      num_kv_heads=4,
      head_dim=32,
      intermediate_size=384,
      n_prelude=1,
      n_core=2,
      n_coda=1,
      recurrence=32,
      max_len=256,
      rope_theta=50000.0,
      rope_interleaved=True,
      embed_scale=math.sqrt(HIDDEN),
      init_std=math.sqrt(2 / (5 * HIDDEN)),
      tie_embeddings=True,
      eos_id=0,
  )
  c.objective = "raven"
  c.steps = 500
  c.batch_size = 8
  c.seq_len = 256
  c.lr = 3e-3
  c.warmup_steps = 30
  c.mean_recurrence = 8.0
  c.sigma = 0.5
  c.max_recurrence = 32
  c.backprop_depth = 4
  c.aux_depths = (4,)
  c.aux_weight = 1.0
  c.init_state = "random"
  c.workdir = "/tmp/loopspec_train/tiny-raven"
  c.eval_every = 100
  c.save_every = 50
  c.eval_depths = (1, 2, 4, 8, 16)
  c.card_depths = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
  c.export_dir = "loopspec_jax/assets/models/tiny-raven"
  return c
