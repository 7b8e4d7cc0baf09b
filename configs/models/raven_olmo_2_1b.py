"""OLMo-2-0425-1B retrofitted into the Raven layout (OLMo-2 post-norm blocks with q/k norm)."""

from configs.models._common import model_config


def get_config(arg=None):
  return model_config(
      arg,
      family="raven-olmo",
      vocab_size=100352,
      hidden_size=2048,
      num_heads=16,
      num_kv_heads=16,
      head_dim=128,
      intermediate_size=8192,
      # The layer split of a retrofitted checkpoint comes from its config.json; this is the layout used for
      # planning.
      n_prelude=4,
      n_core=6,
      n_coda=4,
      recurrence=32,
      max_len=4096,
      rope_theta=500000.0,
      norm_eps=1e-6,
      embed_scale=1.0,  # embed_scale and init_std: in practice read from the checkpoint's init_values
      tie_embeddings=False,
  )
