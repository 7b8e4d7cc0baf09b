"""Markdown tables of this folder's jsonl rows: `python scripts/results/lanes/epyc2-2026-12-04-dynamic/summarize.py`."""

import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def fmt(x):
  return "-" if x is None else f"{x:.1f}"


def rows(name):
  return [json.loads(l) for l in open(os.path.join(HERE, name)) if l.strip()]


def main():
  print("| config | W | equals AR | gamma | skipped | max demand / stage | max live |")
  print("|---|---|---|---|---|---|---|")
  for r in rows("demand.jsonl"):
    print(
        f"| ({r['config'].split(',')[0]}, {r['config'].split(',')[1]}) cap {r['lane_capacity']} | {r['stage_width']} | "
        f"{r['equals_ar']} | {r['mean_accepted_length']:.2f} | {r['skipped_spawns']} | {r['max_stage_demand']} | "
        f"{r['max_live_lanes']} |"
    )
  print()
  print("| config | side | W | gamma | skipped | ticks | mean live | mean computed | ms / tick (runs) | median ms / tick |"
        " median decode s | median ms / token | loads |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for path in sorted(glob.glob(os.path.join(HERE, "time_*_*.jsonl"))):
    rs = rows(os.path.basename(path))
    side = path.rsplit("_", 1)[1].split(".")[0]
    r0 = rs[0]
    toks = 4 * 64
    ms = [r["ms_per_tick"] for r in rs]
    dec = [r["decode_seconds"] for r in rs]
    print(
        f"| {r0['config']} | {side} | {r0['stage_width']} | {r0['mean_accepted_length']:.2f} | {r0['skipped_spawns']} | "
        f"{r0['ticks']} | {fmt(r0.get('mean_live_lanes'))} | {fmt(r0.get('mean_computed_lanes'))} | "
        f"{', '.join(f'{x:.0f}' for x in ms)} | {statistics.median(ms):.1f} | {statistics.median(dec):.2f} | "
        f"{1e3 * statistics.median(dec) / toks:.1f} | {', '.join(str(round(r['load'], 1)) for r in rs)} |"
    )


if __name__ == "__main__":
  main()
