"""Decode tokens/s of several methods for B requests decoded together (`loopspec-batch-bench`, whose docstring
explains why LoopSpec stops paying as B grows): one batched `generate` per method and batch size, medians of
timed repeats after an untimed compile, ratios to the first method and the first B where each stops paying.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import loopspec_jax
from loopspec_jax import methods as methods_lib
from loopspec_jax.experiment.settings import split_list


def run_one(model, prompts, method, cfg, mesh):
  """One batched `generate` call of a method."""
  res = loopspec_jax.generate(
      model,
      prompts,
      max_new_tokens=cfg.max_new_tokens,
      method=method,
      temperature=cfg.temperature,
      seed=cfg.seed,
      mesh=mesh,
  )
  return res


def benchmark(model, cfg, mesh=None, progress=print) -> list:
  """One row per batch size: median decode tokens/s of each method (after an untimed compile run)."""
  rng = np.random.RandomState(cfg.seed)
  methods = methods_lib.parse_list(cfg.methods)
  labels = [m.label for m in methods]
  rows = []
  for b in split_list(cfg.batch_sizes):
    prompts = [rng.randint(0, model.config.vocab_size, cfg.prompt_len).tolist() for _ in range(int(b))]
    row = {"batch": int(b)}
    outputs = {}
    for method, label in zip(methods, labels):
      t0 = time.perf_counter()
      outputs[label] = run_one(model, prompts, method, cfg, mesh).tokens  # compiles
      compile_s = time.perf_counter() - t0
      stats = [run_one(model, prompts, method, cfg, mesh).stats for _ in range(cfg.repeats)]
      tps = statistics.median(s["tokens_per_second"] for s in stats)
      row[label] = {
          "tokens_per_second": tps,
          "tokens": stats[0]["tokens_generated"],
          "decode_seconds": statistics.median(s["decode_seconds"] for s in stats),
          "first_call_seconds": compile_s,
          "ticks": stats[0].get("ticks"),
      }
      progress(f"B={b:>3} {label:<18} {tps:9.1f} tok/s   (first call {compile_s:.1f} s)")
    ref = labels[0]
    for label in labels[1:]:
      row[label]["speedup_vs_" + ref] = row[label]["tokens_per_second"] / max(row[ref]["tokens_per_second"], 1e-9)
      row[label]["identical_to_" + ref] = (outputs[label] == outputs[ref]) if cfg.temperature == 0 else None
    rows.append(row)
  return rows


def stops_paying(rows: list, ref: str, label: str):
  """The first batch size where `label` is not faster than `ref` (None: it pays at every size measured)."""
  for row in rows:
    if row[label]["tokens_per_second"] <= row[ref]["tokens_per_second"]:
      return row["batch"]
  return None


def markdown(rows: list, labels: list) -> str:
  """The table (tokens/s per method, ratios to the first, identical outputs) and where each stops paying."""
  ref = labels[0]
  head = (
      "| B | "
      + " | ".join(f"{l} tok/s" for l in labels)
      + " | "
      + " | ".join(f"{l} / {ref}" for l in labels[1:])
      + " | identical |"
  )
  lines = [head, "|" + "---|" * (len(labels) * 2 + 1)]
  for row in rows:
    cells = [f"{row[l]['tokens_per_second']:.1f}" for l in labels]
    ratios = [f"{row[l]['speedup_vs_' + ref]:.2f}x" for l in labels[1:]]
    same = all(row[l].get("identical_to_" + ref) for l in labels[1:])
    lines.append(f"| {row['batch']} | " + " | ".join(cells + ratios) + f" | {'yes' if same else 'NO'} |")
  notes = []
  for l in labels[1:]:
    b = stops_paying(rows, ref, l)
    notes.append(
        f"{l} stops paying at B = {b}" if b is not None else f"{l} pays at every measured B (<= {rows[-1]['batch']})"
    )
  return "\n".join(lines) + "\n\n" + "; ".join(notes) + "."
