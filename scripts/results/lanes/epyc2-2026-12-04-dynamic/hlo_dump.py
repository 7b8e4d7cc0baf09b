"""Writes the optimised HLO of LoopSpec's decode loop on tiny-raven (greedy, 4 sweep prompts, 64 tokens) to a
file and lists, per computation, the copy instructions of at least 1 MiB:
`python -P scripts/results/lanes/epyc2-2026-12-04-dynamic/hlo_dump.py OUT.hlo d1,d2[,capacity]`."""

import os
import re
import sys

import jax
import numpy as np

import loopspec_jax
from loopspec_jax.analysis import depth_metrics
from loopspec_jax.decoding.loopspec import decoder as D
from loopspec_jax.decoding.loopspec import tick

BYTES = {"f32": 4, "bf16": 2, "s32": 4, "pred": 1, "u32": 4, "f16": 2, "s8": 1, "u8": 1}


def size(shape):
  m = re.match(r"(\w+)\[([\d,]*)\]", shape)
  dims = [int(x) for x in m.group(2).split(",") if x]
  return BYTES.get(m.group(1), 4) * int(np.prod(dims or [1]))


def main(out, item):
  parts = item.split(",")
  d1, d2 = int(parts[0]), (None if parts[1] == "none" else int(parts[1]))
  kw = {"lane_capacity": int(parts[2])} if len(parts) > 2 else {}
  model = loopspec_jax.load(os.path.join(os.path.dirname(loopspec_jax.__file__), "assets", "models", "tiny-raven"))
  prompts = depth_metrics.prepare_prompts("gsm8k", model, 4, max_new_tokens=64, max_prompt_tokens=256)
  texts = []

  def spy(params, state, sp, **k):
    texts.append(tick.decode_loop.lower(params, state, sp, **k).compile().as_text())
    carried = sorted((x.size * x.dtype.itemsize, x.shape) for x in jax.tree_util.tree_leaves(state))
    print("largest loop-carried buffers (bytes, shape):", carried[-3:])
    return tick.decode_loop(params, state, sp, **k)

  D.decode_loop = spy
  res = loopspec_jax.generate(model, prompts, max_new_tokens=64, method="loopspec", d1=d1, d2=d2, **kw)
  print("stage_width", res.stats["stage_width"], "lane_capacity", res.stats["lane_capacity"])
  with open(out, "w") as f:
    f.write(texts[0])
  comp, found = None, []
  for line in texts[0].splitlines():
    if line and not line.startswith(" ") and line.rstrip().endswith("{"):
      comp = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
    m = re.search(r"= (\w+\[[\d,]*\])\S* (copy|copy-start)\(", line)
    if m and size(m.group(1)) >= 1 << 20:
      found.append((size(m.group(1)), m.group(1), comp))
  print(f"{len(found)} copies of >= 1 MiB")
  for c in sorted(found, reverse=True)[:40]:
    print("  ", c)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
