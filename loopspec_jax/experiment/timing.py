"""Benchmark timing: each prompt decoded alone, an untimed compiling pass, interleaved timed repeats, medians.

A shared, loaded machine drifts: repeats take the methods in rotated order (`rotated`) or precede each timed
pass of a configuration with a timed AR pass (`measure(interleave_ar=True)`), so wall-clock ratios compare
passes taken seconds apart, and medians keep a slow spell from moving the figures.
"""

from __future__ import annotations

import statistics
import time
from typing import List, Optional

import jax
from tqdm import tqdm

import loopspec_jax
from loopspec_jax import methods as methods_lib
from loopspec_jax.decoding.stats import DecodeStats


def decode_each(model, prompts, method, sampling: dict, max_new_tokens: int, seed: int, **generate_kwargs):
  """Decodes every prompt alone (request id = its index), as the paper measures: per-prompt `DecodeStats`
  and token lists. `generate_kwargs` (e.g. eos_id) go to `generate` as given."""
  stats, outputs = [], []
  for i, p in enumerate(prompts):
    res = loopspec_jax.generate(
        model,
        [p],
        max_new_tokens=max_new_tokens,
        method=method,
        seed=seed,
        request_ids=[i],
        **generate_kwargs,
        **sampling,
    )
    stats.append(res.counts)
    outputs.append(res.tokens[0])
  return stats, outputs


def total(counts: list) -> dict:
  """Every figure of a list of runs of one method: their `DecodeStats` added, then `summary()` (the method's
  own class derives its figures from the summed raw counts)."""
  return DecodeStats.total(list(counts)).summary()


def decode_seconds(counts: list) -> float:
  """The decode time (after prefill) of a list of runs, summed."""
  return DecodeStats.total(list(counts)).totals["decode_seconds"]


def rotated(n: int, rep: int) -> List[int]:
  """The order of n methods in repeat `rep`: 0..n-1 rotated left by rep (each method leads in turn)."""
  order = list(range(n))
  return order[rep % n :] + order[: rep % n]


def median_ratio(reference: list, times: list) -> float:
  """The median over repeats of reference / time, pairing the repeats (the same pass of both)."""
  return statistics.median(a / b for a, b in zip(reference, times))


def interleaved(calls: dict, repeats: int, rotate: bool = False) -> dict:
  """{label: [one result per repeat]} of callables that each time themselves (return seconds): one untimed
  round first (compiles), then `repeats` (at least 1) rounds calling every callable once in turn, in `calls`'
  order or, with `rotate`, rotated each round, so a slow spell of a shared machine hits all alike."""
  labels = list(calls)
  for label in labels:
    calls[label]()
  out = {label: [] for label in labels}
  for rep in range(max(int(repeats), 1)):
    for i in rotated(len(labels), rep) if rotate else range(len(labels)):
      out[labels[i]].append(calls[labels[i]]())
  return out


def medians(results: dict) -> dict:
  """{label: median} of `interleaved`'s {label: [results]}."""
  return {label: statistics.median(v) for label, v in results.items()}


def release_compiled():
  """Drops every compiled program (`jax.clear_caches`) between groups of a long experiment.

  XLA CPU keeps 1,000-2,700 memory mappings of JIT code per compiled decode loop (measured on the bundled
  models), and a process that compiles many configurations runs out of the kernel's 65,530 (LLVM "Cannot
  allocate memory", then a crash). Groups (task, sampling) recompile their programs anyway."""
  jax.clear_caches()


def time_line(label: str, agg: dict, ar: Optional[dict] = None) -> str:
  """Where the time goes, from summed stats: 'loopspec: 81 ticks, 0.79 tokens/tick, 1.9 ms/tick (AR: 3.1 ms/token)'.

  `agg` and `ar` hold ticks, tokens and decode_seconds (as `total` returns them).
  """
  ticks = max(agg["ticks"], 1)
  text = (
      f"{label}: {agg['ticks']} ticks, {agg['tokens'] / ticks:.2f} tokens/tick, "
      f"{1e3 * agg['decode_seconds'] / ticks:.2f} ms/tick"
  )
  if ar is not None:
    text += f" (AR: {1e3 * ar['decode_seconds'] / max(ar['tokens'], 1):.2f} ms/token)"
  return text


def row_labels(parsed: list) -> list:
  """The rows' labels (`Method.label`); methods that share one (e.g. two EAGLE heads with one envelope: labels
  leave the head out) are labelled by their specs instead."""
  labels = [m.label for m in parsed]
  return [m.spec if labels.count(l) > 1 else l for m, l in zip(parsed, labels)]


def _result(agg: dict, label: str, times: dict, per_prompt: dict, outputs: dict) -> dict:
  """One method's benchmark row: its summed figures, decode-time median, ratios against AR (whole passes and
  per prompt, repeats paired) and whether its tokens equal AR's."""
  res = dict(agg, method=label)  # the label names the configuration ('loopspec(d1=2,d2=8)')
  res["decode_seconds_median"] = statistics.median(times[label])
  res["decode_seconds_all"] = times[label]
  res["tokens_per_second_median"] = res["tokens"] / max(res["decode_seconds_median"], 1e-9)
  res["wall_clock_ratio_median"] = statistics.median([a / b for a, b in zip(times["ar"], times[label])])
  res["identical_to_ar"] = outputs[label] == outputs["ar"]
  # Per prompt: the median over repeats of AR's decode time over this method's (same repeat).
  res["prompt_ratios"] = [median_ratio(ar, mine) for ar, mine in zip(per_prompt["ar"], per_prompt[label])]
  res["prompt_ratio_median"] = statistics.median(res["prompt_ratios"])
  res["prompt_ratio_min"] = min(res["prompt_ratios"])
  return res


