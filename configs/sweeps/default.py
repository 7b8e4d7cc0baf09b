"""(d1, d2, gamma) sweep (experiments/sweep.py) against AR on one model, per task and sampling setting.

  python -m experiments.sweep --config=configs/sweeps/default.py
  python -m experiments.sweep --config=configs/sweeps/default.py:quick     # a few configurations
  python -m experiments.sweep --config=configs/sweeps/default.py:tiny      # test-sized (tiny_huginn)
Lists are comma-separated strings (overridable on the command line, e.g. --config.d1s=1,2). Rows go to
<out_dir>/sweep.jsonl one configuration at a time; a rerun skips configurations already there. With a
depth-analysis JSON (experiments/measure_depths.py) the table marks Theorem 2's predicted best pair.
"""
import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.model = "random:bench_raven_r32"  # 'random:<configs.models module>', a bundled model or a checkpoint dir
  c.model_label = ""  # display name (default: the spec)
  c.contraction = 0.05  # 'random:' models only (ignored otherwise); <= 0: off
  c.seed = 0
  c.tasks = "random"  # 'random' or loopspec_jax.prompts tasks (need a tokenizer)
  c.num_prompts = 2
  c.prompt_len = 32  # 'random' prompts
  c.max_prompt_tokens = 256  # text prompts keep their last tokens (0: only the context limit)
  c.max_new_tokens = 64
  c.eos_id = -1  # < 0: none
  c.samplings = "greedy,sample"  # names from sampling_settings
  c.sampling_settings = {"greedy": {"temperature": 0.0}, "sample": {"temperature": 1.0, "top_p": 0.7}}
  # LoopSpec grid: theory.feasible_configs(R, include_single), restricted to these d1 / d2 values ('' = all),
  # or an explicit list 'd1,d2;d1,d2' ('none' for single proposal) that replaces the grid.
  c.d1s = ""
  c.d2s = ""
  c.include_single = True
  c.configs = ""
  c.lane_capacity = 0  # 0: loopspec's default
  c.chain_d1 = 2  # draft depth of the chain baseline (0: no chain rows)
  c.chain_gammas = "1,2,3,4,5,6,7,8"
  c.repeats = 3  # timed repeats after a warm-up; medians are reported
  c.depths_json = "results/depths/depths_{task}_{sampling}.json"  # '' or a missing file: no prediction
  c.out_dir = "results/sweep"
  c.stop_after = 0  # > 0: stop (raise SweepInterrupted) after this many new rows; simulates a killed sweep
  c.progress = True
  if arg == "quick":
    c.samplings = "greedy"
    c.d1s = "1,2,4"
    c.d2s = "4,8,16"
    c.chain_gammas = "2,4,8"
    c.num_prompts = 1
    c.max_new_tokens = 32
    c.repeats = 1
    c.out_dir = "results/sweep_quick"
    c.depths_json = "results/depths/depths_{task}_{sampling}.json"
  elif arg == "tiny":  # the test suite's sweep (tests/test_depth_sweep.py): a few compiles on 2 CPU cores
    c.model = "random:tiny_huginn"
    c.contraction = 0.7
    c.num_prompts = 1
    c.prompt_len = 10
    c.max_new_tokens = 16
    c.samplings = "greedy"
    c.configs = "1,4"
    c.lane_capacity = 24  # no skipped spawns for (1, 4), so Theorem 1's greedy bound applies as stated
    c.chain_d1 = 2
    c.chain_gammas = "2"
    c.repeats = 1
    c.out_dir = "results/sweep_tiny"
    c.depths_json = "results/depths_tiny/depths_{task}_{sampling}.json"
  elif arg:
    raise ValueError(f"unknown preset {arg!r}")
  return c
