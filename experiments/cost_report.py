"""Cost report: ops, flops and HBM traffic of one AR token / chain round / LoopSpec tick, and a roofline
projection of tokens/s on named accelerators, for real-size models compiled from abstract shapes.

Nothing is allocated: each decoder's jitted loop is compiled from `jax.ShapeDtypeStruct`s and its optimised
HLO read by `loopspec_jax.analysis.cost` (see there for what is counted). Prints one table and writes the
rows as JSON.

  python -m loopspec_experiments.cost_report
  python -m loopspec_experiments.cost_report --config.models=tiny_raven,tiny_ouro
  loopspec-cost-report --config=cost/calibrate.py   # predicted vs measured on this host (cost_calibration.py)
  loopspec-cost-report --config=cost/sensitivity.py # projection vs per-op overhead (cost_sensitivity.py)
  loopspec-cost-report --config=cost/default.py:heads   # a head's draft cost beside a d1 readout's (cost_heads.py)
"""

from __future__ import annotations

import json
import time

from absl import flags
from absl import logging
from ml_collections import config_flags

from loopspec_jax.analysis import cost
from loopspec_jax.config import ModelConfig
from loopspec_configs import accelerators as accel_configs
from loopspec_jax import methods as methods_lib
from loopspec_experiments import common
from loopspec_experiments import cost_calibration
from loopspec_experiments import cost_heads
from loopspec_experiments import cost_sensitivity

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("cost/default.py"), "Cost report settings.", flag_values=FLAGS
)

GB = 1e9


def method_kwargs(name: str, kw: dict) -> dict:
  """The decoder's make_decoder arguments (LoopSpec: d2 and lane_capacity default to None)."""
  kw = dict(kw)
  if name == "loopspec":
    kw.setdefault("d2", None)
    kw.setdefault("lane_capacity", None)
  return kw


def measure(cfg: ModelConfig, method, c) -> dict:
  """Compiles and analyses one method (a `Method`); returns its row (without projections)."""
  name, kw = method.name, method.args
  compiled = cost.compile_decode_loop(cfg, name, batch=c.batch, greedy=c.greedy, **method_kwargs(name, kw))
  t0 = time.perf_counter()
  step = cost.loop_cost(compiled, branch=c.branch)
  row = {
      "method": method.label,
      "name": name,
      "kw": kw,
      "compile_seconds": compiled.compile_seconds,
      "analyze_seconds": time.perf_counter() - t0,
      "cache_positions": compiled.total_len,
      **step.as_dict(),
      "top_items": [list(x) for x in step.top_items(12)],
  }
  if name == "loopspec":
    lanes = cost.live_lanes(cfg.recurrence, kw["d1"])
    lane_bytes = cost.lane_kv_bytes(cfg, kw["d1"], compiled.total_len, c.batch)
    row.update(live_lanes=lanes, lane_kv_bytes=lane_bytes, kv_ratio=step.bytes["kv"] / (lanes * lane_bytes))
  return row, step


def measured_taus(settings) -> list:
  """[(Method, tau)]: the tokens per verify pass measured for methods of this model's settings, read from the
  rows of `tau_results` (a JSON list of {task, sampling, method spec, tau}, e.g. results/trees/*/results.json)
  of task `tau_task` and sampling `tau_sampling`; none when the settings name no file."""
  path = settings.get("tau_results") or ""
  if not path:
    return []
  with open(path) as f:
    rows = json.load(f)
  task, samp = settings.get("tau_task", "gsm8k"), settings.get("tau_sampling", "greedy")
  return [(methods_lib.parse(r["method"]), r["tau"]) for r in rows if (r["task"], r["sampling"]) == (task, samp)]


def _tau_of(method, taus: list):
  """The measured tau of `method` (chain with branch > 1 is the tree it delegates to), or None."""
  tree = method.as_tree() if isinstance(method, methods_lib.Chain) else None
  for m, tau in taus:
    if m == method or (tree is not None and m == tree):
      return tau
  return None


def model_rows(label: str, settings, context: int, c, accels: dict) -> list:
  """Rows of every method of one model at one context, with projections and ratios against the first (AR).
  Tree methods (one verify pass per iteration) are projected at their measured tau (`measured_taus`)."""
  cfg = common.model_config_at(settings.spec, c.dtype, context)
  taus = measured_taus(settings)
  rows = []
  for spec in settings.methods:
    method = methods_lib.parse(spec)
    name, kw = method.name, method.args
    try:
      row, step = measure(cfg, method, c)
    except Exception as e:  # pylint: disable=broad-except
      if not rows:
        raise
      logging.error("%s %s failed to compile or analyse: %r", label, spec, e)
      rows.append({"model": label, "context": context, "method": method.label, "name": name, "error": repr(e)})
      continue
    tau = _tau_of(method, taus) if name != "ar" else None
    per_iter = cost.tokens_per_iteration(name, cfg, settings.gamma, kw, tau)
    row.update(
        model=label,
        context=context,
        gamma=settings.gamma,
        tau_measured=tau,
        tokens_per_iteration=per_iter,
        tokens_per_second=cost.project(step, per_iter, accels, c.op_overhead_s, c.batch),
    )
    rows.append(row)
  ref = rows[0]["tokens_per_second"]
  for row in rows:
    if "error" in row:
      continue
    row["ratio_vs_ar"] = {a: row["tokens_per_second"][a] / ref[a] for a in accels}
  return rows


