"""Medians of the interleaved tick timings (before.jsonl / after.jsonl of tick_compare.sh) and the demand rows
into results/lanes/lanes.json: `python -P scripts/results/lanes/summarize.py TICK_DIR DEMAND_ROWS.jsonl...`."""

import json
import statistics
import sys


def main(tick_dir, demand_files):
  out = {"tick_time": {}, "demand": []}
  for side in ("before", "after"):
    rows = [json.loads(l) for l in open(f"{tick_dir}/{side}.jsonl")]
    for cfg in dict.fromkeys(r["config"] for r in rows):
      rs = [r for r in rows if r["config"] == cfg]
      out["tick_time"].setdefault(cfg, {})[side] = {
          "stage_width": rs[0]["stage_width"],
          "runs": len(rs),
          "median_ms_per_tick": statistics.median(r["ms_per_tick"] for r in rs),
          "median_decode_seconds": statistics.median(r["decode_seconds"] for r in rs),
          "ms_per_tick": [round(r["ms_per_tick"], 1) for r in rs],
          "ticks": rs[0]["ticks"],
          "mean_accepted_length": rs[0]["mean_accepted_length"],
          "skipped_spawns": rs[0]["skipped_spawns"],
      }
  for f in demand_files:
    out["demand"] += [json.loads(l) for l in open(f) if l.startswith("{")]
  print(json.dumps(out["tick_time"], indent=1))
  with open("results/lanes/lanes.json", "w") as f:
    json.dump(out, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
