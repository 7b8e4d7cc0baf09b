"""Spawn demand of LoopSpec on the sweep's tiny-raven GSM8K prompts (configs/sweeps/bundled.py:tiny_raven):
per (d1, d2, lane_capacity), gamma, skipped spawns, the most spawns one stage was asked to hold, live lanes.

  python -P scripts/results/lanes/demand.py 1,5,1024 1,5,none ...      # d1,d2,capacity ('none': the default)
"""

import json
import sys
import time

import loopspec_jax
from loopspec_configs.sweeps import bundled
from loopspec_experiments import common


def main(argv):
  cfg = bundled.get_config("tiny_raven")
  model = common.load_model(cfg)
  prompts = common.prompts_for(cfg, cfg.tasks, model)
  ar = loopspec_jax.generate(model, prompts, max_new_tokens=cfg.max_new_tokens, method="ar").tokens
  for item in argv:
    d1, d2, cap = (common.parse_optional_int(x) for x in item.split(","))
    t0 = time.time()
    res = loopspec_jax.generate(
        model, prompts, max_new_tokens=cfg.max_new_tokens, method="loopspec", d1=d1, d2=d2, lane_capacity=cap
    )
    s = res.stats
    row = {
        "d1": d1,
        "d2": d2,
        "lane_capacity_asked": cap,
        "lane_capacity": s["lane_capacity"],
        "stage_width": s["stage_width"],
        "prompts": len(prompts),
        "tokens": s["tokens_generated"],
        "equals_ar": res.tokens == ar,
        "mean_accepted_length": s["mean_accepted_length"],
        "commits": s["commits"],
        "skipped_spawns": s["skipped_spawns"],
        "max_stage_demand": s["max_stage_demand"],
        "max_live_lanes": s["max_live_lanes"],
        "seconds_with_compile": round(time.time() - t0, 1),
    }
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
