"""Benchmark of the bundled trained models on the real prompt sets (issue: trained looped models).

  loopspec-bench --config=bench/bundled.py          # (paths relative to configs/ work anywhere)
  loopspec-bench --config=bench/bundled.py:quick    # a CI-sized run
  loopspec-bench --config=bench/bundled.py:two      # two prompt sets, both samplings
  loopspec-bench --config=bench/bundled.py:targets  # the docs/benchmarks.md table: 4 demo + 4 GSM8K prompts
  loopspec-bench --config=bench/bundled.py:baselines  # + draft model, lookup, gamma=auto, trees (both models)
  loopspec-bench --config=bench/bundled.py:baselines_quick  # the same, 2 + 2 prompts, 64 tokens, no auto rows
  loopspec-bench --config=bench/bundled.py:auto     # method="auto" beside the fixed methods (planner.py)

Methods side by side in one run: autoregressive, chain (best gamma), LoopSpec single proposal, LoopSpec two
proposals; greedy and sampling (T=1.0, top_p=0.7); medians of `repeats` interleaved repeats.
"""

import ml_collections
from ml_collections import config_dict


def _base():
  """The default run: every prompt set, both samplings, the four methods per model."""
  c = ml_collections.ConfigDict()
  c.models = ["tiny-raven", "tiny-ouro"]
  c.model_label = ""
  c.contraction = config_dict.placeholder(float)  # 'random:' models only; none: the weights as drawn
  c.seed = 0
  c.tasks = ["gsm8k", "math500", "mbpp", "humaneval", "shakespeare"]
  c.num_prompts = 2
  c.prompt_len = 32
  c.max_new_tokens = 64
  c.repeats = 3
  c.samplings = ["greedy", "sample"]
  c.sampling_settings = {"greedy": {"temperature": 0.0}, "sample": {"temperature": 1.0, "top_p": 0.7}}
  c.methods = ["ar"]  # method specs 'name:arg=value,...' ('none' for an absent depth); the first must be 'ar'
  c.methods_by_model = {
      "tiny-raven": ["ar", "chain:d1=2,gamma=8", "loopspec:d1=2", "loopspec:d1=2,d2=8"],
      "tiny-ouro": ["ar", "chain:d1=1,gamma=4", "loopspec:d1=1", "loopspec:d1=1,d2=2"],
  }
  c.out_dir = "results/bench_bundled"
  c.table = "default"  # or "baselines": tokens per verify pass, acceptance, draft cost share
  return c


def _two(c):
  """The docs/benchmarks.md table: two prompt sets, both samplings."""
  c.tasks = ["gsm8k", "shakespeare"]
  c.out_dir = "results/bench_bundled_two"


def _quick(c):
  """A CI-sized run: two prompt sets, greedy, one prompt of 16 tokens."""
  c.tasks = ["gsm8k", "shakespeare"]
  c.samplings = ["greedy"]
  c.num_prompts = 1
  c.max_new_tokens = 16
  c.repeats = 1
  c.out_dir = "results/bench_bundled_quick"


def _targets(c):
  """The engine issue's targets: 4 demo + 4 GSM8K prompts, one request at a time."""
  c.tasks = ["demo", "gsm8k"]
  c.num_prompts = 4
  c.max_new_tokens = 96
  c.methods_by_model = {  # gate_mass: the sampled gate's least residual mass (greedy rows are unchanged by it)
      "tiny-raven": ["ar", "chain:d1=2,gamma=8", "loopspec:d1=2,d2=8", "loopspec:d1=2,d2=8,gate_mass=0.1"],
      "tiny-ouro": ["ar", "chain:d1=1,gamma=4", "loopspec:d1=1,d2=2", "loopspec:d1=1,d2=2,gate_mass=0.1"],
  }
  c.out_dir = "results/bench_targets"


def _baselines(c):
  """The classic speculative decoders beside LoopSpec, on the same prompts, in one run."""
  c.models = ["tiny-raven", "tiny-ouro"]  # tiny-raven-draft shares both models' tokenizer
  c.tasks = ["demo", "gsm8k"]
  c.num_prompts = 4
  c.max_new_tokens = 96
  c.table = "baselines"
  c.repeats = 2  # lookup with gamma=auto is lookup at gamma 8 (free drafts), so it is left out
  c.methods_by_model = {
      "tiny-raven": [
          "ar",
          "chain:d1=2,gamma=8",
          "chain:d1=2,gamma=auto",
          "draft:draft_model=tiny-raven-draft,gamma=4",
          "draft:draft_model=tiny-raven-draft,gamma=auto",
          "lookup:ngram=3,gamma=4",
          "chain:d1=2,gamma=6,branch=4,tree_nodes=32",  # tree self-speculation (method='tree')
          "lookahead:window=5,ngram=4,guesses=5",
          "loopspec:d1=2,d2=8",
          "loopspec:d1=2",
      ],
      "tiny-ouro": [
          "ar",
          "chain:d1=1,gamma=4",
          "draft:draft_model=tiny-raven-draft,gamma=4",
          "draft:draft_model=tiny-raven-draft,gamma=auto",
          "lookup:ngram=3,gamma=4",
          "tree:d1=1,gamma=3,branch=4,tree_nodes=16",
          "lookahead:window=5,ngram=4,guesses=5",
          "loopspec:d1=1,d2=2",
      ],
  }
  c.out_dir = "results/bench_baselines"


def _baselines_quick(c):
  """The five baselines (a busy 2-core machine: ~30 minutes) plus the two tree methods, at a small size."""
  c.models = ["tiny-raven"]
  del c["tasks"], c["samplings"]  # as strings, so --config.tasks=gsm8k / --config.samplings=sample override them
  c.tasks = "demo,gsm8k"
  c.samplings = "greedy,sample"
  c.num_prompts = 2
  c.max_new_tokens = 64
  c.repeats = 2
  c.table = "baselines"
  c.methods_by_model = {
      "tiny-raven": [
          "ar",
          "chain:d1=2,gamma=8",
          "draft:draft_model=tiny-raven-draft,gamma=4",
          "lookup:ngram=3,gamma=4",
          "tree:d1=2,gamma=6,branch=4,tree_nodes=32",
          "lookahead:window=5,ngram=4,guesses=5",
          "loopspec:d1=2,d2=8",
      ],
  }
  c.out_dir = "results/bench_baselines_quick"


def _auto(c):
  """method="auto" (loopspec_jax/planner.py) beside the fixed methods it chooses from."""
  del c["models"], c["tasks"], c["samplings"]  # strings: --config.models=tiny-raven overrides them
  c.models = "tiny-raven,tiny-ouro"
  c.tasks = "demo"
  c.samplings = "greedy,sample"
  c.num_prompts = 2
  c.max_new_tokens = 48
  c.repeats = 2
  c.methods_by_model = {
      "tiny-raven": ["ar", "chain:d1=2,gamma=8", "loopspec:d1=2", "loopspec:d1=2,d2=8", "auto"],
      "tiny-ouro": ["ar", "chain:d1=1,gamma=4", "loopspec:d1=1", "loopspec:d1=1,d2=2", "auto"],
  }
  c.out_dir = "results/bench_auto"


_PRESETS = {
    "two": _two,
    "quick": _quick,
    "targets": _targets,
    "baselines": _baselines,
    "baselines_quick": _baselines_quick,
}


def get_config(arg=None):
  c = _base()
  if arg in (None, ""):
    return c
  if arg not in _PRESETS:
    raise ValueError(f"unknown preset {arg!r}; known: {', '.join(_PRESETS)}")
  _PRESETS[arg](c)
  return c
