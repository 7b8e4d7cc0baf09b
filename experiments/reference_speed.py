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

import os
import statistics
import tempfile
import time

from absl import flags
import numpy as np

import loopspec_jax
from loopspec_jax import api
from loopspec_jax.analysis import cost
from loopspec_jax.checkpoint import hf
from loopspec_jax.experiment.reference import compare_to
from loopspec_jax.experiment.reference import file_sha16
from loopspec_jax.experiment.reference import load_reference
from loopspec_jax.experiment.reference import markdown_table
from loopspec_jax.experiment.reference import measure
from loopspec_jax.experiment.reference import runners
from loopspec_jax.experiment.reference import stream_bandwidth
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
  compare_to(res, label)
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
          n: file_sha16(os.path.join(FLAGS.reference_dir, n))
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
