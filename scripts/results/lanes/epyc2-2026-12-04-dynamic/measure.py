"""Greedy LoopSpec on tiny-raven's sweep prompts (4 GSM8K prompts, 64 new tokens, one batch of 4):
`python -P measure.py OUT.jsonl REPEATS d1,d2[,capacity] ...`. Per configuration one untimed call (compile),
then REPEATS timed calls; prints gamma, skipped spawns, the most spawns asked of one stage, live lanes,
equality with AR, decode seconds and ms per tick. Library only, so PYTHONPATH may point at another checkout's
`loopspec_jax` (the 'before' side of `compare.sh`)."""

import json
import os
import sys

import loopspec_jax
from loopspec_jax.analysis import depth_metrics


def main(out, repeats, items):
  model = loopspec_jax.load(os.path.join(os.path.dirname(loopspec_jax.__file__), "assets", "models", "tiny-raven"))
  prompts = depth_metrics.prepare_prompts("gsm8k", model, 4, max_new_tokens=64, max_prompt_tokens=256)
  ar = loopspec_jax.generate(model, prompts, max_new_tokens=64, method="ar").tokens
  for item in items:
    parts = item.split(",")
    d1 = int(parts[0])
    d2 = None if parts[1] == "none" else int(parts[1])
    kw = {"lane_capacity": int(parts[2])} if len(parts) > 2 else {}
    run = lambda: loopspec_jax.generate(model, prompts, max_new_tokens=64, method="loopspec", d1=d1, d2=d2, **kw)
    res = run()
    for i in range(max(repeats, 1)):
      if repeats:
        res = run()
      s = res.stats
      row = {
          "config": item,
          "package": os.path.dirname(loopspec_jax.__file__),
          "timed": bool(repeats),
          "stage_width": s["stage_width"],
          "lane_capacity": s["lane_capacity"],
          "equals_ar": res.tokens == ar,
          "mean_accepted_length": s["mean_accepted_length"],
          "commits": s.get("commits"),
          "skipped_spawns": s["skipped_spawns"],
          "max_stage_demand": s.get("max_stage_demand"),
          "max_live_lanes": s.get("max_live_lanes"),
          "mean_live_lanes": s.get("mean_live_lanes"),
          "mean_computed_lanes": s.get("mean_computed_lanes"),
          "ticks": s["ticks"],
          "decode_seconds": s["decode_seconds"],
          "ms_per_tick": 1e3 * s["decode_seconds"] / s["ticks"],
          "load": os.getloadavg()[0],
      }
      print(json.dumps(row), flush=True)
      with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
