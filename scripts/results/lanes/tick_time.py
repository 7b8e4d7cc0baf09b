"""Decode seconds per tick of greedy LoopSpec on tiny-raven's sweep prompts (4 GSM8K prompts, 64 new tokens,
one batch): `python -P scripts/results/lanes/tick_time.py OUT.json d1,d2[,capacity] ...`. Imports only the library
(not experiments/), so PYTHONPATH can point it at another checkout's `loopspec_jax` (the 'before' side).
Per configuration: one untimed call (compile), then `REPEATS` timed calls; medians are taken by the caller
across interleaved processes (`tick_compare.sh`)."""

import json
import os
import sys

import loopspec_jax
from loopspec_jax.analysis import depth_metrics

REPEATS = 3


def main(out, items):
  model = loopspec_jax.load(os.path.join(os.path.dirname(loopspec_jax.__file__), "assets", "models", "tiny-raven"))
  prompts = depth_metrics.prepare_prompts("gsm8k", model, 4, max_new_tokens=64, max_prompt_tokens=256)
  rows = []
  for item in items:
    parts = item.split(",")
    d1 = int(parts[0])
    d2 = None if parts[1] == "none" else int(parts[1])
    kw = {"lane_capacity": int(parts[2])} if len(parts) > 2 else {}
    run = lambda: loopspec_jax.generate(model, prompts, max_new_tokens=64, method="loopspec", d1=d1, d2=d2, **kw)
    run()
    for _ in range(REPEATS):
      s = run().stats
      rows.append(
          {
              "config": item,
              "package": os.path.dirname(loopspec_jax.__file__),
              "stage_width": s["stage_width"],
              "decode_seconds": s["decode_seconds"],
              "ticks": s["ticks"],
              "ms_per_tick": 1e3 * s["decode_seconds"] / s["ticks"],
              "mean_accepted_length": s["mean_accepted_length"],
              "skipped_spawns": s["skipped_spawns"],
          }
      )
      print(json.dumps(rows[-1]), flush=True)
  with open(out, "a") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
