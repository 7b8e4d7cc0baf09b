"""tau per (task, method) over sampling seeds 0..15, d1 = 1 only: chain and drafts=kseq on its default Sequoia
shape (the flat count table's) of seeds 0..7 from ../epyc2-2026-12-04-kseq (seed 0: bench_trees.json, s:
seed<s>/), of seeds 8..15 from chain_seed<s>/ and kseq_seed<s>/ here. Means over the seeds each row has,
with their standard error; the target is chain's mean over the same seeds as the row.

  .venv/bin/python -P scripts/results/trees_shape/epyc2-2026-12-04-kseq-b/seeds.py   # writes seeds.md beside it
"""

import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OLD = os.path.join(HERE, "..", "epyc2-2026-12-04-kseq")
CHAIN = "chain:d1=1,gamma=6"
KSEQ = "tree:d1=1,gamma=6,branch=4,tree_nodes=32,drafts=kseq,shape=sequoia"


def load(path, methods, label=None):
  out = {}
  if os.path.exists(path):
    with open(path) as f:
      for row in json.load(f)["rows"]:
        if row["method"] in methods:
          out[row["task"], label or row["method"]] = row["tau"]
  return out


def main():
  taus = {}
  for s in range(16):
    runs = []
    if s < 8:
      old = os.path.join(OLD, "bench_trees.json" if s == 0 else f"seed{s}/bench_trees.json")
      runs.append(load(old, (CHAIN,)))
      runs.append(load(old, (KSEQ,)))
    else:
      runs.append(load(os.path.join(HERE, f"chain_seed{s}/bench_trees.json"), (CHAIN,)))
      runs.append(load(os.path.join(HERE, f"kseq_seed{s}/bench_trees.json"), (KSEQ,)))
    for r in runs:
      for k, v in r.items():
        taus.setdefault(k, {})[s] = v
  half_means = []
  lines = ["| task | method | seeds | mean | SE | target (chain's mean on those seeds) | met |", "|---" * 7 + "|"]
  for (task, method), d in sorted(taus.items()):
    seeds = sorted(d)
    m = sum(d.values()) / len(d)
    se = math.sqrt(sum((v - m) ** 2 for v in d.values()) / (len(d) - 1) / len(d)) if len(d) > 1 else float("nan")
    target, met = "", ""
    for half, pick in (("0..7", [s for s in seeds if s < 8]), ("8..15", [s for s in seeds if s >= 8])):
      if len(pick) > 1 and len(pick) < len(seeds):
        half_means.append(f"{task} {method}: seeds {half} mean {sum(d[s] for s in pick) / len(pick):.2f}")
    if method != CHAIN:
      c = taus[task, CHAIN]
      if all(s in c for s in seeds):
        cm = sum(c[s] for s in seeds) / len(seeds)
        tgt = cm + 0.4 * (7 - cm)
        target, met = f"{tgt:.3f} ({cm:.3f})", "yes" if m >= tgt else f"no ({tgt - m:.3f} short)"
    lines.append(
        f"| {task} | {method} | {seeds[0]}..{seeds[-1]} ({len(seeds)}) | {m:.3f} | {se:.3f} | {target} | {met} |"
    )
  lines += [""] + [f"- {h}" for h in half_means]
  lines += ["", "Per seed:", "", "| task | method | " + " | ".join(str(s) for s in range(16)) + " |", "|---" * 18 + "|"]
  for (task, method), d in sorted(taus.items()):
    lines.append(f"| {task} | {method} | " + " | ".join(f"{d[s]:.2f}" if s in d else "" for s in range(16)) + " |")
  text = "\n".join(lines) + "\n"
  with open(os.path.join(HERE, "seeds.md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
