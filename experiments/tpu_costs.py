"""LoopSpec against AR and chain from TPU-compiled HLO: the parser's and XLA's estimates side by side.

Reads decode loops compiled for TPU targets (`loopspec-aot` rows: <rows>.jsonl with XLA's cost_analysis, and
the TPU HLO it kept in --hlo_dir, named by `loopspec_experiments.aot.hlo_path`), and per loop writes one row
to <out_dir>/costs.jsonl:

  parser   one iteration of the outer loop (`analysis/hlo_cost.py`) under the branch policies of a LoopSpec
           tick's `lax.switch`: its steady-state branch (the narrowest ladder width: one lane column per
           stage, the regime of a high accepted length) and its most expensive one (every column);
  xla      cost_analysis() of the whole program (the loop body once, its switch at the branch XLA rates
           slowest, plus the work outside the loop), and optimal_seconds corrected for the -1 s XLA's v5e
           model charges each `ConcatBitcast` custom-call it walks (`xla_concat_bitcasts`).

and <out_dir>/table.md: per model and target, ms per token of AR, chain and LoopSpec (2, 8) at the paper's
accepted length and LoopSpec's speed-up, from the parser (roofline at the chip's published bandwidth and
peak: max(bytes / BW, flops / peak), no per-op overhead) and from XLA (its corrected optimal_seconds, where
the HLO was compiled for that target). With --micro, <out_dir>/micro.jsonl: `analysis/micro.py`'s programs.

  python -m loopspec_experiments.tpu_costs --rows=A/rows.jsonl,B/rows.jsonl --hlo_dir=/tmp/aot_hlo
  python -m loopspec_experiments.tpu_costs --micro
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from typing import Dict, List, Optional

from loopspec_jax.analysis import aot, cost, hlo_cost, micro
from loopspec_jax.analysis.hlo import parse_hlo
from loopspec_configs import models as model_configs
from loopspec_experiments import aot as aot_exp
from loopspec_experiments import common

OUT = "results/tpu_aot/2026-12-07-costs"
# Public per-chip figures (bf16 dense FLOP/s, HBM bytes/s): v5e and v5p as `configs/accelerators.py`;
# v6e (Trillium): 918 TFLOP/s bf16, 1640 GB/s HBM (cloud.google.com/tpu/docs/v6e).
CHIPS = {"v5e": (197e12, 819e9), "v5p": (459e12, 2765e9), "v6e": (918e12, 1640e9)}
GAMMA = {"huginn:0125": 14.5, "raven_llama:3p2_1b": 14.5}  # the paper's R = 32, (2, 8) accepted length
METHODS = ("ar", "chain:d1=2,gamma=8", "loopspec:d1=2,d2=8")


def xla_concat_bitcasts(hlo: str) -> int:
  """`ConcatBitcast` custom-calls XLA's cost walk meets: each computation once per call site (fusions, calls,
  the while body once), a conditional at its branch with the FEWEST of them. XLA's v5e model charges each
  -1 s (so it rates that branch slowest): optimal_seconds + this count is its estimate (README)."""
  comps, entry = parse_hlo(hlo)
  memo: Dict[str, int] = {}

  def walk(name: str) -> int:
    if name not in memo:
      memo[name] = 0
      n = 0
      for ins in comps[name].instrs.values():
        n += ins.opcode == "custom-call" and "ConcatBitcast" in ins.attrs
        for key in ("calls", "body", "to_apply"):
          if ins.attr(key) in comps and ins.opcode in ("fusion", "while", "call"):
            n += walk(ins.attr(key))
        branches = [b for b in ins.attr_list("branch_computations") if b in comps]
        n += min((walk(b) for b in branches), default=0)
      memo[name] = n
    return memo[name]

  return walk(entry)


class LoopsOnce(hlo_cost.HloCostModel):
  """The parser with every inner while body counted once, as XLA's cost_analysis counts it (micro `nested`):
  against the parser's own figure, what XLA leaves out of a loop that runs an inner loop (chain's verify over
  the recurrences, a head's drafting steps)."""

  def trip_count(self, frame, loop):
    return 1


# Where a gap between XLA's bytes and the parser's comes from (`attribute`), each shown by a micro program of
# known traffic (micro.jsonl: README of results/tpu_aot/2026-12-07-costs).
CAUSES = {
    "nested": "inner loops: XLA counts each once (micro nested), the parser times its trips",
    "on_chip": (
        "on-chip accesses and the program outside the loop: XLA counts every read in any memory (micro reuse),"
        " and lies within the XLA-like count of them"
    ),
    "rest": "not reproduced: XLA outside the parser-with-loops-once .. XLA-like bracket",
}
GAP = 0.25


