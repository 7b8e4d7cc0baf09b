"""Figure 4 of the LoopSpec paper on the bundled targets: LoopSpec (its best depth pair) against DFlash (its
best gamma, the bundled drafters `<target>-dflash`) and AR, greedy and sampled (T = 1, top-p 0.7), on held-out
GSM8K and MATH-500 prompts.

  nice -n 10 python -m loopspec_experiments.figure4 --out results/dflash_figure4/2026-12-06

Per (target, sampling mode) every candidate (AR, the LoopSpec depth pairs of `LOOPSPEC`, DFlash at each gamma
of `GAMMAS`) runs once per task to compile, then `--repeats` timed rounds, the method order rotated each
round and the tasks interleaved: ONE interleaved run, wall-clock medians per (method, task), ratios against
AR's median of the same run. "Best" is the candidate of each kind with the highest speed over AR (geometric
mean over the two tasks), picked from the same run. tau and gamma are token counts, load-independent.
Writes figure4.json (everything), table.md (the best rows), candidates.md (every row) and figure4.png.
"""

from __future__ import annotations

import argparse
import os
import sys

import loopspec_jax as lj
from loopspec_jax.analysis import depth_metrics
from loopspec_jax.experiment.figure4 import GAMMAS
from loopspec_jax.experiment.figure4 import LOOPSPEC
from loopspec_jax.experiment.figure4 import MODES
from loopspec_jax.experiment.figure4 import PAPER
from loopspec_jax.experiment.figure4 import TASKS
from loopspec_jax.experiment.figure4 import best_table
from loopspec_jax.experiment.figure4 import candidates_table
from loopspec_jax.experiment.figure4 import pick_best
from loopspec_jax.experiment.figure4 import plot
from loopspec_jax.experiment.figure4 import run_group
from loopspec_experiments import common


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--targets", default="tiny-ouro,tiny-raven")
  ap.add_argument("--num_prompts", type=int, default=8)
  ap.add_argument("--max_new", type=int, default=64)
  ap.add_argument("--max_prompt_tokens", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args(argv)
  rows = []
  for target in args.targets.split(","):
    model = lj.load(target)
    prompts = {
        t: depth_metrics.prepare_prompts(
            t, model, args.num_prompts, max_new_tokens=args.max_new, max_prompt_tokens=args.max_prompt_tokens
        )
        for t in TASKS
    }
    for mode in MODES:
      rows += run_group(model, target, mode, prompts, args.repeats, args.max_new)
  best = pick_best(rows)
  table, ratios = best_table(rows, best)
  payload = {
      "host": common.machine_description(),
      "command": "python -m loopspec_experiments.figure4 " + " ".join(sys.argv[1:] if argv is None else argv),
      "settings": vars(args) | {"modes": MODES, "tasks": TASKS, "gammas": GAMMAS, "loopspec": LOOPSPEC},
      "paper": PAPER,
      "best": {f"{t}/{m}": v for (t, m), v in best.items()},
      "ratios": ratios,
      "rows": rows,
  }
  os.makedirs(args.out, exist_ok=True)
  common.atomic_write_json(os.path.join(args.out, "figure4.json"), payload)
  common.atomic_write_text(os.path.join(args.out, "table.md"), table)
  common.atomic_write_text(os.path.join(args.out, "candidates.md"), candidates_table(rows))
  plot(rows, best, os.path.join(args.out, "figure4.png"))
  print(table)


if __name__ == "__main__":
  main()