def _num(x: float) -> str:
  """Three significant digits, without exponents for ordinary magnitudes."""
  return f"{x:.3g}" if x < 1e6 else f"{x:.3e}"


def format_table(rows: list, accels: dict, ratio_acc: str) -> str:
  """The markdown table of the report plus one LoopSpec check line per LoopSpec row."""
  heads = ["model", "ctx", "method", "ops", "GFLOP", "GB weights", "GB KV", "GB copies", "GB other", "tok/iter"]
  heads += [f"tok/s {accels[a]['label']}" for a in accels] + [f"x AR ({accels[ratio_acc]['label']})"]
  lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
  checks = []
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['model']} | {r['context']} | {r['method']} | failed: {r['error'][:100]} |")
      continue
    b = r["bytes"]
    cells = [r["model"], str(r["context"]), r["method"], f"{r['ops']:.0f}", _num(r["flops"] / GB)]
    cells += [_num(b[k] / GB) for k in ("weights", "kv", "copies", "other")]
    cells += [f"{r['tokens_per_iteration']:.2f}" + ("*" if r.get("tau_measured") is not None else "")]
    cells += [_num(r["tokens_per_second"][a]) for a in accels] + [f"{r['ratio_vs_ar'][ratio_acc]:.2f}"]
    lines.append("| " + " | ".join(cells) + " |")
    if r["name"] == "loopspec":
      checks.append(
          f"{r['model']} ctx {r['context']} {r['method']}: {r['loop_carried_copies']:.0f} loop-carried copies, "
          f"{r['cache_sized_copies']:.0f} cache-sized copies per tick; KV traffic / (live lanes {r['live_lanes']} x "
          f"{_num(r['lane_kv_bytes'] / GB)} GB per lane) = {r['kv_ratio']:.2f}; "
          f"tokens/tick {r['tokens_per_iteration']:.3f} at gamma {r['gamma']}"
      )
    elif r.get("tau_measured") is not None or r["name"] == "tree" or r["kw"].get("branch", 1) > 1:  # a tree
      src = f"tau {r['tau_measured']:.2f} measured" if r.get("tau_measured") is not None else "chain's bound"
      checks.append(
          f"{r['model']} ctx {r['context']} {r['method']}: {r['loop_carried_copies']:.0f} loop-carried copies, "
          f"{r['cache_sized_copies']:.0f} cache-sized copies per verify pass; tokens/pass "
          f"{r['tokens_per_iteration']:.2f} ({src})"
      )
  if any(r.get("tau_measured") is not None for r in rows):
    checks.append("tok/iter *: a measured tau (tokens per verify pass, the settings' tau_results)")
  return "\n".join(lines + [""] + checks)


def main(argv):
  del argv
  c = _CONFIG.value
  if c.get("calibrate", False):
    cost_calibration.run_calibration(c)
    return
  if c.get("sensitivity", False):
    cost_sensitivity.run_sensitivity(c)
    return
  if c.get("draft_costs", False):  # the `:heads` preset: draft programs alone (cost_heads.py)
    cost_heads.run_draft_costs(c)
    return
  accels = accel_configs.get_config(c.accelerators).to_dict()
  t0 = time.perf_counter()
  rows = []
  for label in [m.strip() for m in c.models.split(",") if m.strip()]:
    settings = c.model_settings[label]
    for context in list(settings.contexts) or list(c.contexts):
      rows += model_rows(label, settings, context, c, accels)
      print(f"[{time.perf_counter() - t0:.0f}s] {label} ctx {context} done", flush=True)
  seconds = time.perf_counter() - t0
  header = (
      f"dtype {c.dtype}, batch {c.batch}, {'greedy' if c.greedy else 'sampled'}; traffic from the optimised "
      f"HLO (CPU-compiled, storage dtype); roofline max(flops/peak, bytes/BW) + {c.op_overhead_s:g} s/op; "
      f"conditionals: {c.branch} branch"
  )
  print(header + "\n\n" + format_table(rows, accels, c.ratio_accelerator) + f"\n\nreport took {seconds:.0f} s")
  if c.out:
    common.atomic_write_json(c.out, {"config": c.to_dict(), "accelerators": accels, "seconds": seconds, "rows": rows})
    print(f"wrote {c.out}")


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
