"""The demo's runs and lines (`loopspec-demo`, experiments/demo.py): which methods run per sampling setting
(AR, LoopSpec at (d1, d2), its single proposal, the planner), every fixed one compiled up front two at a
time, and the report comparing them: tokens/s, mean accepted length, where the time goes, the ratio to AR, the
planner's picks and, on a CPU whose cache holds the core's weights, why LoopSpec trails AR there.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Optional

import loopspec_jax
from loopspec_jax.analysis import cost
from loopspec_jax.experiment.models import best_depths
from loopspec_jax.experiment.timing import time_line

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
    return best_depths(model)
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
      "time: " + time_line("loopspec", ls, ar),
      f"wall-clock ratio (decode after prefill): {ratio(ls):.2f}x",
  ]
  if single is not None:
    lines.append(
        f"single proposal (d1, d2) = ({d1}, -): {single['tokens_per_second']:.1f} tokens/s, mean accepted length "
        f"{single['mean_accepted_length']:.2f}, {ratio(single):.2f}x AR ({time_line('ticks', single)})"
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
