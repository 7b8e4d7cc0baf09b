"""Every decode loop compiled for a TPU without a TPU: memory, KV copies in loops and two cost estimates.

For each (model, method, target, mesh, batch, context) the decoder's loop is compiled from abstract values
for a TPU topology (`loopspec_jax.analysis.aot`, libtpu from the `[tpu]` extra) and one JSON row is appended
to <out_dir>/rows.jsonl: the TPU compiler's memory analysis (and whether it fits one chip's HBM; a program
over HBM is refused by the compiler, which names its temporaries), the KV copies inside while bodies, XLA's
cost_analysis (flops, bytes, optimal_seconds: the whole program, one loop iteration and what is outside the
loop) beside the repository's HLO parser on the same TPU HLO (one iteration of the outer loop), and the ideal
bytes of one AR token (`cost.ar_token_bytes`). Rows already in the file are skipped, so a run resumes.

  loopspec-aot
  loopspec-aot --config.models=huginn:0125 --config.methods="ar;loopspec:d1=2,d2=8" --config.targets=tpu:v5p

Settings: configs/aot.py.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import multiprocessing
import os
import signal
import sys
import time
import types

from absl import flags
import jax
from ml_collections import config_flags

from loopspec_jax.analysis import aot, cost, micro
from loopspec_jax.parallel import sharding
from loopspec_configs import models as model_configs
from loopspec_experiments import common

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file("config", common.config_path("aot.py"), "AOT settings.", flag_values=FLAGS)
KEY = ("model", "method", "target", "mesh", "batch", "context")


def depths(cfg) -> dict:
  """LoopSpec / chain draft depths of a model: (2, 8) at R = 32 (the paper's Huginn setting), else R/16, R/4."""
  r = cfg.recurrence
  return {"d1": 2, "d2": 8} if r >= 32 else {"d1": max(1, r // 16), "d2": max(2, r // 4)}


def parser_row(r: aot.AotLoop, cfg, batch: int, context: int) -> dict:
  """The HLO parser on the TPU HLO (one iteration of the outer loop) and the ideal AR token."""
  ideal = cost.ar_token_bytes(cfg, context, batch)
  row = {"ideal_bytes": ideal["weights"] + ideal["kv"]}
  if r.compiled:
    step = cost.analyze_hlo(r.hlo, r.kv_dims, r.slot_bytes)
    row.update(parser_bytes=step.total_bytes, parser_flops=step.flops, parser_bytes_by_category=dict(step.bytes))
  return row


def hlo_path(hlo_dir: str, key: tuple) -> str:
  return os.path.join(hlo_dir, "_".join(str(k) for k in key).replace(":", "-").replace(",", "-") + ".hlo.gz")


def parse_overrides(text: str) -> dict:
  """'n_core=2,recurrence=4' -> {'n_core': 2, 'recurrence': 4}: integer ModelConfig fields."""
  out = {}
  for item in common.split_list(text):
    name, _, value = item.partition("=")
    if not value.strip().lstrip("-").isdigit():
      raise ValueError(f"--config.overrides: {item!r} is not <field>=<integer>")
    out[name.strip()] = int(value)
  return out


def row_config(spec: str, dtype: str, context: int, overrides=None):
  """The ModelConfig a row compiles: the model with `overrides` (ModelConfig fields), dtype and context."""
  return model_configs.model_config(spec, **(overrides or {})).replace(dtype=dtype, max_len=context)


# A row's figures (None where the compiler refused it): the compiler's memory per device, the KV copies in while
# bodies, XLA's cost_analysis (row field: its key), the parser on the TPU HLO and the ideal AR token.
MEMORY_FIELDS = ("argument_bytes", "temp_bytes", "output_bytes", "alias_bytes", "hbm_bytes", "fits")
XLA_FIELDS = {"xla_bytes": "bytes accessed", "xla_flops": "flops", "xla_optimal_seconds": "optimal_seconds"}
ROW_FIELDS = (*MEMORY_FIELDS, "loop_copies", *XLA_FIELDS, "parser_bytes", "parser_flops", "ideal_bytes")


def measure(
    spec: str, method: str, target: str, mesh: tuple, batch: int, context: int, dtype: str, hlo_dir=None, overrides=None
):
  """One row; with hlo_dir, the TPU HLO is kept there (gzip) for `reparse`. `overrides`: ModelConfig fields
  set on the model (a reduced depth that compiles in seconds at the real widths), recorded in the row."""
  cfg = row_config(spec, dtype, context, overrides)
  r = aot.compile_loop(cfg, method, target, mesh, batch=batch)
  row = {
      "model": spec,
      "method": method,
      "target": r.target,
      "mesh": "x".join(map(str, mesh)),
      "batch": batch,
      "context": context,
      "compiled": r.compiled,
      "error": r.error,
      "compile_seconds": r.compile_seconds,
      **dict.fromkeys(ROW_FIELDS),
      **{k: r.memory.get(k) for k in MEMORY_FIELDS},
      "loop_copies": r.loop_copies,
      **{k: r.xla_cost.get(name) for k, name in XLA_FIELDS.items()},
      "overrides": overrides or {},
      "host": common.machine_description(),
      "jax": jax.__version__,
  }
  row.update(parser_row(r, cfg, batch, context))
  if hlo_dir and r.compiled:
    os.makedirs(hlo_dir, exist_ok=True)
    with gzip.open(hlo_path(hlo_dir, tuple(row[k] for k in KEY)), "wt") as fh:
      fh.write(r.hlo)
  return row


def _send_result(conn, fn, args):
  """The child of `measure_apart`: `fn(*args)`, or the exception it raised, sent to the parent."""
  try:
    result = ("returned", fn(*args))
  except Exception as e:  # noqa: BLE001 - re-raised in the parent
    result = ("raised", e)
  conn.send(result)
  conn.close()


def measure_apart(key: tuple, args: tuple, fn=measure) -> dict:
  """`fn(*args)` in a fresh process, so that no row's compile leaves memory behind in the next (a process that
  compiled 8 real-size rows in turn held 14.1 GB, `jax.clear_caches` between rows or not) and a compile the
  kernel kills costs its own row only: that row is recorded as not compiled, with the reason. However this
  process ends (an exception, SIGTERM: `main` turns it into SystemExit), the child is killed with it: no
  compile is left running orphaned."""
  context = multiprocessing.get_context("spawn")
  start = time.perf_counter()
  receive, send = context.Pipe(duplex=False)
  child = context.Process(target=_send_result, args=(send, fn, args), daemon=True)
  child.start()
  send.close()
  try:
    status, value = receive.recv()
  except EOFError:  # the child died before it sent anything
    child.join()
    error = f"the compiling process died (exit code {child.exitcode}): killed, e.g. out of host memory"
  else:
    if status == "raised":
      raise value
    return value
  finally:
    receive.close()
    if child.is_alive():
      child.kill()
    child.join()
  row = dict(zip(KEY, key), compiled=False, error=error, compile_seconds=time.perf_counter() - start)
  return {**row, **dict.fromkeys(ROW_FIELDS)}


def reparse(path: str, hlo_dir: str, dtype: str):
  """Recomputes the parser's fields of every row whose HLO was kept in hlo_dir (after a parser change), and
  the memory of refused rows from their message (`aot.refused_memory`)."""
  rows = read_rows(path)
  for row in rows:
    src = hlo_path(hlo_dir, tuple(row[k] for k in KEY))
    mesh = tuple(int(x) for x in row["mesh"].split("x"))
    cfg = row_config(row["model"], dtype, row["context"], row.get("overrides"))
    target = aot.parse_target(row["target"])
    cfg = sharding.padded_config(cfg, aot.target_mesh(target, mesh))  # as compile_loop
    loop = cost.abstract_loop(cfg, row["method"], batch=row["batch"], **aot.stand_in_arguments(cfg, row["method"]))
    if not row["compiled"] and row["error"]:
      floor = aot.argument_floor(aot.loop_program(loop, target, mesh).arrays)
      mem = aot.refused_memory(row["error"], floor)
      row.update({k: mem[k] for k in ("hbm_bytes", "argument_bytes", "temp_bytes")})
    if not row["compiled"] or not os.path.exists(src):
      continue
    with gzip.open(src, "rt") as fh:
      hlo = fh.read()
    slot = cost.slot_bytes(cfg, row["batch"], loop.total_len)
    step = cost.analyze_hlo(hlo, cost.kv_leaf_dims(loop.state), slot)
    row.update(parser_bytes=step.total_bytes, parser_flops=step.flops, parser_bytes_by_category=dict(step.bytes))
    row["loop_copies"] = aot.loop_copies(hlo, aot.slot_elements(cost.kv_leaf_dims(loop.state), mesh), loop.total_len)
  common.atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def grid_key(spec: str, method: str, target: str, mesh: tuple, batch: int, context: int) -> tuple:
  """A row of `grid` as its rows.jsonl key (`KEY`): the target's full name, the mesh as DATAxMODEL."""
  return (spec, method, aot.parse_target(target).name, "x".join(map(str, mesh)), batch, context)


GRID_FIELDS = ("models", "methods", "other_methods", "targets", "meshes", "batches", "contexts")


def grid(f) -> list:
  """(model, method spec, target, mesh, batch, context) of every row asked for: the product of f's lists, or
  with `f.grids` the union (in order, each row once) of the products of f with each grid's fields replaced."""
  if f.grids:
    out = []
    for g in f.grids:
      unknown = set(g) - set(GRID_FIELDS)
      if unknown:
        raise ValueError(f"--config.grids: unknown fields {sorted(unknown)} (known: {', '.join(GRID_FIELDS)})")
      one = {k: g.get(k, f[k]) for k in GRID_FIELDS}
      out += [row for row in grid(types.SimpleNamespace(grids=(), **one)) if row not in out]
    return out
  out = []
  for i, spec in enumerate(common.split_list(f.models)):
    d = depths(model_configs.model_config(spec))
    specs = [m.strip().format(**d) for m in (f.methods if i == 0 else f.other_methods).split(";") if m.strip()]
    for method in specs:
      for target in common.split_list(f.targets):
        for mesh in common.split_list(f.meshes):
          for batch in common.split_list(f.batches):
            for context in common.split_list(f.contexts):
              out.append((spec, method, target, tuple(int(x) for x in mesh.split("x")), int(batch), int(context)))
  return out


def done_keys(path: str) -> set:
  if not os.path.exists(path):
    return set()
  with open(path) as fh:
    rows = [json.loads(line) for line in fh if line.strip()]
  return {tuple(r[k] for k in KEY) for r in rows}


gb, md_table = common.gb, common.md_table
FITS = {True: "yes", False: "**no**", None: "-"}  # a row's `fits` in the memory tables


def row_key_cells(r: dict) -> list:
  return [r["model"], r["method"], r["target"], r["mesh"], r["batch"], r["context"]]


def markdown(rows: list) -> str:
  """One line per row: fits, HBM and temporaries (GB), KV copies in loops, parser vs XLA bytes / flops."""
  lines = []
  for r in rows:
    fits = {True: "yes", False: "no", None: "-"}[r["fits"]]
    ratio = f"{r['xla_bytes'] / r['parser_bytes']:.2f}" if r["parser_bytes"] and r["xla_bytes"] else "-"
    ms = "-" if r["xla_optimal_seconds"] is None else f"{1e3 * r['xla_optimal_seconds']:.1f}"
    copies = "-" if r["loop_copies"] is None else r["loop_copies"]
    cells = row_key_cells(r) + [fits, gb(r["hbm_bytes"]), gb(r["temp_bytes"]), copies, gb(r["parser_bytes"])]
    cells += [gb(r["xla_bytes"]), ratio, gb(r["parser_flops"]), gb(r["xla_flops"]), ms, gb(r["ideal_bytes"])]
    lines.append(cells)
  header = (
      "model | method | target | mesh | batch | context | fits | HBM GB | temp GB | loop copies | parser GB |"
      " XLA GB | XLA / parser | parser GFLOP | XLA GFLOP | XLA ms | ideal AR GB"
  )
  return md_table(header, lines)


def memory_markdown(rows: list, extra: str = "") -> str:
  """The compiler's memory per device, one line per row (GB = 1e9 bytes): arguments, temporaries, HBM (their
  sum with outputs not aliased to arguments and the code), the chip's HBM, fits, KV copies in loops, and the
  row's field `extra` as a last column where given. A refused row's HBM is the figure the compiler names; its
  temporaries that figure less the logical arguments. A row refused before compiling (`aot.over_hbm`) shows
  its arguments as the floor they are (`≥`) and no HBM."""
  lines = []
  for r in rows:
    fits = FITS[r["fits"]]
    hbm = gb(r["hbm_bytes"]) + ("" if r["compiled"] else " (refused)")
    args = gb(r["argument_bytes"])
    if (r.get("error") or "").startswith(aot.NOT_COMPILED):  # refused before compiling: arguments over HBM
      hbm, args = "- (arguments over HBM, not compiled)", f"≥ {args}"
    copies = "-" if r.get("loop_copies") is None else r["loop_copies"]  # rows of tpu_costs have none
    chip = aot.parse_target(r["target"]).hbm_bytes
    cells = row_key_cells(r) + [args, gb(r["temp_bytes"]), hbm, gb(chip), fits, copies]
    lines.append(cells + ([r[extra]] if extra else []))
  header = (
      "model | method | target | mesh | batch | context | arguments GB | temporaries GB | HBM GB | chip GB | fits"
      " | KV copies in loops" + (f" | {extra}" if extra else "")
  )
  return md_table(header, lines)


def methods_markdown(rows: list) -> str:
  """Issue 43's first table, its memory columns, for every method of every model (batch 1, context 2048, one
  chip): one v5e chip's HBM (the figure the compiler refused where it did) and one v5p chip's arguments /
  temporaries where that row exists, and the KV copies in the compiled loops (the most of the two). The two
  cost estimates of each loop come from its kept HLO, read by one parser (`loopspec_experiments.tpu_costs`,
  compare.md): the rows' own parser fields are of the parser of the day each row was compiled."""
  chips = {}
  for r in rows:
    if r["target"].startswith("tpu:") and (r["mesh"], r["batch"], r["context"]) == ("1x1", 1, 2048):
      chips.setdefault((r["model"], r["method"]), {})[r["target"].split(":")[1]] = r
  order = lambda key: (key[0], method_order(key[0], key[1]))
  lines = []
  for model, method in sorted((k for k, v in chips.items() if "v5e" in v), key=order):
    v5e, v5p = chips[(model, method)]["v5e"], chips[(model, method)].get("v5p")
    cells = [model, method, gb(v5e["hbm_bytes"]) + ("" if v5e["compiled"] else " (refused)"), FITS[v5e["fits"]]]
    if v5p is None:
      cells += ["-"] * 3
    else:
      cells += [gb(v5p["argument_bytes"]), gb(v5p["temp_bytes"]), FITS[v5p["fits"]]]
    copies = [r["loop_copies"] for r in (v5e, v5p) if r is not None and r.get("loop_copies") is not None]
    lines.append(cells + [max(copies) if copies else "-"])
  header = (
      "model | method | one v5e chip: HBM GB | fits | one v5p chip: arguments GB | temporaries GB | fits"
      " | KV copies in loops"
  )
  return md_table(header, lines)


def method_order(model: str, method: str) -> tuple:
  """A method's place in `aot.method_specs` at the model's draft depths (after them where it is not one)."""
  specs = aot.method_specs(**depths(model_configs.model_config(model)))
  return (specs.index(method), method) if method in specs else (len(specs), method)


def micro_programs(target: str = "tpu:v5e", e: int = 5280, f: int = 17920) -> list:
  """Programs of known traffic, compiled for the target: one bf16 [1, e] x [e, f] matvec (reads the weight,
  e f 2 bytes, once; 2 e f flops), a while loop of 10 iterations of it, and of 10 iterations of two. Each
  row: XLA's cost_analysis and the parser's one iteration beside the known figures."""

  def looped(n):
    body = lambda c: (c[0] + 1, functools.reduce(lambda y, _: (y @ c[2])[:, :e], range(n), c[1]), c[2])
    return lambda x, w: jax.lax.while_loop(lambda c: c[0] < 10, body, (0, x, w))[1]

  rows = []
  for name, fn, n in (
      ("one matvec", lambda x, w: x @ w, 1),
      ("loop: 10 x 1", looped(1), 1),
      ("loop: 10 x 2", looped(2), 2),
  ):
    c = micro.compile_program(fn, ((1, e), (e, f)), target)
    ca = aot.xla_cost_row(c)
    step = cost.analyze_hlo(c.as_text()) if n and "while" in c.as_text() and name != "one matvec" else None
    rows.append(
        {
            "program": name,
            "known_bytes_per_iteration": n * e * f * 2.0,
            "known_flops_per_iteration": n * 2.0 * e * f,
            "xla_bytes": ca.get("bytes accessed"),
            "xla_flops": ca.get("flops"),
            "xla_optimal_seconds": ca.get("optimal_seconds"),
            "parser_bytes": step.total_bytes if step else None,
            "parser_flops": step.flops if step else None,
        }
    )
  return rows


def read_rows(path: str) -> list:
  with open(path) as fh:
    return [json.loads(line) for line in fh if line.strip()]


def _exit_on_sigterm(signum, frame):
  del frame
  sys.exit(128 + signum)  # SystemExit unwinds `measure_apart`, which kills its compiling child


def main(argv):
  del argv
  f = _CONFIG.value
  signal.signal(signal.SIGTERM, _exit_on_sigterm)
  reason = next(filter(None, (aot.unavailable(aot.parse_target(t)) for t in common.split_list(f.targets))), None)
  if reason:
    raise SystemExit(f"loopspec-aot: {reason}")
  path = os.path.join(f.out_dir, "rows.jsonl")
  os.makedirs(f.out_dir, exist_ok=True)
  if f.micro:
    rows = micro_programs(common.split_list(f.targets)[0])
    common.atomic_write_text(os.path.join(f.out_dir, "micro.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    return print("\n".join(json.dumps(r) for r in rows))
  if f.reparse:
    reparse(path, f.hlo_dir, f.dtype)
    return write_table(f.out_dir, path)
  if f.merge:
    return write_merged(f.out_dir, common.split_list(f.merge), grid(f))
  done = done_keys(path)
  for spec, method, target, mesh, batch, context in grid(f):
    key = grid_key(spec, method, target, mesh, batch, context)
    if key in done:
      continue
    args = (spec, method, target, mesh, batch, context, f.dtype, f.hlo_dir, parse_overrides(f.overrides))
    row = measure_apart(key, args) if f.isolate else measure(*args)
    with open(path, "a") as fh:
      fh.write(json.dumps(row) + "\n")
    print(
        f"{spec} {method} {key[2]} {key[3]} b{batch} ctx{context}: compiled={row['compiled']} fits={row['fits']} "
        f"temp={gb(row.get('temp_bytes'))} GB copies={row['loop_copies']} parser={gb(row.get('parser_bytes'))} "
        f"xla={gb(row.get('xla_bytes'))} GB "
        f"({row['compile_seconds']:.0f} s)",
        flush=True,
    )
  write_table(f.out_dir, path)


def write_table(out_dir: str, path: str):
  """table.md (every field) and memory.md (the compiler's memory: docs/scaling.md quotes it) of rows.jsonl."""
  rows = read_rows(path)
  text = markdown(rows)
  print(text)
  common.atomic_write_text(os.path.join(out_dir, "table.md"), text + "\n")
  common.atomic_write_text(os.path.join(out_dir, "memory.md"), memory_markdown(rows) + "\n")


def merged_rows(folders: list) -> list:
  """Each grid key once, from the first of `folders` (newest first) whose rows.jsonl has it (within a folder its
  last row: rows are appended, so a later one is a rerun, e.g. a folder's before / after); each row with the
  folder it came from (`from`)."""
  seen, out = set(), []
  for folder in folders:
    latest = {tuple(r[k] for k in KEY): r for r in read_rows(os.path.join(folder, "rows.jsonl"))}
    for key, r in latest.items():
      if key not in seen:
        seen.add(key)
        out.append({**r, "from": os.path.basename(os.path.normpath(folder))})
  return out


def missing_markdown(missing: list) -> str:
  """The rows asked that no folder has, one line per (target, mesh, batch, context): each model's methods."""
  groups = {}
  for model, method, *where in missing:
    groups.setdefault(tuple(where), {}).setdefault(model, []).append(method)
  lines = [
      [*where, "; ".join(f"{m}: {', '.join(methods)}" for m, methods in by_model.items())]
      for where, by_model in groups.items()
  ]
  return md_table("target | mesh | batch | context | not compiled (model: methods)", lines)


def write_merged(out_dir: str, folders: list, asked: list):
  """merged.md: the compiler's memory of every row of `folders` (each key from the newest folder that has it,
  the folder named per row), and the rows of the configured grid that no folder has, grouped (one per line in
  not_compiled.md); merged.jsonl: the rows (for `loopspec-plan-memory --config.aot_rows=`); methods.md: the
  issue's table of every method (`methods_markdown`)."""
  rows = sorted(merged_rows(folders), key=lambda r: (r["model"], r["target"], r["mesh"], r["batch"], r["context"]))
  have = {tuple(r[k] for k in KEY) for r in rows}
  missing = [list(key) for key in itertools.starmap(grid_key, asked) if key not in have]
  text = memory_markdown(rows, extra="from") + "\n"
  if missing:
    text += f"\nNot compiled: {len(missing)} of the {len(asked)} rows asked (each in not_compiled.md):\n\n"
    text += missing_markdown(missing) + "\n"
  print(text)
  common.atomic_write_text(os.path.join(out_dir, "merged.md"), text)
  common.atomic_write_text(os.path.join(out_dir, "methods.md"), methods_markdown(rows) + "\n")
  listing = md_table("model | method | target | mesh | batch | context", missing) + "\n" if missing else ""
  common.atomic_write_text(os.path.join(out_dir, "not_compiled.md"), listing)
  common.atomic_write_text(os.path.join(out_dir, "merged.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
