"""The AR loop reads its weights and cache in place: no per-step copy of a (step, layer) cache slot (the R core
steps are unrolled over one buffer per slot) and no [E, V] copy of a tied head (the embedding is contracted
as stored). Both copies cost bytes on a memory-bound model (results/roofline/)."""

from loopspec_jax.analysis import calibrate

import helpers

CONTEXT = 48


def test_ar_loop_copies_neither_cache_slots_nor_the_tied_head():
  model = helpers.tiny_model("huginn:tiny")
  cfg = model.config
  assert cfg.tie_embeddings
  lines = calibrate.time_decode_loop(model, "ar", context=CONTEXT, new_tokens=4, greedy=True).hlo.split("\n")
  slot = f"{cfg.num_kv_heads},{CONTEXT},{cfg.head_dim}]"  # a [.., KV, T, D] slot of the cache
  assert not [l for l in lines if "dynamic-slice(" in l and slot in l]
  assert not [l for l in lines if "copy(" in l and f"f32[{cfg.hidden_size},{cfg.vocab_size}]" in l]
