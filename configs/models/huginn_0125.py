"""Huginn-0125 (Raven, 3.5B): prelude 2, core 4 looped R = 32 times, coda 2; sandwich blocks, tied head."""
import math

from configs.models._common import model_config


def get_config(arg=None):
  return model_config(
      arg,
      family="huginn",
      vocab_size=65536,
      hidden_size=5280,
      num_heads=55,
      num_kv_heads=55,
      head_dim=96,
      intermediate_size=17920,
      n_prelude=2,
      n_core=4,
      n_coda=2,
      recurrence=32,
      max_len=4096,
      rope_theta=50000.0,
      rope_interleaved=True,
      norm_eps=1e-6,
      embed_scale=math.sqrt(5280),
      init_std=math.sqrt(2 / (5 * 5280)),
      tie_embeddings=True,
  )
