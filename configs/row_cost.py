"""Settings of the row-cost bound (`loopspec-row-cost`, experiments/row_cost.py).

  loopspec-row-cost                                    # the bundled models
  loopspec-row-cost --config=row_cost.py:memory_bound  # huginn:bench_e512, weights larger than the caches
Lists are comma-separated strings.
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.models = "tiny-raven,tiny-ouro"  # bundled names, checkpoint dirs or 'random:<family>:<variant>'
  c.contraction = 0.05  # 'random:' models only: the adapter's state half scaled by this (as the benches do)
  c.seed = 0
  c.rows = "1,2,4,8,16,32"  # M: rows of one core step (each row attends to its own cache block)
  c.context = 128  # T: cache positions every row attends to (the AR token is timed at the same cache length)
  c.new_tokens = 96  # AR tokens timed per call; the ideal pipeline's tokens per tick is N / (N + R/d1 - 1)
  c.steps_per_call = 64  # core steps per timed call (one jitted fori_loop)
  c.repeats = 5  # interleaved rounds (each times every row count and AR once); medians are reported
  c.decode_contexts = "64,128,256"  # T of the whole-tick table ("": none); each <= the model's context
  c.decode_new_tokens = 32  # tokens per decode in that table (the prompt is T - this)
  c.out_dir = "results/row_cost"
  if arg == "memory_bound":  # the model of bench/default.py:memory_bound
    c.models = "random:huginn:bench_e512"
    c.rows = "1,4,16,32"
    c.new_tokens = 32
    c.steps_per_call = 8
    c.repeats = 3
    c.decode_contexts = "128,256"
    c.decode_new_tokens = 16
    c.out_dir = "results/row_cost_memory_bound"
  elif arg:
    raise ValueError(f"unknown preset {arg!r}; known: memory_bound")
  return c
