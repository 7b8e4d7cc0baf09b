"""Draft cost of the Medusa heads beside a depth-d1 readout's, per drafted row, for a bundled target.

  python -P scripts/results/heads/cost_medusa.py --out results/heads/<run>/cost.md

Weight flops (2 x multiply-adds of the weight matrices, attention over the context not counted) and weight
bytes (float32 parameters a row reads). Medusa: one row (the accepted node's feature) through every head per
round. Chain / tree self-speculation: each drafted row runs prelude + d1 core steps + coda + the LM head.
The verify pass: prelude + R core steps + coda + the LM head per verified row.
"""

import argparse

import numpy as np

import loopspec_jax as lj
from loopspec_jax.decoding import adaptive
from loopspec_jax.models import looped as M


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--model", default="tiny-raven")
  ap.add_argument("--heads", default="tiny-raven-medusa")
  args = ap.parse_args()
  model, heads = lj.load(args.model), lj.load_heads(args.heads)
  cfg = model.config
  block = sum(int(np.prod(s)) for s in M.layer_shapes(cfg).values())
  lm = cfg.hidden_size * cfg.vocab_size
  h_params = sum(int(np.prod(x.shape)) for x in lj_leaves(heads.params))
  rows = [("medusa heads, per round (all %d heads)" % heads.config["num_heads"], h_params, h_params)]
  for d1 in (1, 2):
    n = adaptive.layer_calls(cfg, d1) * block + lm
    distinct = (cfg.n_prelude + cfg.n_core + cfg.n_coda) * block + lm  # the core weights are shared by its steps
    rows.append((f"depth-{d1} readout, per drafted row", n, distinct))
  n = adaptive.layer_calls(cfg, cfg.recurrence) * block + lm
  rows.append(
      (f"verify (depth {cfg.recurrence}), per verified row", n, (cfg.n_prelude + cfg.n_core + cfg.n_coda) * block + lm)
  )
  lines = [
      f"# Draft cost per row: {args.heads} vs depth-d1 readouts of {args.model}",
      "",
      "| what | weight MFLOP | weight MB read (float32, distinct) | vs one verified row (flops) |",
      "|---|---|---|---|",
  ]
  for name, macs, distinct in rows:
    lines.append(f"| {name} | {2 * macs / 1e6:.2f} | {4 * distinct / 1e6:.2f} | {macs / n:.3f} |")
  text = "\n".join(lines) + "\n"
  with open(args.out, "w") as f:
    f.write(text)
  print(text)


def lj_leaves(tree):
  import jax

  return jax.tree_util.tree_leaves(tree)


if __name__ == "__main__":
  main()
