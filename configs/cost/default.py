"""Cost report of the decoders at real sizes: one AR token, one chain round and one LoopSpec tick.

  loopspec-cost-report
  loopspec-cost-report --config.models=tiny_raven,tiny_ouro
  loopspec-cost-report --config=cost/default.py:quick
  loopspec-cost-report --config=cost/default.py:trees   # tree self-speculation and lookahead at Huginn-0125
  loopspec-cost-report --config=cost/default.py:heads   # a head's draft beside a d1 readout's (cost_heads.py)

`models` names entries of `model_settings`: `spec` is a `configs.models.model_config` spec or
"bundled:<name>" (only the bundled model's config is read), `methods` are "name[:k=v,...]" with the
first one "ar" (the reference of the ratios), `gamma` the mean accepted length (tokens per R steps) the
projection assumes, `contexts` (optional) replaces the report's contexts for that model; `tau_results`
(optional) a JSON list of measured rows whose `tau` (tokens per verify pass) of `tau_task` / `tau_sampling`
projects the tree methods of the same spec (without one, tree self-speculation takes chain's bound).
"""

import ml_collections

# Tokens per verify pass of the tree methods, measured on the bundled tiny-raven (R = 32, Huginn's family).
TREE_TAUS = "results/trees/epyc2-2026-12-03/results.json"


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.models = "huginn_0125,ouro_1p4b"  # comma-separated names of model_settings
  c.model_settings = {
      "huginn_0125": {
          "spec": "huginn:0125",
          "gamma": 14.5,
          "methods": ("ar", "chain:d1=2,gamma=8", "loopspec:d1=2,d2=8"),
          "contexts": (),
      },
      "huginn_0125_trees": {  # the tree methods beside chain and LoopSpec, at their tau measured on tiny-raven
          "spec": "huginn:0125",
          "gamma": 14.5,
          "methods": (
              "ar",
              "chain:d1=2,gamma=6",
              "loopspec:d1=2,d2=8",
              "tree:d1=2,gamma=6,branch=4,tree_nodes=32",
              "lookahead:window=5,ngram=4,guesses=5",
          ),
          "contexts": (),
          "tau_results": TREE_TAUS,
          "tau_task": "gsm8k",
          "tau_sampling": "greedy",
      },
      "huginn_0125_heads": {  # the draft programs alone: d1 readouts and the heads (experiments/cost_heads.py)
          "spec": "huginn:0125",
          "d1s": (1, 2),  # readout depths (chain's and tree self-speculation's drafter)
          "num_heads": 4,  # Medusa heads (tiny-raven-medusa's count)
          "contexts": (),
      },
      "ouro_1p4b": {
          "spec": "ouro:1p4b",
          "gamma": 3.5,
          "methods": ("ar", "chain:d1=1,gamma=3", "loopspec:d1=1,d2=2"),
          "contexts": (),
      },
      "tiny_raven": {
          "spec": "bundled:tiny-raven",
          "gamma": 14.5,
          "methods": ("ar", "chain:d1=2,gamma=8", "loopspec:d1=2,d2=8"),
          "contexts": (256,),
      },
      "tiny_ouro": {
          "spec": "bundled:tiny-ouro",
          "gamma": 3.5,
          "methods": ("ar", "chain:d1=1,gamma=3", "loopspec:d1=1,d2=2"),
          "contexts": (256,),
      },
  }
  c.contexts = (2048, 8192)
  c.dtype = "bfloat16"
  c.batch = 1
  c.greedy = True
  c.accelerators = "h100,h200,tpu_v4,tpu_v5e,tpu_v5p"  # names in configs/accelerators.py
  c.ratio_accelerator = "h200"  # the accelerator whose LoopSpec/AR ratio the table prints
  c.op_overhead_s = 0.0  # per-op launch overhead added to the roofline time
  c.branch = "max"  # conditionals: count the most expensive branch ("max") or the average ("mean")
  c.out = "results/cost/cost_report.json"
  if arg == "trees":  # a tree verify pass at Huginn-0125 size beside chain's round and LoopSpec's tick
    c.models = "huginn_0125_trees"
    c.contexts = (2048,)
    c.out = "results/cost/cost_report_trees.json"
  elif arg == "heads":  # the draft cost of a head beside a d1 readout's at Huginn-0125 size, bytes and flops
    c.models = "huginn_0125_heads"
    c.contexts = (2048,)
    c.draft_costs = True
    c.out = "results/cost/cost_report_heads.json"
  elif arg == "quick":
    c.models = "tiny_raven"
    c.out = "results/cost/cost_report_quick.json"
  return c
