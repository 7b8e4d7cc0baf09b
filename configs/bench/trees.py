"""The token-tree benchmark table (issue 26): every speculative method side by side on the bundled tiny-raven.

python -m loopspec_experiments.bench_trees                                # this config
python -m loopspec_experiments.bench_trees --config=bench/trees.py:quick  # CI-sized
python -m loopspec_experiments.bench_trees --config=bench/trees.py:heads  # issue 27's heads table
python -m loopspec_experiments.bench_trees --config=bench/trees.py:sampled  # sampled-draft trees
python -m loopspec_experiments.bench_trees --config.only='ar;tree:2,6,4,32;medusa:...'

`methods` are spec strings (`loopspec_jax.methods.parse`): a row for a new method (medusa, eagle, draft
trees) is one more string here. The first must be 'ar' (the reference of tokens and wall-clock ratios).
'spec@model' runs a row on another target model (MTP drafts from its own model, tiny-raven-mtp); such a model
needs its own 'ar@model' row, the reference of that model's rows.
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

# issue 27: the feature-level heads beside every other drafter, greedy (`:heads`); MTP is another target
HEADS_METHODS = [
    "ar",
    "chain:d1=2,gamma=6",
    "tree:d1=2,gamma=6,branch=4,tree_nodes=32",
    "loopspec:d1=2,d2=8",
    "draft:draft_model=tiny-raven-draft,gamma=4",
    "lookup:ngram=3,gamma=4",
    "lookahead:window=5,ngram=4,guesses=5",
    "medusa:heads=tiny-raven-medusa,tree_nodes=32,branch=4",
    "eagle:heads=tiny-raven-eagle-final,gamma=6,branch=4,tree_nodes=32",
    "eagle:heads=tiny-raven-eagle,gamma=6,branch=4,tree_nodes=32",
    "ar@tiny-raven-mtp",
    "mtp:heads=tiny-raven-mtp@tiny-raven-mtp",
    "mtp:heads=tiny-raven-mtp,gamma=1,branch=4@tiny-raven-mtp",
]
HEADS_QUICK = [
    "ar",
    "chain:d1=2,gamma=3",
    "medusa:heads=tiny-raven-medusa,tree_nodes=4,branch=2",
    "eagle:heads=tiny-raven-eagle-final,gamma=2,branch=2,tree_nodes=4",
    "eagle:heads=tiny-raven-eagle,gamma=2,branch=2,tree_nodes=4",
    "ar@tiny-raven-mtp",
    "mtp:heads=tiny-raven-mtp@tiny-raven-mtp",
]
# sampled-draft trees (issue 26): draft-model chain vs tree, self-speculation chains vs sampled / distinct trees
SAMPLED_METHODS = [
    "ar",
    "draft:draft_model=tiny-raven-draft,gamma=6",
    "draft:draft_model=tiny-raven-draft,gamma=6,branch=4,tree_nodes=32",
    "draft:draft_model=tiny-raven-draft,gamma=6,branch=4,tree_nodes=32,drafts=distinct",
] + [
    spec
    for d1 in (1, 2)
    for spec in (
        f"chain:d1={d1},gamma=6",
        f"tree:d1={d1},gamma=6,branch=4,tree_nodes=32,drafts=sample",
        f"tree:d1={d1},gamma=6,branch=4,tree_nodes=32,drafts=distinct",
    )
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
  c.only = ""  # ';'-separated specs run instead of `methods` (a list cannot be overridden by a flag)
  c.target = {"gamma": 6, "share": 0.4}  # the line: tau_tree >= tau_chain + share (gamma + 1 - tau_chain)
  c.out_dir = "results/trees/bench"
  c.heads_target = {}  # `:heads`: eagle_tau, the EAGLE line (>= it and above Medusa's tau)
  if arg in ("heads", "heads_quick"):
    c.samplings = ["greedy"]
    c.methods = list(HEADS_METHODS)
    c.heads_target = {"eagle_tau": 3.0}
    c.out_dir = "results/heads_table/bench"
  if arg == "heads_quick":  # the default suite's check (tests/experiments/test_bench_trees.py): every head method, = AR
    c.tasks = ["shakespeare"]
    c.num_prompts = 1
    c.max_new_tokens = 8
    c.repeats = 1
    c.methods = list(HEADS_QUICK)
    c.out_dir = "results/heads_table/bench_quick"
  elif arg == "sampled":
    c.methods = list(SAMPLED_METHODS)
    c.out_dir = "results/trees_sampled/bench"
  elif arg == "quick":
    c.tasks = ["shakespeare"]
    c.num_prompts = 2
    c.max_new_tokens = 12
    c.repeats = 1
    c.samplings = ["greedy"]
    c.methods = ["ar", "chain:d1=2,gamma=3", "tree:d1=2,gamma=3,branch=2,tree_nodes=6", "lookup:3,3,candidates=2"]
    c.out_dir = "results/trees/bench_quick"
  elif arg and arg != "heads":
    raise ValueError(f"unknown preset {arg!r}; known: quick, heads, heads_quick, sampled")
  return c
