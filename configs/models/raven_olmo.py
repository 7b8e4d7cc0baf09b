"""OLMo-2 checkpoints retrofitted into the Raven layout (OLMo-2 post-norm blocks with q/k norm).

Variants (`get_config(variant)`):
  tiny   a tiny retrofitted-OLMo-2-shaped model for tests (random weights, no RoPE scaling), R = 8
  2_1b   OLMo-2-0425-1B retrofitted (the layer split, embed_scale and init_std of a real checkpoint come from
         its config.json; this is the layout used for planning)
"""

from loopspec_configs.models import _common

VARIANTS = {
    "tiny": dict(
        family="raven-olmo",
        vocab_size=64,
        hidden_size=32,
        num_heads=4,
        num_kv_heads=4,
        head_dim=8,
        intermediate_size=48,
        n_prelude=1,
        n_core=2,
        n_coda=1,
        recurrence=8,
        max_len=64,
        rope_theta=5e5,
        init_std=0.05,
        tie_embeddings=False,
    ),
    "2_1b": dict(
        family="raven-olmo",
        vocab_size=100352,
        hidden_size=2048,
        num_heads=16,
        num_kv_heads=16,
        head_dim=128,
        intermediate_size=8192,
        n_prelude=4,
        n_core=6,
        n_coda=4,
        recurrence=32,
        max_len=4096,
        rope_theta=500000.0,
        norm_eps=1e-6,
        embed_scale=1.0,
        tie_embeddings=False,
    ),
}


def get_config(arg="tiny"):
  return _common.select("raven_olmo", VARIANTS, arg or "tiny")