def attribute(c: dict) -> List[str]:
  """The causes (`CAUSES` keys) of a loop's gap where XLA's bytes and the parser's (widest branch) differ by
  more than `GAP`. `nested`: counting inner loops once (`LoopsOnce`) moves the parser by more than `GAP`
  towards XLA. `on_chip`: XLA exceeds that by more than `GAP` (of the parser's figure) and the XLA-like count
  (every op's operands and output whole, in any memory, loops once) reaches XLA's figure. `rest`: XLA lies
  outside the bracket of those two counts, widened by `GAP`, or nothing else accounts for the gap."""
  keys = ("parser_bytes_max", "parser_bytes_loops_once", "xla_like_bytes", "xla_bytes")
  parser, once, like, xla = (c[k] for k in keys)
  if abs(xla / parser - 1) <= GAP:
    return []
  causes = []
  if abs(once - parser) > GAP * parser and (once < parser) == (xla < parser):
    causes.append("nested")
  if xla - once > GAP * parser and like >= (1 - GAP) * xla:
    causes.append("on_chip")
  if not (1 - GAP) * min(once, like) <= xla <= (1 + GAP) * max(once, like) or not causes:
    causes.append("rest")
  return causes


def gaps_markdown(costs: List[dict]) -> str:
  """Per loop: the parser (widest branch), the parser with inner loops once, the parser's count of the
  program outside the loop (the prompt's pass, setup: XLA's whole-program figure includes it once), the
  XLA-like count and XLA's bytes, and the causes of a gap over `GAP` (`attribute`)."""
  g = common.gb
  lines = []
  for c in costs:
    causes = "; ".join(CAUSES[k] for k in attribute(c)) or "-"
    ratio = c["xla_bytes"] / c["parser_bytes_max"]
    cells = [c["model"], c["method"], c["target"], g(c["parser_bytes_max"]), g(c["parser_bytes_loops_once"])]
    cells.append(g(c["parser_outside_bytes"]))
    lines.append(cells + [g(c["xla_like_bytes"]), g(c["xla_bytes"]), f"{ratio:.2f}", causes])
  header = (
      "model | method | target | parser GB | parser, inner loops once GB | parser, outside the loop GB |"
      " XLA-like GB | XLA GB | XLA / parser |"
      f" where a gap over {GAP:.0%} comes from"
  )
  return common.md_table(header, lines) + "\n"


def parse_row(row: dict, hlo: str) -> dict:
  """The parser's iteration under the steady-state and the widest branch, and XLA's corrected seconds."""
  cfg = model_configs.model_config(row["model"]).replace(dtype="bfloat16", max_len=row["context"])
  loop = cost.abstract_loop(cfg, row["method"], batch=row["batch"], **aot.stand_in_arguments(cfg, row["method"]))
  kv, slot = cost.kv_leaf_dims(loop.state), cost.slot_bytes(cfg, row["batch"], loop.total_len)
  shape = loop.decoder.loop_kw.get("shape")
  widths = tuple(shape.ladder) if shape is not None and getattr(shape, "dynamic", False) else (1,)
  out = {k: row[k] for k in aot_exp.KEY}
  steady = tuple(1.0 if i == 0 else 0.0 for i in range(len(widths))) if len(widths) > 1 else "max"
  for name, policy in (("steady", steady), ("max", "max")):
    model = hlo_cost.HloCostModel(hlo, kv, slot, policy)
    step = model.analyze()
    out[f"parser_bytes_{name}"], out[f"parser_flops_{name}"] = step.total_bytes, step.flops
    out["conditionals"] = step.conditionals
  # The whole program as XLA walks it (the outer loop once): what lies outside the loop, in the parser's HBM
  # terms (copies and writes outside the loop; reads of the program's arguments by non-products are not
  # traced), the widest branch. `_walk` is the model's own walk from a frame.
  whole = model._walk(hlo_cost.Frame(model.comps[model.entry], None, None, "entry"))  # noqa: SLF001
  out["parser_outside_bytes"] = whole.total_bytes - step.total_bytes
  out["parser_outside_copies"] = whole.bytes["copies"] - step.bytes["copies"]
  n = xla_concat_bitcasts(hlo)
  out["xla_like_bytes"] = micro.xla_like_bytes(hlo)
  out["parser_bytes_loops_once"] = LoopsOnce(hlo, kv, slot, "max").analyze().total_bytes
  out.update(
      ladder=list(widths),
      xla_bytes=row["xla_bytes"],
      xla_flops=row["xla_flops"],
      xla_optimal_seconds=row["xla_optimal_seconds"],
      xla_concat_bitcasts=n,
      xla_seconds=row["xla_optimal_seconds"] + n,
      ideal_bytes=row.get("ideal_bytes"),
  )
  return out


