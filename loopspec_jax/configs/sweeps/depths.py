"""Depth analysis (loopspec-measure-depths): per-depth agreement / TV / KL with depth R and the fits.

  loopspec-measure-depths                                   # this config (the default)
  loopspec-measure-depths --config=sweeps/depths.py:tiny    # test-sized
  loopspec-measure-depths --config.model=tiny-raven --config.tasks=gsm8k
Writes <out_dir>/depths.jsonl (per prompt, resumable) and depths_<task>_<sampling>.json / .png.
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.model = "random:huginn:bench_r32"  # 'random:<family>:<variant>', a bundled model or a checkpoint dir
  c.model_label = ""  # display name (default: the spec)
  # 'random:' models only (ignored otherwise): contractive recurrence; none: off.
  c.contraction = ml_collections.FieldReference(0.05, field_type=float)
  c.seed = 0
  c.tasks = "random"  # comma-separated; 'random' or a loopspec_jax.prompts task (needs a tokenizer)
  c.num_prompts = 4
  c.prompt_len = 32  # 'random' prompts
  c.max_prompt_tokens = ml_collections.FieldReference(256, field_type=int)  # text prompts: last tokens kept; none: all
  c.max_new_tokens = 64
  c.eos_id = config_dict.placeholder(int)  # none: no end-of-sequence token
  c.samplings = "greedy"  # comma-separated names from sampling_settings
  c.sampling_settings = {"greedy": {"temperature": 0.0}, "sample": {"temperature": 1.0, "top_p": 0.7}}
  c.include_single = True  # Theorem 2's best feasible pair may be single-proposal (d1, None)
  c.out_dir = "results/depths"
  c.progress = True
  if arg == "tiny":  # the test suite's run (tests/test_depth_sweep.py)
    c.model = "random:huginn:tiny"
    c.contraction = 0.7
    c.num_prompts = 2
    c.prompt_len = 10
    c.max_new_tokens = 16
    c.out_dir = "results/depths_tiny"
  elif arg:
    raise ValueError(f"unknown preset {arg!r}")
  return c
