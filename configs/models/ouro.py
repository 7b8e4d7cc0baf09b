"""Ouro models (ByteDance): shared layers looped R times with an exit gate, untied head.

Variants (`get_config(variant)`):
  tiny   a tiny Ouro-shaped model for tests (random weights), R = 4
  1p4b   Ouro-1.4B: 24 shared layers looped R = total_ut_steps = 4 times, SmolLM2 tokenizer
  2p6b   Ouro-2.6B: as Ouro-1.4B but 48 shared layers
"""

from loopspec_configs.models import _common

_REAL = dict(
    family="ouro",
    vocab_size=49152,
    hidden_size=2048,
    num_heads=16,
    num_kv_heads=16,
    head_dim=128,
    intermediate_size=5632,
    n_prelude=0,
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

VARIANTS = {
    "tiny": dict(
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
    ),
    "1p4b": dict(_REAL, n_core=24),
    "2p6b": dict(_REAL, n_core=48),
}


def get_config(arg="tiny"):
  return _common.select("ouro", VARIANTS, arg or "tiny")
