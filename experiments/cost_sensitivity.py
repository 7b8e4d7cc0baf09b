"""How the accelerator projection depends on per-op overhead: LoopSpec against AR and chain at real sizes.

For each model, context and batch of `configs/cost/sensitivity.py` the decode loops (AR, chain, LoopSpec) are
compiled from abstract shapes and read once (`analysis/cost.py`: per kernel its bytes and its products' flops,
and the kernel count); each is stored in <out_dir>/sensitivity_costs.json (a rerun only compiles what is
missing). Each accelerator of configs/accelerators.py is then a `hardware.Hardware` from its public figures with
per-op overhead 0, 1, 3 and 5 us, and

  tokens/s = batch x tokens per iteration (at the model's mean accepted length gamma) / step_seconds

gives LoopSpec / AR and LoopSpec / chain. The table and the list of (context, batch, overhead) points where
LoopSpec stops beating AR or chain on each device are written to sensitivity.md / .json; the docs table
(docs/cost-projection.md) is generated from that file by `markdown()`, never retyped.

  loopspec-cost-report --config=cost/sensitivity.py
  loopspec-cost-report --config=cost/sensitivity.py:tiny    # the bundled models at 256 (seconds; the test)
"""

from __future__ import annotations

import json
import os
import time

from loopspec_jax import methods
from loopspec_jax.analysis import cost
from loopspec_jax.analysis import hardware
from loopspec_jax.analysis.hlo_cost import StepCost
from loopspec_configs import accelerators as accel_configs
from loopspec_jax.experiment import files
from loopspec_experiments import common


def compact(step: StepCost) -> dict:
  """What the projection needs of a StepCost: ops, flops, bytes and per kernel [bytes, {rows: flops}, KV bytes]."""
  kv = {}
  for (who, cat), b in step.items.items():
    if cat == "kv":
      kv[who] = kv.get(who, 0.0) + b
  return {
      "ops": step.ops,
      "flops": step.flops,
      "bytes": step.total_bytes,
      "kernels": {
          k: [v["bytes"], {str(m): f for m, f in v["flops"].items()}, kv.get(k, 0.0)] for k, v in step.kernels().items()
      },
  }


def scaled(d: dict, context_ratio: float, batch: int) -> dict:
  """A compact cost compiled at batch 1 carried to context x context_ratio and `batch` requests: a kernel that
  touches the KV cache (attention) scales its bytes and flops by context_ratio x batch; any other kernel reads
  its weights once and scales its other bytes and its products' rows and flops by batch; ops are unchanged."""
  out = {"ops": d["ops"], "flops": 0.0, "bytes": 0.0, "kernels": {}, "scaled": [context_ratio, batch]}
  for who, (nbytes, flops, kv) in d["kernels"].items():
    if kv > 0:
      f = {m: v * context_ratio * batch for m, v in flops.items()}
      b = nbytes * context_ratio * batch
    else:
      f = {str(int(m) * batch): v * batch for m, v in flops.items()}
      b = nbytes if flops else nbytes * batch  # a product kernel's bytes are its weights, read once per batch
    out["kernels"][who] = [b, f, kv * context_ratio * batch]
    out["flops"] += sum(f.values())
    out["bytes"] += b
  return out


def expand(d: dict) -> StepCost:
  """The StepCost a `compact` dict stands for (enough for `Hardware.step_seconds`)."""
  step = StepCost(ops=d["ops"], flops=d["flops"])
  for who, (nbytes, flops, *_) in d["kernels"].items():
    step.charge("other", nbytes, who)
    for m, f in flops.items():
      step.flop_items[(who, int(m))] = f
  return step


def loop_costs(c, path: str) -> dict:
  """{key: compact cost} for every model x method at the compiled points of c (`compile_points`: (context,
  batch) pairs), compiling only what `path` lacks; every other grid point is `scaled` from the first one."""
  data = json.load(open(path)) if os.path.exists(path) else {}
  t0 = time.perf_counter()
  for label in common.split_list(c.models):
    s = c.model_settings[label]
    for ctx, batch in c.compile_points:
      ctx = s.contexts[0] if s.get("contexts") else ctx
      cfg = common.model_config_at(s.spec, c.dtype, ctx)
      for spec in s.methods:
        key = f"{label}|{ctx}|{batch}|{spec}"
        if key in data:
          continue
        step = cost.loop_cost(cost.compile_decode_loop(cfg, spec, batch=batch, greedy=True))
        data[key] = compact(step)
        common.atomic_write_json(path, data)
        print(f"[{time.perf_counter() - t0:.0f}s] {key}: {step.ops:.0f} ops", flush=True)
  return data


def point_cost(c, data: dict, label: str, ctx: int, batch: int, spec: str):
  """The compact cost at a grid point: compiled if it was, else scaled from the first compiled point."""
  key = f"{label}|{ctx}|{batch}|{spec}"
  if key in data:
    return data[key], "compiled"
  s = c.model_settings[label]
  ctx0, b0 = c.compile_points[0]
  ctx0 = s.contexts[0] if s.get("contexts") else ctx0
  base = data.get(f"{label}|{ctx0}|{b0}|{spec}")
  if base is None or b0 != 1:
    return None, None
  return scaled(base, ctx / ctx0, batch), f"scaled from ctx {ctx0} batch 1"


