"""Tiny retrofitted-Llama-shaped Raven model for tests (random weights, llama3 RoPE scaling)."""

from configs.models._common import model_config


def get_config(arg=None):
  return model_config(
      arg,
      family="raven-llama",
      vocab_size=64,
      hidden_size=32,
      num_heads=4,
      num_kv_heads=2,
      head_dim=8,
      intermediate_size=48,
      n_prelude=1,
      n_core=2,
      n_coda=1,
      recurrence=8,
      max_len=64,
      rope_theta=5e5,
      rope_llama3=(8.0, 1.0, 4.0, 16),
      init_std=0.05,
      tie_embeddings=False,
  )
