"""TinyLlama-1.1B-3T retrofitted into the Raven layout (Llama-style pre-norm blocks, GQA 32/4)."""

from configs.models._common import model_config


def get_config(arg=None):
  return model_config(
      arg,
      family="raven-llama",
      vocab_size=32000,
      hidden_size=2048,
      num_heads=32,
      num_kv_heads=4,
      head_dim=64,
      intermediate_size=5632,
      # The layer split of a retrofitted checkpoint comes from its config.json; this is the layout used for
      # planning.
      n_prelude=4,
      n_core=6,
      n_coda=4,
      recurrence=32,
      max_len=2048,
      rope_theta=10000.0,
      norm_eps=1e-5,
      embed_scale=1.0,  # embed_scale and init_std: in practice read from the checkpoint's init_values
      tie_embeddings=False,
  )
