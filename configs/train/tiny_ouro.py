"""tiny-ouro: an Ouro-style looped model (2 shared layers x R = 4, untied head), ~1.7M parameters (~6.7 MB)."""

from loopspec_configs.models._common import model_config
from loopspec_configs.train._base import base_config


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown preset {arg!r} (override fields with --config.<field>=<value>)")
  c = base_config()
  c.name = "tiny-ouro"
  c.model = model_config(
      family="ouro",
      vocab_size=2048,
      hidden_size=192,
      num_heads=6,
      num_kv_heads=6,
      head_dim=32,
      intermediate_size=512,
      n_prelude=0,
      n_core=2,
      n_coda=0,
      recurrence=4,
      max_len=256,
      rope_theta=10000.0,
      tie_embeddings=False,
      eos_id=0,
  )
  c.objective = "ouro"
  c.ouro_reduce = "mean"
  c.steps = 500
  c.batch_size = 8
  c.seq_len = 256
  c.lr = 3e-3
  c.warmup_steps = 30
  c.workdir = "/tmp/loopspec_train/tiny-ouro"
  c.eval_every = 100
  c.save_every = 50
  c.eval_depths = (1, 2, 3, 4)
  c.card_depths = (1, 2, 3, 4)
  c.export_dir = "loopspec_jax/assets/models/tiny-ouro"
  return c
