"""A small Huginn-style model with full depth R = 32 for decoding benchmarks (random or contractive weights)."""
import math

from configs.models._common import model_config


def get_config(arg=None):
  return model_config(
      arg,
      family="huginn",
      vocab_size=512,
      hidden_size=128,
      num_heads=4,
      num_kv_heads=4,
      head_dim=32,
      intermediate_size=256,
      n_prelude=1,
      n_core=2,
      n_coda=1,
      recurrence=32,
      max_len=1024,
      rope_theta=50000.0,
      rope_interleaved=True,
      embed_scale=math.sqrt(128),
      init_std=0.02,
      tie_embeddings=True,
  )
