"""Copies in the optimised HLO of LoopSpec's decode loop on tiny-raven (greedy, 4 sweep prompts, 64 tokens):
`python -P scripts/results/lanes/hlo_copies.py d1,d2[,capacity]`. Prints each copy / copy-start instruction of the
while body (and of the computations it calls) with its shape and bytes, largest first, and the sizes of the
largest loop-carried buffers (the committed cache, the speculative store) to compare against. Library only,
so PYTHONPATH may point at another checkout."""

import os
import re
import sys

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


def main(item):
  parts = item.split(",")
  d1, d2 = int(parts[0]), (None if parts[1] == "none" else int(parts[1]))
  kw = {"lane_capacity": int(parts[2])} if len(parts) > 2 else {}
  model = loopspec_jax.load(os.path.join(os.path.dirname(loopspec_jax.__file__), "assets", "models", "tiny-raven"))
  prompts = depth_metrics.prepare_prompts("gsm8k", model, 4, max_new_tokens=64, max_prompt_tokens=256)
  texts = []

  def spy(params, state, sp, **k):
    texts.append(tick.decode_loop.lower(params, state, sp, **k).compile().as_text())
    carried = sorted((x.size * x.dtype.itemsize, x.shape) for x in __import__("jax").tree_util.tree_leaves(state))
    print("largest loop-carried buffers (bytes, shape):", carried[-4:])
    return tick.decode_loop(params, state, sp, **k)

  D.decode_loop = spy
  res = loopspec_jax.generate(model, prompts, max_new_tokens=64, method="loopspec", d1=d1, d2=d2, **kw)
  print("stage_width", res.stats["stage_width"], "lane_capacity", res.stats["lane_capacity"])
  copies = []
  comp = None
  for line in texts[0].splitlines():
    m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line.strip())
    if m and "=" not in line.split("{")[0]:
      comp = m.group(1)
    m = re.search(r"= (\w+\[[\d,]*\])\S* (copy|copy-start)\(", line)
    if m:
      copies.append((size(m.group(1)), m.group(1), m.group(2), comp))
  copies.sort(reverse=True)
  print(f"{len(copies)} copies; total {sum(c[0] for c in copies)} bytes; largest:")
  for c in copies[:12]:
    print("  ", c)


if __name__ == "__main__":
  main(sys.argv[1])
