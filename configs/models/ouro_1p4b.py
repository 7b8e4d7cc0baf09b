"""Ouro-1.4B (ByteDance): 24 shared layers looped R = total_ut_steps = 4 times, SmolLM2 tokenizer."""

from configs.models._common import model_config


def get_config(arg=None):
  return model_config(
      arg,
      family="ouro",
      vocab_size=49152,
      hidden_size=2048,
      num_heads=16,
      num_kv_heads=16,
      head_dim=128,
      intermediate_size=5632,
      n_prelude=0,
      n_core=24,
      n_coda=0,
      recurrence=4,
      max_len=65536,
      rope_theta=1e6,
      norm_eps=1e-6,
      tie_embeddings=False,
      has_exit_gate=True,
      bos_id=0,
      eos_id=0,
  )