def tokens_per_iteration(model: str, method: str) -> float:
  cfg = model_configs.model_config(model)
  name, _, args = method.partition(":")
  kw = {k: int(v) for k, v in (a.split("=") for a in args.split(",") if a)}
  return cost.tokens_per_iteration(name, cfg, GAMMA[model], kw)


def projection(costs: List[dict]) -> List[dict]:
  """Per (model, chip): ms per token of each method by the parser (roofline) and XLA, where compiled."""
  out = []
  by = {(c["model"], c["target"].split(":")[1], c["method"]): c for c in costs}
  for model in sorted({c["model"] for c in costs} & set(GAMMA)):
    for chip, (peak, bw) in CHIPS.items():
      row = {"model": model, "chip": chip, "gamma": GAMMA[model]}
      for method in METHODS:
        # this chip's HLO, else another chip's (v5e first) at this chip's roofline ("HLO compiled for")
        src = next((by[k] for k in ((model, c, method) for c in (chip, *CHIPS)) if k in by), None)
        if src is None:
          continue
        tok = tokens_per_iteration(model, method)
        sec = max(src["parser_bytes_steady"] / bw, src["parser_flops_steady"] / peak)
        row[method] = {
            "tokens_per_iteration": tok,
            "hlo_target": src["target"],
            "parser_ms_per_token": 1e3 * sec / tok,
            "xla_ms_per_token": 1e3 * src["xla_seconds"] / tok if src["target"].split(":")[1] == chip else None,
        }
      out.append(row)
  return out


def markdown(proj: List[dict]) -> str:
  f = lambda x: "-" if x is None else f"{x:.2f}"
  lines = [
      "| model | chip | HLO compiled for | AR ms/token: parser / XLA | chain (2, 8) | LoopSpec (2, 8) |"
      " LoopSpec x AR: parser / XLA | LoopSpec x chain: parser / XLA |",
      "|" + "---|" * 8,
  ]
  for r in proj:
    ms = {m: r.get(m) for m in METHODS}
    if ms[METHODS[2]] is None:
      continue
    none = {"parser_ms_per_token": None, "xla_ms_per_token": None, "hlo_target": None}
    ms = {m: v or none for m, v in ms.items()}
    cell = lambda m: f"{f(ms[m]['parser_ms_per_token'])} / {f(ms[m]['xla_ms_per_token'])}"
    ratio = lambda a, b, k: None if ms[a][k] is None or ms[b][k] is None else ms[a][k] / ms[b][k]
    ls = METHODS[2]
    targets = sorted({ms[m]["hlo_target"] for m in METHODS} - {None})
    lines.append(
        f"| {r['model']} | {r['chip']} | {', '.join(targets)} | {cell('ar')} | {cell(METHODS[1])} | {cell(ls)} | "
        f"{f(ratio('ar', ls, 'parser_ms_per_token'))} / {f(ratio('ar', ls, 'xla_ms_per_token'))} | "
        f"{f(ratio(METHODS[1], ls, 'parser_ms_per_token'))} / {f(ratio(METHODS[1], ls, 'xla_ms_per_token'))} |"
    )
  return "\n".join(lines) + "\n"


def compare_markdown(costs: List[dict]) -> str:
  """Per loop: the parser's iteration (steady-state / widest branch) against XLA's program, and XLA's
  optimal_seconds before and after the ConcatBitcast correction (with the rate it implies)."""
  g = common.gb
  lines = [
      "| model | method | target | parser GB: steady / widest | XLA GB | XLA / parser | parser GFLOP: steady / widest |"
      " XLA GFLOP | XLA / parser | outside the loop GB (copies) | XLA-like GB | XLA optimal_seconds |"
      " ConcatBitcasts | corrected ms | XLA GB / corrected s |",
      "|" + "---|" * 15,
  ]
  for c in costs:
    sec = c["xla_seconds"]
    lines.append(
        f"| {c['model']} | {c['method']} | {c['target']} | {g(c['parser_bytes_steady'])} / {g(c['parser_bytes_max'])} | "
        f"{g(c['xla_bytes'])} | {c['xla_bytes'] / c['parser_bytes_max']:.2f} | {g(c['parser_flops_steady'])} / "
        f"{g(c['parser_flops_max'])} | {g(c['xla_flops'])} | {c['xla_flops'] / max(c['parser_flops_max'], 1):.2f} | "
        f"{g(c['parser_outside_bytes'])} ({g(c['parser_outside_copies'])}) | {g(c['xla_like_bytes'])} | "
        f"{c['xla_optimal_seconds']:.4f} | {c['xla_concat_bitcasts']} | {1e3 * sec:.2f} | "
        f"{g(c['xla_bytes'] / sec) if sec > 0 else '-'} |"
    )
  return "\n".join(lines) + "\n"


