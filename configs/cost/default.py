"""Cost report of the decoders at real sizes: one AR token, one chain round and one LoopSpec tick.

  loopspec-cost-report
  loopspec-cost-report --config.models=tiny_raven,tiny_ouro
  loopspec-cost-report --config=cost/default.py:quick

`models` names entries of `model_settings`: `spec` is a `configs.models.model_config` spec or
"bundled:<name>" (only the bundled model's config is read), `methods` are "name[:k=v,...]" with the
first one "ar" (the reference of the ratios), `gamma` the mean accepted length (tokens per R steps) the
projection assumes, `contexts` (optional) replaces the report's contexts for that model.
"""

import ml_collections


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
  if arg == "quick":
    c.models = "tiny_raven"
    c.out = "results/cost/cost_report_quick.json"
  return c
