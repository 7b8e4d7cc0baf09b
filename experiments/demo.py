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

import concurrent.futures
import time
from typing import Optional

from absl import flags
import jax
from ml_collections import config_flags

import loopspec_jax
from loopspec_jax.analysis import cost
from loopspec_jax.experiment.prompts import DEMO_PROMPTS, demo_prompt_ids
from loopspec_jax.experiment.timing import decode_interleaved
from loopspec_experiments import common

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file("config", common.config_path("demo.py"), "Demo settings.", flag_values=FLAGS)

# 17-32 tokens each (tiny-raven's tokenizer), so that the four prompts share one prompt bucket and every
# method compiles one prefill and one loop per sampling mode (`common.buckets`)
PROMPTS = DEMO_PROMPTS  # the four prompts (loopspec_jax/experiment/prompts.py: task "demo" of the benchmarks)
SETTINGS = (("greedy", dict(temperature=0.0)), ("sampled T=1.0 top_p=0.7", dict(temperature=1.0, top_p=0.7)))


def auto_method(config) -> "loopspec_jax.Auto":
  """The demo's planner: the config's `auto_*` settings (a measured shortlist of `auto_candidates` methods
  besides AR, `auto_measure` tokens each, re-planning after `auto_replan` tokens)."""
  return loopspec_jax.Auto(
      candidates=config.get("auto_candidates"), measure=config.get("auto_measure", 16), replan=config.get("auto_replan")
  )


def chosen_depths(model, config) -> tuple:
  """The config's (d1, d2), or the model's best known pair when d1 is none."""
  if config.d1 is None:
    return common.best_depths(model)
  return int(config.d1), config.d2


def report(model, d1: int, ar: dict, ls: dict, single: Optional[dict] = None, gate_mass=None) -> str:
  """The lines comparing the methods: tokens/s, gamma, where the time goes, wall-clock ratio; with `single`
  (LoopSpec at (d1, -)), one more line for the single proposal; with `gate_mass`, the gate it ran with."""
  ratio = lambda x: ar["decode_seconds"] / max(x["decode_seconds"], 1e-12)
  gate = f", gate_mass {gate_mass:g}" if gate_mass else ""
  lines = [
      f"autoregressive: {ar['tokens_per_second']:8.1f} tokens/s",
      f"loopspec:       {ls['tokens_per_second']:8.1f} tokens/s   mean accepted length "
      f"{ls['mean_accepted_length']:.2f} of {model.recurrence // d1}{gate}",
      "time: " + common.time_line("loopspec", ls, ar),
      f"wall-clock ratio (decode after prefill): {ratio(ls):.2f}x",
  ]
  if single is not None:
    lines.append(
        f"single proposal (d1, d2) = ({d1}, -): {single['tokens_per_second']:.1f} tokens/s, mean accepted length "
        f"{single['mean_accepted_length']:.2f}, {ratio(single):.2f}x AR ({common.time_line('ticks', single)})"
    )
  return "\n".join(lines)


def auto_line(ar: dict, outputs: list, auto: dict) -> str:
  """The auto row beside AR and LoopSpec: its rate and ratio, and what the planner picked per prompt."""
  ratio = ar["decode_seconds"] / max(auto["decode_seconds"], 1e-12)
  picks = sorted(set(p["choice"] for p in auto.get("plans", [])))
  return (
      f"auto:           {auto['tokens_per_second']:8.1f} tokens/s   {ratio:.2f}x AR (decode after prefill), "
      f"planner picked {', '.join(picks) or '?'} (stats['plan'])"
  )


def cache_note(model, d1: int, ratio: float, backend: str, cache_bytes: int) -> Optional[str]:
  """Why LoopSpec trails AR, when it does on a CPU whose cache (`cache_bytes`) holds the core's weights: a tick
  does the arithmetic of an AR token (R / d1 lanes x d1 steps) and reads the same KV bytes (every depth attends
  to its own cache slot), so all it saves is weight reads, which such a model hardly needs saved. None
  otherwise (the reason would be another one)."""
  core = cost.param_bytes(model.config)["core"]
  if ratio >= 1.0 or backend != "cpu" or core > cache_bytes:
    return None
  kv_100 = cost.ar_token_bytes(model.config, 100)["kv"]
  return (
      f"why: a LoopSpec tick does the arithmetic of an AR token ({model.recurrence // d1} lanes x {d1} steps) and "
      f"reads the same KV bytes ({kv_100 / 1e6:.1f} MB per 100 cached positions: every depth attends to its own "
      f"slot), to save weight reads, but this model's {core / 1e6:.1f} MB of core weights fit the CPU's "
      f"{cache_bytes / 2**20:.0f} MiB cache; `loopspec-row-cost` measures what that leaves, "
      "`loopspec-bench --config=bench/default.py:memory_bound` decodes a model larger than the cache "
      "(docs/benchmarks.md)"
  )


def demo_runs(config, d1: int, d2, sampling: dict) -> list:
  """[(label, generate kwargs)] of one sampling setting: AR, LoopSpec (d1, d2), the single proposal (d1, -) when
  d2 is set and `compare_single_proposal`, and `auto` when asked."""
  ls_kw = dict(method="loopspec", d1=d1, d2=d2)
  if d2 is not None and config.get("gate_mass") and sampling.get("temperature", 0.0) > 0:
    ls_kw["gate_mass"] = float(config.gate_mass)  # greedy's gate is x2 != x1 whatever the mass
  runs = [("autoregressive", dict(method="ar")), ("loopspec", ls_kw)]
  if d2 is not None and config.get("compare_single_proposal", True):
    runs.append(("loopspec single proposal", dict(method="loopspec", d1=d1, d2=None)))
  if config.get("auto", True):  # planned on each prompt's first (untimed) call, then cached (on disk too)
    runs.append(("auto", dict(method=auto_method(config))))
  return runs


def compile_all(model, prompt, phases, *, max_new_tokens: int, workers: int = 2) -> None:
  """Compiles every fixed method of every phase up front, `workers` calls at a time: XLA compiles one program
  on one core, so on a 2-core host two compile side by side in about half the time. `auto` is not run here:
  its planning times probes, which must not share the host with a compile (it runs alone, later)."""
  jobs = [
      (f"{label} ({name.split()[0]})", dict(kw, **sampling)) for name, sampling, runs in phases for label, kw in runs
  ]
  jobs = [(label, kw) for label, kw in jobs if not label.startswith("auto ")]
  print(f"compiling {len(jobs)} decoders, {workers} at a time ...", flush=True)
  t0 = time.perf_counter()

  def one(job):
    label, kw = job
    loopspec_jax.generate(model, [prompt], max_new_tokens=max_new_tokens, **kw)
    print(f"  {label}: ready after {time.perf_counter() - t0:.1f} s", flush=True)

  with concurrent.futures.ThreadPoolExecutor(max(int(workers), 1)) as pool:
    list(pool.map(one, jobs))


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