def load(rows_files: List[str], hlo_dirs: List[str]) -> List[dict]:
  """One-chip batch-1 rows whose HLO was kept: rows_files[i]'s HLO in hlo_dirs[i] (the loop that wrote them);
  a key found in an earlier file is not read again from a later one."""
  rows: Dict[tuple, tuple] = {}
  for path, hlo_dir in zip(rows_files, hlo_dirs):
    for row in aot_exp.read_rows(path):
      key = tuple(row[k] for k in aot_exp.KEY)
      src = aot_exp.hlo_path(hlo_dir, key)
      if row.get("compiled") and row["batch"] == 1 and row["mesh"] == "1x1" and key not in rows and os.path.exists(src):
        rows[key] = (row, src)
  out = []
  for _, (row, src) in sorted(rows.items()):
    with gzip.open(src, "rt") as fh:
      out.append(parse_row(row, fh.read()))
  return out


def joined(costs: List[dict], earlier_files: List[str]) -> List[dict]:
  """`costs` and the loops of earlier costs.jsonl files that `costs` lacks (their HLO no longer kept: a
  costs row is everything the tables need), sorted by key; a key in several earlier files: the first."""
  by_key = {tuple(c[k] for k in aot_exp.KEY): c for c in costs}
  for path in earlier_files:
    for c in aot_exp.read_rows(path):
      by_key.setdefault(tuple(c[k] for k in aot_exp.KEY), c)
  return [by_key[k] for k in sorted(by_key)]


def main(argv: Optional[List[str]] = None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rows", default=f"{OUT}/rows.jsonl", help="comma-separated loopspec-aot rows.jsonl files")
  ap.add_argument("--hlo_dir", default="/tmp/aot_hlo", help="comma-separated: the kept HLO of each rows file")
  ap.add_argument("--out_dir", default=OUT)
  ap.add_argument("--micro", action="store_true", help="the programs of known traffic (analysis/micro.py)")
  ap.add_argument("--gaps_only", action="store_true", help="only costs.jsonl and gaps.md (no projection)")
  ap.add_argument(
      "--costs", default="", help="comma-separated costs.jsonl of earlier runs: their loops join (HLO parsed now wins)"
  )
  a = ap.parse_args(argv)
  reason = aot.tpu_unavailable()
  if reason:
    raise SystemExit(reason)
  os.makedirs(a.out_dir, exist_ok=True)
  if a.micro:
    rows = micro.measure("tpu:v5e")
    common.atomic_write_text(os.path.join(a.out_dir, "micro.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    return print("\n".join(json.dumps(r) for r in rows))
  rows_files, hlo_dirs = [p for p in a.rows.split(",") if p], [d for d in a.hlo_dir.split(",") if d]
  if len(rows_files) != len(hlo_dirs):
    raise SystemExit(f"--rows names {len(rows_files)} files and --hlo_dir {len(hlo_dirs)} folders: one each")
  costs = joined(load(rows_files, hlo_dirs), [p for p in a.costs.split(",") if p])
  common.atomic_write_text(os.path.join(a.out_dir, "costs.jsonl"), "".join(json.dumps(c) + "\n" for c in costs))
  gaps = gaps_markdown(costs)
  common.atomic_write_text(os.path.join(a.out_dir, "gaps.md"), gaps)
  if a.gaps_only:
    return print(gaps)
  common.atomic_write_text(os.path.join(a.out_dir, "compare.md"), compare_markdown(costs))
  proj = projection(costs)
  common.atomic_write_text(os.path.join(a.out_dir, "projection.json"), json.dumps(proj, indent=1) + "\n")
  table = markdown(proj)
  common.atomic_write_text(os.path.join(a.out_dir, "table.md"), table)
  print(table)


if __name__ == "__main__":
  main()