def project(c, data: dict) -> list:
  """One row per model x context x batch x overhead x accelerator: tokens/s of each method and the ratios."""
  accels = accel_configs.get_config(c.accelerators).to_dict()
  rows = []
  for label in common.split_list(c.models):
    s = c.model_settings[label]
    for ctx in s.get("contexts", c.contexts):
      cfg = common.model_config_at(s.spec, c.dtype, ctx)
      for batch in c.batches:
        points = {spec: point_cost(c, data, label, ctx, batch, spec) for spec in s.methods}
        if any(p[0] is None for p in points.values()):
          continue  # not compiled yet (a partial run): the table says which points it has
        steps = {spec: expand(p[0]) for spec, p in points.items()}
        how = sorted({p[1] for p in points.values()})
        for over in c.overheads_us:
          for name, a in accels.items():
            hw = hardware.from_accelerator(name, a, op_overhead_s=over * 1e-6)
            tps = {}
            for spec, step in steps.items():
              m = methods.parse(spec)
              per = cost.tokens_per_iteration(m.name, cfg, s.gamma, m.args)
              tps[m.name] = batch * per / hw.step_seconds(step)
            rows.append(
                {
                    "model": label,
                    "context": ctx,
                    "batch": batch,
                    "overhead_us": over,
                    "accelerator": name,
                    "label": a["label"],
                    "tokens_per_s": tps,
                    "loopspec_vs_ar": tps["loopspec"] / tps["ar"],
                    "loopspec_vs_chain": tps["loopspec"] / tps["chain"],
                    "cost_from": ", ".join(how),
                }
            )
  return rows


def markdown(payload: dict) -> str:
  """The sensitivity table (LoopSpec / AR and LoopSpec / chain per device) and where LoopSpec stops winning."""
  rows = payload["rows"]
  accels = list(dict.fromkeys(r["accelerator"] for r in rows))
  labels = {r["accelerator"]: r["label"] for r in rows}
  heads = ["model", "ctx", "batch", "us/op"] + [f"{labels[a]} x AR / x chain" for a in accels]
  lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
  groups = {}
  for r in rows:
    groups.setdefault((r["model"], r["context"], r["batch"], r["overhead_us"]), {})[r["accelerator"]] = r
  for (model, ctx, batch, over), per in groups.items():
    first = next(iter(per.values()))
    cells = [model, str(ctx), str(batch) + ("*" if "scaled" in first["cost_from"] else ""), f"{over:g}"]
    cells += [f"{per[a]['loopspec_vs_ar']:.2f} / {per[a]['loopspec_vs_chain']:.2f}" for a in accels]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "Where LoopSpec stops beating AR / chain (ratio < 1):", ""]
  for a in accels:
    lose_ar = [r for r in rows if r["accelerator"] == a and r["loopspec_vs_ar"] < 1]
    lose_ch = [r for r in rows if r["accelerator"] == a and r["loopspec_vs_chain"] < 1]
    fmt = (
        lambda rs: ", ".join(f"{r['model']} ctx {r['context']} b{r['batch']} {r['overhead_us']:g}us" for r in rs)
        or "nowhere in the grid"
    )
    lines.append(f"- {labels[a]}: below AR at {fmt(lose_ar)}; below chain at {fmt(lose_ch)}")
  cfg = payload["config"]
  lines += [
      "",
      f"dtype {cfg['dtype']}, greedy loops compiled on CPU from abstract shapes; time per iteration = sum over "
      "kernels of max(bytes / HBM BW, flops / peak) + ops x overhead (`analysis/hardware.py`); tokens per "
      "iteration at each model's gamma ("
      + ", ".join(f"{k} {v['gamma']}" for k, v in cfg["model_settings"].items() if k in cfg["models"])
      + ").",
      "Per-op overhead sources: configs/accelerators.py. * : the loop's cost scaled from its compiled point "
      "(`cost_sensitivity.scaled`: attention bytes and flops x context x batch, products' rows x batch, weights "
      "read once, ops unchanged), not compiled at that shape.",
  ]
  return "\n".join(lines)


def run_sensitivity(c) -> dict:
  os.makedirs(c.out_dir, exist_ok=True)
  path = os.path.join(c.out_dir, "sensitivity_costs.json")
  data = json.load(open(path)) if c.get("table_only", False) and os.path.exists(path) else loop_costs(c, path)
  payload = {"config": c.to_dict(), "rows": project(c, data)}
  md = markdown(payload)
  common.write_report(c.out_dir, "sensitivity", payload, md)
  if c.docs:
    generated = f"Generated by `loopspec-cost-report --config=cost/sensitivity.py` from {c.out_dir}/sensitivity.json."
    files.replace_block(c.docs, "cost_sensitivity", generated + "\n\n" + md)
  print(md)
  return payload
