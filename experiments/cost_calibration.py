"""Calibration of the cost model on the host: predicted against measured decode-loop iterations.

For each model (`configs/cost/calibrate.py`): measure the host's terms at the model's shapes
(`analysis/calibrate.py`: stream bandwidth at the model's working set, product throughput P(M), per-op
overhead), then for each context and sampling mode compile every method's real decode loop once, predict one
iteration from its optimised HLO with `hardware.Hardware.step_seconds`, run the same compiled loop to completion
(interleaved repeats, medians) and write one row per method:

  predicted_ms / measured_ms      one loop iteration (AR token, chain round, LoopSpec tick, draft round)
  tokens_per_iteration            measured (the prediction is of the hardware model, not of acceptance)
  mean_width / branch_weights     LoopSpec: the lane columns its ticks computed on average (measured, as
                                  tokens per iteration are) and the mix of its width switch's branches that
                                  the prediction counts (`calibrate.branch_mix`; the widest alone before)
  predicted_ratio / measured_ratio  speed against AR of the same model, context and sampling:
                                  (AR seconds per token) / (method seconds per token); > 1 is faster
  ratio_error                     predicted_ratio / measured_ratio - 1
  terms_ms                        the prediction's memory / compute (products) / vector (transcendentals) /
                                  per-op terms
  wrong_term                      for a row whose ratio misses: the one term which, scaled by `factor` in this
                                  loop and AR's alike, would close the miss (which term is wrong, by how much)

The host's terms are measured in the same process, interleaved with the loops' runs (`measure_runs(host=)`),
at the loops' own product shapes; `clock` "wall" (the default; "cpu", process CPU time, under-counts calls
shorter than a few scheduler ticks whose work runs on XLA's worker threads: `calibrate.set_clock`), `stat`
"min" takes each callable's least disturbed run, `overhead_from` "ar"
fits the per-op overhead on AR's loop of the block (the other loops and every ratio stay predictions).

Rows go to <out_root>/<host>-<date>/calibration.json and .md, with a README.md naming host, date, command.

  loopspec-cost-report --config=cost/calibrate.py            # the full grid
  loopspec-cost-report --config=cost/calibrate.py:quick      # a subset (tiny models, greedy)
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time

import jax.numpy as jnp

from loopspec_jax import methods
from loopspec_jax.analysis import calibrate
from loopspec_jax.analysis import cost
from loopspec_experiments import common


def working_set_bytes(cfg, context: int) -> float:
  """Weights plus the committed KV cache of one request at `context` positions (the bytes an AR token streams)."""
  ideal = cost.ar_token_bytes(cfg.replace(dtype=cfg.dtype), context)
  return float(sum(cost.param_bytes(cfg).values()) + ideal["kv"])


def working_sets(cfg, context: int) -> dict:
  """Bytes each category of an iteration's traffic cycles through: the weights re-read every step (the
  recurrent core: cache-resident when it fits), the KV cache streamed among the weights (the whole working set), and the state
  and activations (one matrix of the model's shape: always in the caches)."""
  small = float(cfg.hidden_size * cfg.intermediate_size * jnp.dtype(cfg.dtype).itemsize)
  pb = cost.param_bytes(cfg)
  weights = float(pb.get("core", 0.0) + pb.get("adapter", 0.0))  # re-read every recurrence step
  return {"weights": weights, "kv": working_set_bytes(cfg, context), "copies": small, "other": small}


def predict(hw, lr: calibrate.LoopRun, working_set, mode: str, branch="max") -> tuple:
  """(seconds, terms in ms, StepCost) of one iteration of a compiled loop on hardware hw; `branch`: how its
  conditionals are counted (`hlo_cost.HloCostModel`; a LoopSpec tick's width switch at its measured mix,
  `calibrate.branch_mix`)."""
  step = cost.analyze_hlo(lr.hlo, lr.kv_dims, lr.slot_bytes, branch)
  terms = hw.terms(step, working_set)
  seconds = hw.step_seconds(step, working_set, mode)
  return seconds, {k.replace("_s", "_ms"): v * 1e3 for k, v in terms.items()}, step


def shapes_to_time(steps, limit: int) -> list:
  """The product shapes (`hlo_cost.dot_signature`) of the loops' bodies, by their flops per iteration summed
  over the loops, largest first; the first `limit` of them (0: all). Untimed shapes take flops / P(M)."""
  weight = {}
  for st in steps:
    for (_, sig), n in st.dot_items.items():
      weight[sig] = weight.get(sig, 0.0) + n * st.dot_shapes[sig][0]
  ranked = sorted(weight, key=lambda k: (-weight[k], k))
  return ranked[:limit] if limit else ranked


def fit_overhead(hw, ar_step, ws, ar_seconds: float):
  """hw with the per-op overhead that makes AR's predicted iteration its measured one: (measured - the
  memory and compute terms) / AR's ops, at least the microbenchmark's (kept in `source`). The other methods'
  iterations, and so every ratio, stay predictions."""
  t = hw.terms(ar_step, ws)
  fitted = max((ar_seconds - t["total_s"] + t["overhead_s"]) / max(ar_step.ops, 1.0), hw.op_overhead_s)
  src = (
      f"{hw.source}; per-op fitted on AR's loop: {fitted * 1e9:.0f} ns (microbenchmark {hw.op_overhead_s * 1e9:.0f} ns)"
  )
  return dataclasses.replace(hw.with_overhead(fitted), source=src)


def rows_for(model, label: str, context: int, greedy: bool, c) -> tuple:
  """(rows, host `Hardware`) of one model at one context and sampling mode, one row per method (the first
  is AR). The host's terms are measured interleaved with the loops' runs, at the loops' own product shapes."""
  specs = list(c.model_settings[label].methods)
  loops, steps = {}, {}
  for spec in specs:
    loops[spec] = calibrate.time_decode_loop(model, spec, context=context, new_tokens=c.new_tokens, greedy=greedy)
    steps[spec] = cost.analyze_hlo(loops[spec].hlo, loops[spec].kv_dims, loops[spec].slot_bytes)
  ws = working_sets(model.config, context)
  sigs = shapes_to_time(steps.values(), c.get("timed_shapes", 0))
  fns, work = calibrate.host_fns(model.config, ws, tuple(c.rows), sigs)
  measured, host_secs = calibrate.measure_runs(loops, c.repeats, fns, c.get("stat", "median"))
  hw = calibrate.hardware_from(host_secs, work)
  if c.get("overhead_from", "microbenchmark") == "ar":
    hw = fit_overhead(hw, steps[specs[0]], ws, measured[specs[0]]["iteration_s"])
  rows = []
  for spec in specs:
    m = measured[spec]
    mix = calibrate.branch_mix(loops[spec].widths, m.get("mean_width"))
    pred_s, terms, step = predict(hw, loops[spec], ws, c.mode, mix)
    rows.append(
        {
            "model": label,
            "method": methods.parse(spec).label,
            "spec": spec,
            "sampling": "greedy" if greedy else "sampled",
            "context": context,
            "predicted_ms": pred_s * 1e3,
            "measured_ms": m["iteration_s"] * 1e3,
            "measured_ms_median": m["iteration_s_median"] * 1e3,
            "measured_ms_all": [t * 1e3 for t in m["iteration_s_all"]],
            "iteration_error": pred_s / m["iteration_s"] - 1.0,
            "tokens_per_iteration": m["tokens_per_iteration"],
            "ladder": list(loops[spec].widths),
            "mean_width": m.get("mean_width"),
            "branch_weights": list(mix) if isinstance(mix, tuple) else mix,
            "terms_ms": terms,
            "ops": step.ops,
            "unknown_trip_counts": step.unknown_trip_counts,
            "flops_by_rows": {str(k): v for k, v in step.flops_by_rows.items()},
            "flops": step.flops,
            "transcendentals": step.transcendentals,
            "bytes": step.total_bytes,
            "working_set_bytes": ws["kv"],
            "working_sets": ws,
        }
    )
  ar = rows[0]
  ar["ideal_bytes"] = float(sum(cost.ar_token_bytes(model.config, context).values()))
  ar["bandwidth_bound_ms"] = ar["ideal_bytes"] / hw.stream_bandwidth(ws["kv"]) * 1e3
  for r in rows:
    tpi = max(r["tokens_per_iteration"], 1e-9)
    r["predicted_ratio"] = ar["predicted_ms"] / (r["predicted_ms"] / tpi)
    r["measured_ratio"] = ar["measured_ms"] / (r["measured_ms"] / tpi)
    r["ratio_error"] = r["predicted_ratio"] / r["measured_ratio"] - 1.0
    r["wrong_term"] = wrong_term(r, ar)
  return rows, hw


TERMS = ("memory", "compute", "vector", "overhead")


def wrong_term(row: dict, ar: dict) -> dict:
  """Which term of the model, scaled by one factor f in this row's loop and in AR's alike, makes the predicted
  ratio equal the measured one, and f (the term closest to right, |log f| smallest; {} when no term can).
  Solves (A_o + f A_t) / (M_o + f M_t) = measured AR / method seconds per iteration for each term t."""
  if row is ar:
    return {}
  target = ar["measured_ms"] / row["measured_ms"]
  best = {}
  for t in TERMS:
    a_t, m_t = ar["terms_ms"].get(f"{t}_ms", 0.0), row["terms_ms"].get(f"{t}_ms", 0.0)
    a_o, m_o = ar["predicted_ms"] - a_t, row["predicted_ms"] - m_t
    den = a_t - target * m_t
    if abs(den) < 1e-12:
      continue
    f = (target * m_o - a_o) / den
    if f > 0 and (not best or abs(math.log(f)) < abs(math.log(best["factor"]))):
      best = {"term": t, "factor": f}
  return best


def which_term(row: dict) -> str:
  """The dominant term of the prediction."""
  t = row["terms_ms"]
  return max(TERMS, key=lambda k: t.get(f"{k}_ms", 0.0))


def _wrong_cell(r: dict) -> str:
  w = r.get("wrong_term") or {}
  if abs(r["ratio_error"]) <= 0.25:
    return ""
  return f"{w['term']} x{w['factor']:.2g}" if w else "no single term"


def roofline_notes(rows: list) -> list:
  """Per block: AR against this host's bandwidth bound (ideal bytes of an AR token at the bandwidth measured
  at its working set) and each LoopSpec tick against the calibrated model's time."""
  out = []
  for ar in (r for r in rows if r["spec"] == "ar" and "bandwidth_bound_ms" in r):
    block = (ar["model"], ar["context"], ar["sampling"])
    line = f"- {' '.join(str(b) for b in block)}: AR {ar['measured_ms']:.3g} ms against a bandwidth bound of"
    line += f" {ar['bandwidth_bound_ms']:.3g} ms ({ar['ideal_bytes'] / 1e6:.4g} MB ideal): "
    line += f"{100 * ar['bandwidth_bound_ms'] / ar['measured_ms']:.0f}% of the bound"
    for r in rows:
      if (r["model"], r["context"], r["sampling"]) == block and r["spec"].startswith("loopspec"):
        line += (
            f"; {r['method']} tick {r['measured_ms']:.3g} ms = {r['measured_ms'] / r['predicted_ms']:.2f}x the model's"
        )
    out.append(line)
  return out


def table(rows: list) -> str:
  heads = ["model", "ctx", "sampling", "method", "tok/iter", "pred ms", "meas ms", "iter err", "pred x AR"]
  heads += ["meas x AR", "ratio err", "dominant term (mem/comp/vec/op ms)", "miss: term x factor closing it"]
  lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
  for r in rows:
    t = r["terms_ms"]
    cells = [r["model"], str(r["context"]), r["sampling"], r["method"], f"{r['tokens_per_iteration']:.2f}"]
    cells += [f"{r['predicted_ms']:.3g}", f"{r['measured_ms']:.3g}", f"{100 * r['iteration_error']:+.0f}%"]
    cells += [f"{r['predicted_ratio']:.2f}", f"{r['measured_ratio']:.2f}", f"{100 * r['ratio_error']:+.0f}%"]
    split = "/".join(f"{t.get(f'{k}_ms', 0.0):.3g}" for k in TERMS)
    cells += [f"{which_term(r)} ({split})", _wrong_cell(r)]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def summary(rows: list) -> dict:
  """Median absolute errors (ratio over non-AR rows; iteration over all) and the rows past 25%."""
  spec_rows = [r for r in rows if r["spec"] != "ar"]
  ratio = [abs(r["ratio_error"]) for r in spec_rows]
  it = [abs(r["iteration_error"]) for r in rows]
  return {
      "median_abs_ratio_error": statistics.median(ratio) if ratio else None,
      "median_abs_iteration_error": statistics.median(it) if it else None,
      "rows": len(rows),
      "ratio_rows_over_25pct": [
          f"{r['model']} {r['context']} {r['sampling']} {r['method']}"
          for r in spec_rows
          if abs(r["ratio_error"]) > 0.25
      ],
  }


def out_dir_for(c) -> str:
  if c.out_dir:
    return c.out_dir
  host = platform.node() or "host"
  return os.path.join(c.out_root, f"{host}-{datetime.date.today().isoformat()}")


def readme(c, summ: dict, hws: dict, seconds: float, rows: list = ()) -> str:
  cmd = " ".join(["loopspec-cost-report"] + [a for a in sys.argv[1:]])
  lines = [
      "# Cost-model calibration on this host",
      "",
      f"- host: {common.machine_description()}",
      f"- date: {datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M UTC')}",
      f"- command: `{cmd}` ({seconds:.0f} s)",
      f"- models {c.models}, new tokens {c.new_tokens}, repeats {c.repeats} (interleaved with the host's"
      f" microbenchmarks; statistic {c.get('stat', 'median')}; clock {c.get('clock', 'wall')}), model {c.mode}",
      f"- median |ratio error| {_pct(summ['median_abs_ratio_error'])}, median |iteration error| "
      f"{_pct(summ['median_abs_iteration_error'])} over {summ['rows']} rows",
      f"- ratio rows past 25%: {', '.join(summ['ratio_rows_over_25pct']) or 'none'}",
      "",
      "Measured host terms per model (B/s at working-set bytes; FLOP/s at rows M; s per op):",
      "",
  ]
  for label, hw in hws.items():
    bw = ", ".join(f"{s / 1e6:.3g} MB: {b / 1e9:.3g} GB/s" for s, b in hw.bandwidth_at_bytes)
    pm = ", ".join(f"M={m}: {f / 1e9:.3g}" for m, f in hw.flops_at_rows)
    lines.append(
        f"- {label}: bandwidth {bw}; GFLOP/s {pm}; transcendentals {hw.transcendental_rate / 1e9:.3g} G/s; "
        f"per-op {hw.op_overhead_s * 1e9:.0f} ns; "
        f"{len(hw.dot_seconds)} product shapes timed (calibration.json `host`)"
    )
  lines += ["", "Rooflines (AR >= 80% of the bandwidth bound; a LoopSpec tick within 1.5x of the model's time):", ""]
  lines += roofline_notes(rows)
  lines += ["", "Table: calibration.md; rows: calibration.json."]
  return "\n".join(lines) + "\n"


def _pct(x):
  return "n/a" if x is None else f"{100 * x:.1f}%"


def write(c, rows: list, hws: dict, seconds: float, partial: bool) -> dict:
  """Writes calibration.json / .md and README.md to the run's directory (again after every block)."""
  summ = summary(rows)
  out = out_dir_for(c)
  payload = {"config": c.to_dict(), "host": {k: h.as_dict() for k, h in hws.items()}, "summary": summ, "rows": rows}
  payload["partial"] = partial
  md = (
      table(rows)
      + f"\n\nmedian |ratio error| {_pct(summ['median_abs_ratio_error'])}"
      + (" (partial)" if partial else "")
  )
  common.write_report(out, "calibration", payload, md)
  common.atomic_write_text(os.path.join(out, "README.md"), readme(c, summ, hws, seconds, rows))
  return payload


def run_calibration(c) -> dict:
  """Runs the grid of config c (see module docstring); returns the payload it writes."""
  t0 = time.perf_counter()
  calibrate.set_clock(c.get("clock", "wall"))
  rows, hws = [], {}
  for label in common.split_list(c.models):
    s = c.model_settings[label]
    model = common.resolve_model(s.spec)
    for ctx in list(s.contexts):
      for mode in common.split_list(s.get("sampling", c.sampling)):
        block, hws[f"{label} {ctx} {mode}"] = rows_for(model, label, ctx, mode == "greedy", c)
        rows += block
        print(f"[{time.perf_counter() - t0:.0f}s] {label} ctx {ctx} {mode} done", flush=True)
        write(c, rows, hws, time.perf_counter() - t0, partial=True)
    common.release_compiled()
  calibrate.set_clock("wall")
  payload = write(c, rows, hws, time.perf_counter() - t0, partial=False)
  print(table(rows) + f"\n\nmedian |ratio error| {_pct(payload['summary']['median_abs_ratio_error'])}")
  return payload


def combine(parts: list, out: str) -> dict:
  """One table of several runs' rows (their calibration.json, in order) into `out`/calibration.{json,md}:
  runs of one grid made as separate commands (e.g. a larger model at fewer new tokens). Each run's own
  README stays beside its rows; the payload lists the parts."""
  rows, hosts, configs = [], {}, {}
  for p in parts:
    with open(os.path.join(p, "calibration.json")) as f:
      d = json.load(f)
    rows += d["rows"]
    hosts.update(d["host"])
    configs[p] = d["config"]
  summ = summary(rows)
  payload = {"parts": list(parts), "config": configs, "host": hosts, "summary": summ, "rows": rows}
  md = (
      table(rows) + f"\n\nmedian |ratio error| {_pct(summ['median_abs_ratio_error'])} over {len(rows)} rows; past 25%: "
  )
  md += ", ".join(summ["ratio_rows_over_25pct"]) or "none"
  common.write_report(out, "calibration", payload, md)
  return payload
