"""(d1, d2, gamma) sweep (loopspec-sweep) against AR on one model, per task and sampling setting.

  loopspec-sweep                                       # this config (the default)
  loopspec-sweep --config=sweeps/default.py:quick      # a few configurations
  loopspec-sweep --config=sweeps/default.py:tiny       # test-sized (huginn:tiny)
Lists are comma-separated strings (overridable on the command line, e.g. --config.d1s=1,2); `none` is an absent
value (`--config.chain_d1=none`). Rows go to <out_dir>/sweep.jsonl one configuration at a time; a rerun skips
configurations already there. With a depth-analysis JSON (loopspec-measure-depths) the table marks Theorem 2's
predicted best pair.
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.model = "random:huginn:bench_r32"  # 'random:<family>:<variant>', a bundled model or a checkpoint dir
  c.model_label = ""  # display name (default: the spec)
  c.contraction = ml_collections.FieldReference(0.05, field_type=float)  # 'random:' models only; none: off
  c.seed = 0
  c.tasks = "random"  # 'random' or loopspec_jax.prompts tasks (need a tokenizer)
  c.num_prompts = 2
  c.prompt_len = 32  # 'random' prompts
  c.max_prompt_tokens = ml_collections.FieldReference(256, field_type=int)  # text prompts: last tokens kept; none: all
  c.max_new_tokens = 64
  c.eos_id = config_dict.placeholder(int)  # none: no end-of-sequence token
  c.samplings = "greedy,sample"  # names from sampling_settings
  c.sampling_settings = {"greedy": {"temperature": 0.0}, "sample": {"temperature": 1.0, "top_p": 0.7}}
  # LoopSpec grid: theory.feasible_configs(R, include_single), restricted to these d1 / d2 values ('' = all),
  # or an explicit list 'd1,d2;d1,d2' (d2 'none': single proposal) that replaces the grid.
  c.d1s = ""
  c.d2s = ""
  c.include_single = True
  c.configs = ""
  c.lane_capacity = config_dict.placeholder(int)  # none: loopspec's default
  c.chain_d1 = ml_collections.FieldReference(2, field_type=int)  # draft depth of the chain rows; none: no chain
  c.chain_gammas = "1,2,3,4,5,6,7,8"
  # The classic baselines as rows: a separate draft model (a bundled name or checkpoint sharing the target's
  # tokenizer; '' = no draft rows) at each draft length ('auto' allowed), and prompt lookup (n-gram length; none =
  # no lookup rows) at each of lookup_gammas.
  c.draft_model = ""
  c.draft_gammas = "4,auto"
  c.lookup_ngram = config_dict.placeholder(int)
  c.lookup_gammas = "4"
  # Further rows by method spec, ';'-separated (the tree methods: 'tree:d1=2,gamma=6,branch=4,tree_nodes=32;
  # lookahead:window=5,ngram=4,guesses=5'); '' = none. Their rows hold tau, nodes per pass and draft cost share.
  c.extra_methods = ""
  c.repeats = 3  # timed repeats after a warm-up; medians are reported
  c.depths_json = "results/depths/depths_{task}_{sampling}.json"  # none or a missing file: no prediction
  c.out_dir = "results/sweep"
  # Stop (raise SweepInterrupted) after this many new rows, simulating a killed sweep; none: run to the end.
  c.stop_after = config_dict.placeholder(int)
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
  elif arg == "tiny":  # the test suite's sweep (tests/experiments/test_depth_sweep.py): a few compiles on 2 CPU cores
    c.model = "random:huginn:tiny"
    c.contraction = 0.7
    c.num_prompts = 1
    c.prompt_len = 10
    c.max_new_tokens = 16
    c.samplings = "greedy"
    c.configs = "1,4"
    c.lane_capacity = 64  # R/d1 = 8 stages x 8 lanes: no skipped spawns for (1, 4), so Theorem 1 applies as stated
    c.chain_d1 = 2
    c.chain_gammas = "2"
    c.repeats = 1
    c.out_dir = "results/sweep_tiny"
    c.depths_json = "results/depths_tiny/depths_{task}_{sampling}.json"
  elif arg:
    raise ValueError(f"unknown preset {arg!r}")
  return c