def benchmark(
    model,
    prompts,
    methods: list,
    sampling: dict,
    *,
    max_new_tokens: int,
    repeats: int,
    seed: int = 0,
    progress: bool = True,
) -> dict:
  """Runs every method on every prompt `repeats` times (after a warm-up pass that compiles), the methods'
  order rotated each repeat; returns per-method results ({label: row}), the first method ('ar') the reference
  of the ratios."""
  parsed = methods_lib.parse_list(methods)
  labels = row_labels(parsed)
  if labels[0] != "ar":
    raise ValueError("the first method must be 'ar' (the reference of the wall-clock ratios)")
  times = {l: [] for l in labels}
  per_prompt = {l: [[] for _ in prompts] for l in labels}  # decode seconds per prompt, one per repeat
  aggs, outputs = {}, {}
  bar = tqdm(total=len(parsed) * (repeats + 1), desc="bench", disable=not progress)
  for method, label in zip(parsed, labels):  # warm-up: compile every configuration
    outputs[label] = decode_each(model, prompts, method, sampling, max_new_tokens, seed)[1]
    bar.update(1)
  for rep in range(repeats):
    for i in rotated(len(parsed), rep):
      label = labels[i]
      st, _ = decode_each(model, prompts, parsed[i], sampling, max_new_tokens, seed)
      aggs[label] = total(st)
      times[label].append(aggs[label]["decode_seconds"])
      for j, s in enumerate(st):
        per_prompt[label][j].append(s.totals["decode_seconds"])
      bar.update(1)
  bar.close()
  return {label: _result(aggs[label], label, times, per_prompt, outputs) for label in labels}


def measure(model, prompts, m, sampling, *, max_new_tokens, repeats, seed, eos_id, interleave_ar=False):
  """Warm-up pass plus `repeats` timed passes; returns (the summed stats' `summary()`, decode seconds per pass,
  outputs, AR seconds per pass, the last pass's per-prompt `DecodeStats`).

  With interleave_ar, every timed pass of the configuration is preceded by a timed AR pass over the same
  prompts (AR is already compiled, so this costs AR's decode time only): on a shared, loaded machine the load
  drifts over a long sweep, and a ratio of passes taken seconds apart tracks the configuration, not the drift.
  """
  rest = (sampling, max_new_tokens, seed)
  stats, outputs = decode_each(model, prompts, m, *rest, eos_id=eos_id)
  times, ar_times = [], []
  for _ in range(max(1, repeats)):
    if interleave_ar and not isinstance(m, methods_lib.AR):
      ar_times.append(decode_seconds(decode_each(model, prompts, methods_lib.AR(), *rest, eos_id=eos_id)[0]))
    stats, _ = decode_each(model, prompts, m, *rest, eos_id=eos_id)
    times.append(decode_seconds(stats))
  return total(stats), times, outputs, ar_times, stats


def decode_interleaved(
    model, prompts, runs, *, max_new_tokens: int, seed: int, repeats: int = 3, progress: bool = False, **sampling
) -> dict:
  """Each prompt alone (as the paper measures) with every method of `runs` [(label, generate kwargs)]: one
  untimed compiling call per method, then `repeats` rounds that time each method once in turn (a slow spell
  of the shared machine hits all methods alike); per method and prompt the median-time call counts.
  `progress`: a line per untimed call (what it compiled or planned). Returns {label: (outputs, summed stats)}."""
  out, plans = {label: ([], []) for label, _ in runs}, {}
  gen = lambda i, p, kw: loopspec_jax.generate(
      model, [p], max_new_tokens=max_new_tokens, seed=seed, request_ids=[i], **sampling, **kw
  )
  for i, p in enumerate(prompts):
    for label, kw in runs:
      t0 = time.perf_counter()
      first = gen(i, p, kw)
      if progress:
        print(f"  prompt {i + 1}/{len(prompts)}, {label}: {warmup_note(first, time.perf_counter() - t0)}", flush=True)
    timed = {label: [] for label, _ in runs}
    for _ in range(max(int(repeats), 1)):
      for label, kw in runs:
        timed[label].append(gen(i, p, kw))
    for label, calls in timed.items():
      res = sorted(calls, key=lambda r: r.stats["decode_seconds"])[len(calls) // 2]
      out[label][0].append(res.tokens[0])
      out[label][1].append(res.counts)
      if "plan" in res.stats:  # method='auto': the planner's choice for this prompt
        plans.setdefault(label, []).append(res.stats["plan"])
  results = {label: (toks, total(counts)) for label, (toks, counts) in out.items()}
  for label, p in plans.items():
    results[label][1]["plans"] = p
  return results


def warmup_note(result, seconds: float) -> str:
  """What a method's first (untimed) call on a prompt cost: compiling, and the planner's work for 'auto'."""
  st = result.stats
  note = f"{seconds:.1f} s"
  if st.get("compile_seconds", 0.0) >= 0.05:
    note += f" ({st['compile_seconds']:.1f} s compiling)"
  plan = st.get("plan")
  if plan is not None:
    how = "cached plan" if plan.get("cached") else f"planned in {plan.get('plan_seconds', 0.0):.1f} s"
    note += f", {how}: picked {' then '.join(plan.get('picks', [plan['choice']]))}"
  return note
