"""Tiny Ouro-shaped model for tests (random weights)."""

from configs.models._common import model_config


def get_config(arg=None):
  return model_config(
      arg,
      family="ouro",
      vocab_size=64,
      hidden_size=32,
      num_heads=4,
      num_kv_heads=2,
      head_dim=8,
      intermediate_size=64,
      n_prelude=0,
      n_core=2,
      n_coda=0,
      recurrence=4,
      max_len=64,
      rope_theta=1e4,
      tie_embeddings=False,
  )
