"""The token-tree benchmark table (issue 26): every speculative method side by side on the bundled tiny-raven.

python -P -m loopspec_jax.experiments.bench_trees                                # this config
python -P -m loopspec_jax.experiments.bench_trees --config=bench/trees.py:quick  # CI-sized
python -P -m loopspec_jax.experiments.bench_trees --config.methods='ar;tree:2,6,4,32;medusa:...'

`methods` are spec strings (`loopspec_jax.methods.parse`): a row for a new method (medusa, eagle, draft
trees) is one more string here. The first must be 'ar' (the reference of tokens and wall-clock ratios).
"""

import ml_collections

METHODS = [
    "ar",
    "chain:d1=1,gamma=6",
    "chain:d1=2,gamma=6",
    "tree:d1=1,gamma=6,branch=4,tree_nodes=32",
    "tree:d1=2,gamma=6,branch=4,tree_nodes=32",
    "lookahead:window=5,ngram=4,guesses=5",
    "lookup:ngram=3,gamma=4",
    "lookup:ngram=3,gamma=4,candidates=4",
    "loopspec:d1=2,d2=8",
    "draft:draft_model=tiny-raven-draft,gamma=4",
]


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.model = "tiny-raven"
  c.tasks = ["gsm8k", "shakespeare"]
  c.num_prompts = 8  # one batch of num_prompts requests per task (request ids 0..n-1)
  c.max_new_tokens = 96
  c.repeats = 2  # timed repeats after the untimed compile run; method order rotates every repeat
  c.seed = 0
  c.samplings = ["greedy", "T1"]
  c.sampling_settings = {"greedy": {"temperature": 0.0}, "T1": {"temperature": 1.0}}
  c.methods = list(METHODS)
  c.target = {"gamma": 6, "share": 0.4}  # the line: tau_tree >= tau_chain + share (gamma + 1 - tau_chain)
  c.out_dir = "results/trees/bench"
  if arg == "quick":
    c.tasks = ["shakespeare"]
    c.num_prompts = 2
    c.max_new_tokens = 12
    c.repeats = 1
    c.samplings = ["greedy"]
    c.methods = ["ar", "chain:d1=2,gamma=3", "tree:d1=2,gamma=3,branch=2,tree_nodes=6", "lookup:3,3,candidates=2"]
    c.out_dir = "results/trees/bench_quick"
  elif arg:
    raise ValueError(f"unknown preset {arg!r}; known: quick")
  return c
