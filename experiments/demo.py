"""The main job: decode a few prompts with autoregressive decoding and LoopSpec, greedy and sampled.

  loopspec-demo                                   # bundled tiny-raven, LoopSpec at (d1, d2) = (2, 8)
  loopspec-demo --config.model=tiny-ouro          # bundled tiny-ouro, (1, 2)
  loopspec-demo --config.model=/path/to/checkpoint --config.d1=2 --config.d2=8

Settings: configs/demo.py (`auto`: also time method="auto", the planner's pick, beside them). Prints the text of each method, decode tokens/s (after prefill,
compiled; methods interleaved per prompt, medians of `repeats` calls), the wall-clock ratio, the mean accepted
length, where the time goes (ticks, tokens per tick, ms per
tick beside AR's ms per token), the same for LoopSpec with a single proposal (d1, -) when d2 is set, and whether
greedy LoopSpec reproduced the autoregressive tokens exactly.
"""

from __future__ import annotations

from absl import flags
import jax
from ml_collections import config_flags

import loopspec_jax
from loopspec_jax.experiment.demo import SETTINGS
from loopspec_jax.experiment.demo import auto_line
from loopspec_jax.experiment.demo import cache_note
from loopspec_jax.experiment.demo import chosen_depths
from loopspec_jax.experiment.demo import compile_all
from loopspec_jax.experiment.demo import demo_runs
from loopspec_jax.experiment.demo import report
from loopspec_jax.experiment.prompts import DEMO_PROMPTS, demo_prompt_ids
from loopspec_jax.experiment.timing import decode_interleaved
from loopspec_experiments import common

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file("config", common.config_path("demo.py"), "Demo settings.", flag_values=FLAGS)

# 17-32 tokens each (tiny-raven's tokenizer), so that the four prompts share one prompt bucket and every
# method compiles one prefill and one loop per sampling mode (`common.buckets`)
PROMPTS = DEMO_PROMPTS  # the four prompts (loopspec_jax/experiment/prompts.py: task "demo" of the benchmarks)


def main(argv):
  del argv
  config = _CONFIG.value
  print(f"loading {config.model} ...", flush=True)
  model = loopspec_jax.load(config.model)
  d1, d2 = chosen_depths(model, config)
  prompts = demo_prompt_ids(model)
  print(f"model: {model.family}, R={model.recurrence}, LoopSpec (d1, d2) = ({d1}, {d2})", flush=True)
  phases = [(name, sampling, demo_runs(config, d1, d2, sampling)) for name, sampling in SETTINGS]
  compile_all(model, prompts[0], phases, max_new_tokens=config.max_new_tokens, workers=config.get("compile_workers", 2))
  for name, sampling, runs in phases:
    print(f"\n=== {name} ===", flush=True)
    ls_kw = dict(runs)["loopspec"]
    print(f"compiling and decoding {len(prompts)} prompts, methods interleaved: {[l for l, _ in runs]} ...", flush=True)
    results = decode_interleaved(
        model,
        prompts,
        runs,
        max_new_tokens=config.max_new_tokens,
        seed=config.seed,
        repeats=config.get("repeats", 3),
        progress=True,
        **sampling,
    )
    (ar_out, ar), (ls_out, ls) = results["autoregressive"], results["loopspec"]
    for i, p in enumerate(PROMPTS if model.tokenizer is not None else prompts):
      text = model.decode(ls_out[i]) if model.tokenizer is not None else ls_out[i]
      print(f"\n--- prompt {i}: {p!r}\n{text}")
    single = results.get("loopspec single proposal")
    print("\n" + report(model, d1, ar, ls, single[1] if single else None, gate_mass=ls_kw.get("gate_mass")))
    ratio = ar["decode_seconds"] / max(ls["decode_seconds"], 1e-12)
    note = cache_note(model, d1, ratio, jax.default_backend(), common.last_level_cache_bytes())
    if note:
      print(note)
    if "auto" in results:
      print(auto_line(ar, *results["auto"]))
    if name == "greedy":
      same = ar_out == ls_out and (single is None or single[0] == ar_out)
      same = same and ("auto" not in results or results["auto"][0] == ar_out)
      print(f"greedy outputs identical: {same}")
  print("\nthese figures are this host's; every method, model and host measured: docs/benchmarks.md")


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
