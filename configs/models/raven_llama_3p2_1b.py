"""Llama-3.2-1B retrofitted into the Raven layout (prelude -> (adapter + core) x R -> coda), llama3 RoPE."""

from configs.models._common import model_config


def get_config(arg=None):
  return model_config(
      arg,
      family="raven-llama",
      vocab_size=128256,
      hidden_size=2048,
      num_heads=32,
      num_kv_heads=8,
      head_dim=64,
      intermediate_size=8192,
      # The layer split of a retrofitted checkpoint comes from its config.json; this is the layout used for
      # planning.
      n_prelude=4,
      n_core=6,
      n_coda=4,
      recurrence=32,
      max_len=131072,
      rope_theta=500000.0,
      rope_llama3=(32.0, 1.0, 4.0, 8192),
      norm_eps=1e-5,
      embed_scale=1.0,
      init_std=0.02,  # in practice read from the checkpoint's config init_values
      tie_embeddings=False,
  )
