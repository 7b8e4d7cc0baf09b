"""Depth analysis (loopspec-measure-depths): per-depth agreement / TV / KL with depth R and the fits.

  loopspec-measure-depths                                   # this config (the default)
  loopspec-measure-depths --config=sweeps/depths.py:tiny    # test-sized
  loopspec-measure-depths --config.model=tiny-raven --config.tasks=gsm8k
  loopspec-measure-depths --config=sweeps/depths.py:tiny_raven  # issue 13: bundled model, every task, 24 x 64
  loopspec-measure-depths --config=sweeps/depths.py:tiny_ouro
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
  # More prompts for some '<task>_<sampling>' groups (their rates vary more across prompts), e.g. {"mbpp_greedy": 64}
  c.num_prompts_by_group = {}
  c.include_single = True  # Theorem 2's best feasible pair may be single-proposal (d1, None)
  c.out_dir = "results/depths"
  c.progress = True
  if arg == "tiny":  # the test suite's run (tests/experiments/test_depth_sweep.py)
    c.model = "random:huginn:tiny"
    c.contraction = 0.7
    c.num_prompts = 2
    c.prompt_len = 10
    c.max_new_tokens = 16
    c.out_dir = "results/depths_tiny"
  elif arg in ("tiny_raven", "tiny_ouro"):  # the bundled trained models on every prompt set (results/bundled/)
    # 24 prompts x 64 new tokens = 1536 positions per (task, sampling): the standard error of every rate, taken
    # across prompts (positions along one text are correlated), stays under 0.02.
    c.model = arg.replace("_", "-")
    c.contraction = None
    c.tasks = "gsm8k,math500,mbpp,humaneval,shakespeare"
    c.num_prompts = 24
    c.max_new_tokens = 64
    c.samplings = "greedy,sample"
    c.out_dir = f"results/bundled/{c.model}/depths"
    # Greedy agreement varies most across prompts (a prompt the model continues by rote agrees at every depth):
    # with 24 prompts, tiny-raven mbpp_greedy and tiny-ouro math500 / mbpp / humaneval_greedy have a standard
    # error of 0.03-0.045 at depth 1; num_prompts_by_group = {"mbpp_greedy": 64} here adds prompts (resumable).
  elif (
      arg == "bundled_ci"
  ):  # tests/experiments/test_depth_sweep.py: tiny-raven, one GSM8K prompt, 8 tokens (sweeps/bundled.py:ci)
    c.model = "tiny-raven"
    c.contraction = None
    c.tasks = "gsm8k"
    c.num_prompts = 1
    c.max_new_tokens = 8
    c.out_dir = "results/bundled_ci/depths"
  elif arg:
    raise ValueError(f"unknown preset {arg!r}")
  return c
