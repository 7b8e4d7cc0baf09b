"""Depth analysis (experiments/measure_depths.py): per-depth agreement / TV / KL with depth R and the fits.

  python -m experiments.measure_depths --config=configs/sweeps/depths.py
  python -m experiments.measure_depths --config=configs/sweeps/depths.py:tiny      # test-sized
  python -m experiments.measure_depths --config=configs/sweeps/depths.py \
      --config.model=loopspec_jax/assets/models/tiny-raven --config.tasks=gsm8k
Writes <out_dir>/depths.jsonl (per prompt, resumable) and depths_<task>_<sampling>.json / .png.
"""
import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.model = "random:bench_raven_r32"  # 'random:<configs.models module>', a bundled model or a checkpoint dir
  c.model_label = ""  # display name (default: the spec)
  c.contraction = 0.05  # 'random:' models only (ignored otherwise): contractive recurrence; <= 0: off
  c.seed = 0
  c.tasks = "random"  # comma-separated; 'random' or a loopspec_jax.prompts task (needs a tokenizer)
  c.num_prompts = 4
  c.prompt_len = 32  # 'random' prompts
  c.max_prompt_tokens = 256  # text prompts keep their last tokens (0: only the context limit)
  c.max_new_tokens = 64
  c.eos_id = -1  # < 0: none
  c.samplings = "greedy"  # comma-separated names from sampling_settings
  c.sampling_settings = {"greedy": {"temperature": 0.0}, "sample": {"temperature": 1.0, "top_p": 0.7}}
  c.include_single = True  # Theorem 2's best feasible pair may be single-proposal (d1, None)
  c.out_dir = "results/depths"
  c.progress = True
  if arg == "tiny":  # the test suite's run (tests/test_depth_sweep.py)
    c.model = "random:tiny_huginn"
    c.contraction = 0.7
    c.num_prompts = 2
    c.prompt_len = 10
    c.max_new_tokens = 16
    c.out_dir = "results/depths_tiny"
  elif arg:
    raise ValueError(f"unknown preset {arg!r}")
  return c
