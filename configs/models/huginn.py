"""Huginn / Raven models: prelude -> (adapter + core) x R -> coda, sandwich blocks, tied head.

Variants (`get_config(variant)`):
  tiny       a tiny Huginn-shaped model for tests (random weights), R = 8
  0125       Huginn-0125 (Raven, 3.5B): prelude 2, core 4 looped R = 32 times, coda 2
  bench_r32  a small model with full depth R = 32 for decoding benchmarks (random or contractive weights)
  bench_e512 Huginn-0125's layout at E = 512 (8 heads of 64, MLP 3.375 E, vocabulary 65536, 2 / 4 / 2, R = 32):
             63.7M float32 parameters whose weights do not fit a CPU's caches, so decoding is memory-bound as
             on an accelerator (the CPU benchmark of that regime, and the reference-speed comparison)
"""

import math

from loopspec_configs.models import _common

HUGINN_0125 = dict(
    family="huginn",
    vocab_size=65536,
    hidden_size=5280,
    num_heads=55,
    num_kv_heads=55,
    head_dim=96,
    intermediate_size=17920,
    n_prelude=2,
    n_core=4,
    n_coda=2,
    recurrence=32,
    max_len=4096,
    rope_theta=50000.0,
    rope_interleaved=True,
    norm_eps=1e-6,
    embed_scale=math.sqrt(5280),
    init_std=math.sqrt(2 / (5 * 5280)),
    tie_embeddings=True,
)

VARIANTS = {
    "tiny": dict(
        family="huginn",
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
        rope_interleaved=True,
        embed_scale=math.sqrt(32),
        init_std=0.05,
        tie_embeddings=True,
    ),
    "0125": HUGINN_0125,
    "bench_e512": dict(  # 0125's blocks, MLP ratio (17920 / 5280 = 3.39) and vocabulary at E = 512, 8 heads of 64
        HUGINN_0125,
        hidden_size=512,
        num_heads=8,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=1728,
        max_len=512,
        embed_scale=math.sqrt(512),
        init_std=math.sqrt(2 / (5 * 512)),
    ),
    "bench_r32": dict(
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
    ),
}


def get_config(arg="tiny"):
  return _common.select("huginn", VARIANTS, arg or "tiny")
