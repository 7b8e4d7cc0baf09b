"""Our AR decode speed against the reference PyTorch implementation of Huginn (`loopspec-reference-speed`,
experiments/reference_speed.py): the reference files imported as a package of their own, the reference
model loaded from our checkpoint, interleaved timing of each generate path (tokens/s = N / (t(2N) - t(N))),
greedy agreement, the memory bandwidth that bounds a decode step here, and the table.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import statistics
import sys
import time
import types

import loopspec_jax


def import_reference(ref_dir: str):
  """(RavenConfig, RavenForCausalLM) from the two reference files, as a package of their own (its relative
  import needs one; the repository's recpre/__init__.py, which pulls training dependencies, is not run)."""
  pkg = types.ModuleType("raven_reference")
  pkg.__path__ = [ref_dir]
  sys.modules["raven_reference"] = pkg
  mods = {}
  for name in ("raven_config_minimal", "raven_modeling_minimal"):
    spec = importlib.util.spec_from_file_location(f"raven_reference.{name}", os.path.join(ref_dir, name + ".py"))
    mods[name] = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mods[name])
  return mods["raven_config_minimal"].RavenConfig, mods["raven_modeling_minimal"].RavenForCausalLM


def load_reference(ref_dir: str, ckpt: str):
  """The reference model built from our config.json and loaded from our model.safetensors (float32, eval)."""
  from safetensors.torch import load_file

  raven_config, raven_lm = import_reference(ref_dir)
  with open(os.path.join(ckpt, "config.json")) as f:
    model = raven_lm(raven_config(**json.load(f))).float().eval()
  missing, unexpected = model.load_state_dict(load_file(os.path.join(ckpt, "model.safetensors")), strict=False)
  if set(missing) - {"freqs_cis"} or unexpected:  # freqs_cis: the RoPE table, recomputed by the reference
    raise RuntimeError(f"reference load: missing {missing}, unexpected {unexpected}")
  return model


def runners(ours, ref, paths: list, r: int) -> dict:
  """{label: fn(prompt, n) -> new token ids}: ours and each reference generate path."""
  import torch
  from transformers import GenerationConfig

  def run_ours(prompt, n):
    return loopspec_jax.generate(ours, [prompt], max_new_tokens=n, init_state="zeros").tokens[0]

  def run_ref(path, prompt, n):
    ids = torch.tensor([prompt])
    gc = GenerationConfig(max_new_tokens=n, do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
    if path == "hf":
      out = ref.generate(ids, gc, num_steps=r, init_scale=0.0)
    else:  # generate_minimal stops at 65504/65505/65508 (hard-coded); a shorter output is counted as such
      out = ref.generate(ids, gc, num_steps=r, init_scale=0.0, continuous_compute=False, max_new_tokens=n)
    return out[0, len(prompt) :].tolist()

  out = {"ours (loopspec_jax, ar)": run_ours}
  for p in paths:
    if p not in ("hf", "minimal"):
      raise ValueError(f"unknown reference path {p!r}; expected hf or minimal")
    out[f"reference ({'hf generate' if p == 'hf' else 'generate_minimal'})"] = lambda q, n, p=p: run_ref(p, q, n)
  return out


def measure(fns: dict, prompts: list, n: int, repeats: int) -> dict:
  """Per label: per-repeat decode tokens/s (sum over prompts of extra tokens / extra seconds from N to 2N),
  seconds of the 2N calls, and the 2N tokens of each prompt (from the untimed round)."""
  labels = list(fns)
  res = {l: {"tokens_per_second": [], "seconds_2n": [], "tokens": []} for l in labels}
  for l in labels:  # untimed round: compiles ours, warms both
    res[l]["tokens"] = [fns[l](p, 2 * n) for p in prompts]
    for p in prompts:
      fns[l](p, n)
  for rep in range(repeats):
    order = labels[rep % len(labels) :] + labels[: rep % len(labels)]
    for l in order:
      extra_tokens, extra_s, s2 = 0, 0.0, 0.0
      for p in prompts:
        t0 = time.perf_counter()
        a = fns[l](p, n)
        t1 = time.perf_counter()
        b = fns[l](p, 2 * n)
        t2 = time.perf_counter()
        extra_tokens += len(b) - len(a)
        extra_s += (t2 - t1) - (t1 - t0)
        s2 += t2 - t1
      res[l]["tokens_per_second"].append(extra_tokens / max(extra_s, 1e-9))
      res[l]["seconds_2n"].append(s2)
      print(f"  repeat {rep}: {l}: {res[l]['tokens_per_second'][-1]:.2f} tok/s", flush=True)
  return res


def stream_bandwidth(gib: float = 1.0, repeats: int = 7) -> float:
  """Bytes/s one matrix-vector product over a `gib`-GiB float32 matrix reaches here (median of `repeats`):
  the memory roofline of a decode step whose weights do not fit the caches."""
  import jax
  import jax.numpy as jnp

  rows = 8192
  cols = int(gib * 2**30 / 4 / rows)
  w = jax.random.normal(jax.random.PRNGKey(0), (rows, cols), jnp.float32)
  x = jnp.ones((1, rows), jnp.float32)
  f = jax.jit(lambda x, w: x @ w)
  f(x, w).block_until_ready()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(x, w).block_until_ready()
    times.append(time.perf_counter() - t0)
  return rows * cols * 4 / statistics.median(times)


def agreement(a: list, b: list) -> dict:
  """Greedy tokens of two implementations: {matching positions, total, length of the identical prefix}."""
  same = sum(x == y for x, y in zip(a, b))
  first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
  return {"matching": same, "total": max(len(a), len(b)), "identical_prefix": first}


def markdown_table(res: dict, ours: str) -> str:
  """The table of `measure`'s results (with `compare_to`'s fields and share_of_bound); `ours` labels our row."""
  lines = [
      "| implementation | decode tok/s (median) | ms / token | tok/s per repeat | s per 2N call (median) "
      "| ours / this (median per repeat) | share of the memory bound | greedy tokens = ours |",
      "|" + "---|" * 8,
  ]
  for l, r in res.items():
    tps = statistics.median(r["tokens_per_second"])
    ratio = "-" if l == ours else f"{r['ratio_median']:.2f}x"
    agree = "-" if l == ours else f"{r['agree']['matching']}/{r['agree']['total']}"
    lines.append(
        f"| {l} | {tps:.2f} | {1e3 / tps:.1f} | {' / '.join(f'{x:.2f}' for x in r['tokens_per_second'])} | "
        f"{statistics.median(r['seconds_2n']):.2f} | {ratio} | {r['share_of_bound']:.0%} | {agree} |"
    )
  return "\n".join(lines)


def file_sha16(path: str) -> str:
  """The first 16 hex digits of a file's sha256 (which reference files were measured)."""
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()[:16]


def compare_to(res: dict, label: str) -> None:
  """Adds to every row of `measure`'s results, against the row `label`: ratio_median (the median per repeat
  of label's tokens/s over the row's) and agree (greedy tokens matching label's, summed and per prompt)."""
  for r in res.values():
    r["ratio_median"] = statistics.median(
        a / b for a, b in zip(res[label]["tokens_per_second"], r["tokens_per_second"])
    )
    pairs = [agreement(x, y) for x, y in zip(res[label]["tokens"], r["tokens"])]
    r["agree"] = {k: sum(p[k] for p in pairs) for k in ("matching", "total")} | {"per_prompt": pairs}
