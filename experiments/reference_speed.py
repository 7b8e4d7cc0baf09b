"""Autoregressive decode speed against the public PyTorch reference of Huginn (Raven), same checkpoint.

Why: the claim "our AR decodes Nx faster than the reference" needs one reproducible measurement. This builds a
random model of the `huginn:bench_e512` variant (Huginn-0125's layout at E = 512: 8 heads of 64, MLP 3.375 E, vocab
65536, prelude / core / coda 2 / 4 / 2, R = 32; contractive adapter so the recurrence converges), writes it with our
HF export (`checkpoint.hf.write_hf`), loads that directory both in `loopspec_jax` and in the reference's
`RavenForCausalLM` (float32, `torch.set_num_threads(--threads)`), and decodes the same prompts greedily at R = 32
from a zero initial state (`init_state="zeros"` / `init_scale=0.0`):
  * ours: `loopspec_jax.generate(method="ar")`;
  * reference `hf`: `model.generate(ids, GenerationConfig(...), num_steps=R, init_scale=0.0)` (the model card's
    call: Hugging Face's loop over the reference's `HuginnDynamicCache`);
  * reference `minimal`: its own loop `generate_minimal` (the same cache).
Decode speed is N / (t(2N new tokens) - t(N new tokens)) per prompt, which cancels prefill and per-call
overhead; every configuration runs once untimed first (compiles ours), and repeats rotate the order of the
implementations. Prints one markdown table (medians over repeats; ratio = ours / reference tokens per second,
per repeat, median), the full-sequence logit difference at depth R, how many greedy tokens agree, and the
memory-bandwidth bound of one AR token on this machine: the ideal bytes of a token (`cost.ar_token_bytes`: every
weight read once per use, core R times, plus the KV slots) over the bandwidth a matrix-vector product of a
1 GiB float32 matrix reaches here (`stream_bandwidth`), so the table says how close to its roofline each
implementation runs. Writes reference_speed.json and .md to --out_dir.

The reference is not part of this repository. Get it with
  git clone https://github.com/seal-rg/recurrent-pretraining /tmp/recurrent-pretraining   # measured at 59e0b69
and run, in an environment with torch and transformers (4.56 was used; keep torch out of the project venv):
  python -m loopspec_experiments.reference_speed --reference_dir=/tmp/recurrent-pretraining/recpre
(docs/benchmarks.md, "AR against the public PyTorch reference", has the environment and the latest table.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import types

from absl import flags
import numpy as np

import loopspec_jax
from loopspec_jax import api
from loopspec_jax.analysis import cost
from loopspec_jax.checkpoint import hf
from loopspec_configs import models as model_configs
from loopspec_experiments import common

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "reference_dir", None, "Folder holding raven_modeling_minimal.py and raven_config_minimal.py.", flag_values=FLAGS
)
flags.DEFINE_string("variant", "bench_e512", "Huginn variant (configs/models/huginn.py).", flag_values=FLAGS)
flags.DEFINE_integer("recurrence", 32, "R: core steps per token.", flag_values=FLAGS)
flags.DEFINE_float(
    "contraction", 0.05, "Scale of the adapter's state half (as `random:` bench models).", flag_values=FLAGS
)
flags.DEFINE_integer("num_prompts", 2, "Random prompts, decoded one at a time.", flag_values=FLAGS)
flags.DEFINE_integer("prompt_len", 32, "Tokens per prompt.", flag_values=FLAGS)
flags.DEFINE_integer("new_tokens", 16, "N: decode speed is N / (t(2N) - t(N)).", flag_values=FLAGS)
flags.DEFINE_integer("repeats", 3, "Timed repeats (after one untimed round).", flag_values=FLAGS)
flags.DEFINE_integer("threads", 2, "torch.set_num_threads (JAX uses the machine's cores).", flag_values=FLAGS)
flags.DEFINE_list("reference_paths", ["hf", "minimal"], "Reference generate paths: hf, minimal.", flag_values=FLAGS)
flags.DEFINE_integer("seed", 0, "Weights and prompts.", flag_values=FLAGS)
flags.DEFINE_string("out_dir", "results/reference_speed", "Where the JSON and markdown go.", flag_values=FLAGS)


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
  same = sum(x == y for x, y in zip(a, b))
  first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
  return {"matching": same, "total": max(len(a), len(b)), "identical_prefix": first}


def markdown_table(res: dict, ours: str) -> str:
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


def _sha(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()[:16]


def main(argv):
  del argv
  import torch
  import transformers

  if not FLAGS.reference_dir:
    raise SystemExit("--reference_dir is required (see the module docstring for where to get the reference)")
  torch.set_num_threads(FLAGS.threads)
  load_start = os.getloadavg()
  cfg = model_configs.model_config(f"huginn:{FLAGS.variant}", recurrence=FLAGS.recurrence)
  rng = np.random.RandomState(FLAGS.seed)
  prompts = [rng.randint(0, cfg.vocab_size, FLAGS.prompt_len).tolist() for _ in range(FLAGS.num_prompts)]
  with tempfile.TemporaryDirectory() as ckpt:
    hf.write_hf(ckpt, cfg, api.from_config(cfg, seed=FLAGS.seed, contraction=FLAGS.contraction).params)
    ours = loopspec_jax.load(ckpt)
    ref = load_reference(FLAGS.reference_dir, ckpt)
  with torch.no_grad():  # the same full-sequence forward at depth R from a zero state, both sides
    ref_logits = ref(torch.tensor([prompts[0]]), num_steps=cfg.recurrence, init_scale=0.0).logits[0].numpy()
  logit_diff = float(np.abs(ref_logits - api.readouts(ours, prompts[0], depths=[cfg.recurrence])[0]).max())
  print(
      f"E={cfg.hidden_size} H={cfg.num_heads} I={cfg.intermediate_size} V={cfg.vocab_size} R={cfg.recurrence}; "
      f"max |logit diff| at depth R, full prompt: {logit_diff:.2e}",
      flush=True,
  )

  fns = runners(ours, ref, FLAGS.reference_paths, cfg.recurrence)
  res = measure(fns, prompts, FLAGS.new_tokens, FLAGS.repeats)
  label = next(iter(fns))
  for l, r in res.items():
    r["ratio_median"] = statistics.median(
        a / b for a, b in zip(res[label]["tokens_per_second"], r["tokens_per_second"])
    )
    pairs = [agreement(x, y) for x, y in zip(res[label]["tokens"], r["tokens"])]
    r["agree"] = {k: sum(p[k] for p in pairs) for k in ("matching", "total")} | {"per_prompt": pairs}
  context = FLAGS.prompt_len + 2 * FLAGS.new_tokens
  token_bytes = cost.ar_token_bytes(cfg, context)
  bandwidth = stream_bandwidth()
  bound_s = sum(token_bytes.values()) / bandwidth  # the fastest an AR token can be here
  for r in res.values():
    r["share_of_bound"] = statistics.median(r["tokens_per_second"]) * bound_s
  table = markdown_table(res, label)
  load_end = os.getloadavg()
  meta = {
      "machine": common.machine_description(),
      "time": time.strftime("%Y-%m-%d %H:%M:%S"),
      "loadavg_start": load_start,
      "loadavg_end": load_end,
      "torch": torch.__version__,
      "transformers": transformers.__version__,
      "torch_threads": torch.get_num_threads(),
      "reference_sha256_16": {
          n: _sha(os.path.join(FLAGS.reference_dir, n))
          for n in ("raven_modeling_minimal.py", "raven_config_minimal.py")
      },
      "model": cfg.to_dict(),
      "contraction": FLAGS.contraction,
      "prompts": prompts,
      "new_tokens_n": FLAGS.new_tokens,
      "repeats": FLAGS.repeats,
      "max_abs_logit_diff": logit_diff,
      "ar_token_bytes": token_bytes,
      "stream_bandwidth_bytes_per_s": bandwidth,
      "bound_seconds_per_token": bound_s,
  }
  head = (
      f"Machine: {meta['machine']}, torch {torch.__version__} ({meta['torch_threads']} threads), transformers "
      f"{transformers.__version__}; load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end. "
      f"{len(prompts)} prompts of {FLAGS.prompt_len} tokens, decode tok/s = N / (t(2N) - t(N)), N = {FLAGS.new_tokens}. "
      f"Memory bound of an AR token: {sum(token_bytes.values()) / 1e9:.3f} GB (weights "
      f"{token_bytes['weights'] / 1e9:.3f}, KV {token_bytes['kv'] / 1e9:.3f} at {context} positions) at "
      f"{bandwidth / 1e9:.1f} GB/s (a 1 GiB float32 matrix-vector product here) = {1e3 * bound_s:.1f} ms/token."
  )
  print(head + "\n\n" + table)
  common.write_report(FLAGS.out_dir, "reference_speed", {"meta": meta, "results": res}, f"{head}\n\n{table}")


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
