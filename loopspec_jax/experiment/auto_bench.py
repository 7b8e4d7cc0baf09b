"""method="auto" beside every fixed candidate (`experiments/bench_auto.py` is the command): wall clock of
whole `generate` calls, one request at a time, interleaved rounds with the order rotated; auto's pick and its
predicted / probed / benchmarked ms per iteration beside the fastest fixed method's; the tables.
"""

from __future__ import annotations

import os
import statistics
import time

import loopspec_jax
from loopspec_jax import methods as methods_lib
from loopspec_jax.experiment import timing


def generate_each(model, prompts, method, sampling, max_new_tokens, seed):
  """Wall seconds of every prompt's `generate`, summed; decode seconds, iterations, tokens; outputs; plans."""
  wall = dec = iters = toks = 0.0
  outs, plans = [], []
  for i, p in enumerate(prompts):
    t0 = time.perf_counter()
    res = loopspec_jax.generate(
        model, [p], max_new_tokens=max_new_tokens, method=method, seed=seed, request_ids=[i], **sampling
    )
    wall += time.perf_counter() - t0
    dec += res.stats["decode_seconds"]
    iters += res.stats["ticks"]
    toks += res.stats["tokens"]
    outs.append(res.tokens[0])
    plans.append(res.stats.get("plan"))
  return dict(wall=wall, decode=dec, iterations=iters, tokens=toks), outs, plans


def run_row(model, prompts, specs, sampling, max_new_tokens, repeats, seed) -> dict:
  """{spec: row} of one (model, sampling): every spec (one must be 'ar', one 'auto...') once untimed, then
  `repeats` rotated timed rounds; medians, ratios to AR per round, and on auto's row the fastest fixed spec,
  auto over it and over AR, and the host load before and after."""
  parsed = [methods_lib.parse(s) for s in specs]
  load0 = os.getloadavg()
  first, outputs, plans = {}, {}, {}
  for s, m in zip(specs, parsed):  # warm-up: compiles; auto plans (the plan is cached after this)
    t0 = time.perf_counter()
    first[s], outputs[s], plans[s] = generate_each(model, prompts, m, sampling, max_new_tokens, seed)
    first[s]["first_call_seconds"] = time.perf_counter() - t0
  timed = {s: [] for s in specs}
  for rep in range(repeats):
    for i in timing.rotated(len(specs), rep):
      timed[specs[i]].append(generate_each(model, prompts, parsed[i], sampling, max_new_tokens, seed)[0])
  rows = {}
  for s in specs:
    walls = [t["wall"] for t in timed[s]]
    rows[s] = {
        "method": s,
        "wall_seconds_median": statistics.median(walls),
        "wall_seconds_all": walls,
        "ratio_vs_ar_median": statistics.median(a["wall"] / t["wall"] for a, t in zip(timed["ar"], timed[s])),
        "decode_seconds_median": statistics.median(t["decode"] for t in timed[s]),
        "iterations": timed[s][0]["iterations"],
        "tokens": timed[s][0]["tokens"],
        "ms_per_iteration_median": statistics.median(1e3 * t["decode"] / max(t["iterations"], 1) for t in timed[s]),
        "first_call_seconds": first[s]["first_call_seconds"],
        "identical_to_ar": outputs[s] == outputs["ar"],
        "plan": plans[s][0],
    }
  auto = next(s for s in specs if s.startswith("auto"))
  fixed = [s for s in specs if s != auto]
  fastest = min(fixed, key=lambda s: rows[s]["wall_seconds_median"])
  rows[auto]["fastest_fixed"] = fastest
  rows[auto]["auto_over_fastest"] = rows[auto]["wall_seconds_median"] / rows[fastest]["wall_seconds_median"]
  rows[auto]["auto_over_ar"] = rows[auto]["wall_seconds_median"] / rows["ar"]["wall_seconds_median"]
  rows[auto]["load"] = [load0, os.getloadavg()]
  return rows


def picks(plan) -> str:
  """The first pick, and with re-planning (`Auto.replan`) the second with its probe's x AR after N tokens."""
  second = plan.get("replan") or {}
  if "choice" not in second:
    return plan["choice"]
  return (
      f"{plan['choice']}, then after {second['after_tokens']}: {second['choice']} ({second['top'][0]['x_ar']:.2f}x AR)"
  )


def plan_cells(plan, rows, auto, fastest) -> str:
  """The pick and its ms per iteration as predicted / probed / benchmarked; the same for the fastest fixed."""
  pick = plan["top"][0]
  planned = {r["method"]: r for r in plan["top"]}

  def pred(spec):
    r = planned.get(methods_lib.parse(spec).spec) if not spec.startswith("draft") else None
    return f"{r['predicted_iteration_ms']:.3g}" if r and r.get("predicted_iteration_ms") else "-"

  def probe(spec):
    r = planned.get(methods_lib.parse(spec).spec) if not spec.startswith("draft") else None
    return f"{r['iteration_ms']:.3g}" if r and plan.get("basis", "").startswith("measured") else "-"

  return (
      f"{picks(plan)} | {pick.get('predicted_iteration_ms') or 0:.3g} / {pick['iteration_ms']:.3g} / "
      f"{rows[auto]['ms_per_iteration_median']:.3g} | {fastest}: {pred(fastest)} / {probe(fastest)} / "
      f"{rows[fastest]['ms_per_iteration_median']:.3g}"
  )


def table(all_rows: list) -> str:
  """bench.md: every method's row per block ({model, sampling, rows}), then auto's summary per block."""
  head = (
      "| model | sampling | method | wall s (median) | x AR | ms/iter | tok/iter | identical | first call s |\n"
      "|---|---|---|---|---|---|---|---|---|\n"
  )
  lines, summary = [], []
  for block in all_rows:
    for s, r in block["rows"].items():
      lines.append(
          f"| {block['model']} | {block['sampling']} | {s} | {r['wall_seconds_median']:.3f} | "
          f"{r['ratio_vs_ar_median']:.2f}x | {r['ms_per_iteration_median']:.3g} | "
          f"{r['tokens'] / max(r['iterations'], 1):.2f} | {'yes' if r['identical_to_ar'] else 'no'} | "
          f"{r['first_call_seconds']:.1f} |"
      )
      if "fastest_fixed" in r:
        ok = r["auto_over_fastest"] <= 1.10 and r["auto_over_ar"] <= 1.05
        summary.append(
            f"| {block['model']} | {block['sampling']} | {r['auto_over_fastest']:.3f} | {r['auto_over_ar']:.3f} | "
            f"{'yes' if ok else 'NO'} | {plan_cells(r['plan'], block['rows'], s, r['fastest_fixed'])} | "
            f"{r['load'][0][0]:.1f}-{r['load'][1][0]:.1f} |"
        )
  shead = (
      "| model | sampling | auto / fastest fixed | auto / AR | within 10% and AR+5% | pick | pick ms/iter "
      "predicted / probe / bench | fastest fixed: ms/iter predicted / probe / bench | load (1 min) |\n"
      "|---|---|---|---|---|---|---|---|---|\n"
  )
  return head + "\n".join(lines) + "\n\n" + shead + "\n".join(summary) + "\n"
