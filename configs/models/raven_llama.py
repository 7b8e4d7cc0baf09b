"""Llama-family checkpoints retrofitted into the Raven layout (prelude -> (adapter + core) x R -> coda).

Variants (`get_config(variant)`):
  tiny       a tiny retrofitted-Llama-shaped model for tests (random weights, llama3 RoPE scaling), R = 8
  3p2_1b     Llama-3.2-1B retrofitted, llama3 RoPE
  tinyllama  TinyLlama-1.1B-3T retrofitted (Llama-style pre-norm blocks, GQA 32/4)
The layer split of a retrofitted checkpoint comes from its config.json (as do embed_scale and init_std, from
its init_values); the splits here are the layouts used for planning.
"""

from loopspec_configs.models import _common

_RETROFIT = dict(
    family="raven-llama",
    hidden_size=2048,
    head_dim=64,
    n_prelude=4,
    n_core=6,
    n_coda=4,
    recurrence=32,
    norm_eps=1e-5,
    embed_scale=1.0,
    tie_embeddings=False,
)

VARIANTS = {
    "tiny": dict(
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
    ),
    "3p2_1b": dict(
        _RETROFIT,
        vocab_size=128256,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=8192,
        max_len=131072,
        rope_theta=500000.0,
        rope_llama3=(32.0, 1.0, 4.0, 8192),
        init_std=0.02,
    ),
    "tinyllama": dict(
        _RETROFIT,
        vocab_size=32000,
        num_heads=32,
        num_kv_heads=4,
        intermediate_size=5632,
        max_len=2048,
        rope_theta=10000.0,
    ),
}


def get_config(arg="tiny"):
  return _common.select("raven_llama", VARIANTS, arg or "tiny")
