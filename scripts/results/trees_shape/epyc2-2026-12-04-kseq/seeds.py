"""tau per (task, method) over the sampling seeds 0 (bench_trees.json here) and 1..7 (seed<s>/bench_trees.json):
each seed is one T = 1 text per prompt, so a single run's tau moves by about +-0.2; the mean over the seeds is
the figure to set against the target tau_chain + 0.4 (7 - tau_chain), chain's tau averaged the same way.

  .venv/bin/python -P scripts/results/trees_shape/epyc2-2026-12-04-kseq/seeds.py   # writes seeds.md beside it
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = {0: "bench_trees.json", **{s: f"seed{s}/bench_trees.json" for s in range(1, 8)}}


def main():
  taus = {}
  for seed, rel in RUNS.items():
    with open(os.path.join(HERE, rel)) as f:
      for row in json.load(f)["rows"]:
        taus.setdefault((row["task"], row["method"]), {})[seed] = row["tau"]
  seeds = sorted(RUNS)
  lines = ["| task | method | " + " | ".join(f"tau seed {s}" for s in seeds) + " | mean | target (mean chain) | met |"]
  lines.append("|---" * (len(seeds) + 5) + "|")
  mean = lambda d: sum(d[s] for s in seeds) / len(seeds)
  for (task, method), d in taus.items():
    if any(s not in d for s in seeds):
      continue
    target, met = "", ""
    if method.startswith("tree:"):
      d1 = method.split("d1=")[1].split(",")[0]
      chain = mean(taus[task, f"chain:d1={d1},gamma=6"])
      tgt = chain + 0.4 * (7 - chain)
      target, met = f"{tgt:.2f} ({chain:.2f})", "yes" if mean(d) >= tgt else "no"
    cells = " | ".join(f"{d[s]:.2f}" for s in seeds)
    lines.append(f"| {task} | {method} | {cells} | {mean(d):.2f} | {target} | {met} |")
  text = "\n".join(lines) + "\n"
  with open(os.path.join(HERE, "seeds.md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
