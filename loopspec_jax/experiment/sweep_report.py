"""The sweep's markdown tables, from rows (sweep.jsonl, replay.jsonl) and Theorem 2's predictions.

`summary_markdown` (sweep.md): per (task, sampling) every method side by side (`baselines_markdown`, when the
group has draft / lookup rows), the LoopSpec grid, chain, and the measured best against the predicted best
(`comparison_rows`). `replay_markdown` (replay.md): the replayed grid's gamma. `headline_markdown`: the paper's
comparison over every model, task and sampling that has results. Rendering only: every figure is a row field
(sweep_stats.py) or comes from the depth JSON.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

from loopspec_jax import methods
from loopspec_jax.analysis import depth_metrics as DA
from loopspec_jax.analysis import theory
from loopspec_jax.experiment import sweep_grid
from loopspec_jax.experiment.sweep_stats import min_ratio_fields, projection_fields


def pair_str(d1, d2) -> str:
  return f"({d1}, {'-' if d2 is None else d2})"


def _thm1(row) -> str:
  t = row.get("theorem1")
  if not t:
    return "-"
  return f"{t['bound']:.3f} " + ("ok" if t["holds"] else "VIOLATED" if row["theorem1_applies"] else "n/a: skips")


def _yes(v) -> str:
  return "-" if v is None else ("yes" if v else "NO")


def _f(x, fmt=".2f") -> str:
  return "-" if x is None or (isinstance(x, float) and x != x) else format(x, fmt)


def _x(v) -> str:
  return "-" if v is None else f"{v:.2f}x"


def _gamma(x) -> str:
  se = x.get("gamma_se")
  return _f(x["mean_accepted_length"]) + ("" if se is None else f" ± {se:.2f}")


def best_rows(rows: List[dict], pred: Optional[dict]) -> Dict[str, Optional[dict]]:
  """The measured best LoopSpec rows (by wall clock, by gamma) and the rows of the predicted pairs."""
  ls = [x for x in rows if x["method"] == "loopspec"]
  find = lambda pair: next((x for x in ls if pair is not None and [x["d1"], x["d2"]] == list(pair)), None)
  tie = lambda x: (x["d1"], x["R"] if x["d2"] is None else x["d2"])
  top = lambda key: max(ls, key=lambda x: (x.get(key, float("-inf")),) + tuple(-v for v in tie(x))) if ls else None
  return {
      "measured": top("wall_clock_ratio"),
      "measured_gamma": top("mean_accepted_length"),
      "rates": top("predicted_gamma"),
      "curve": top("gamma_curve") if any("gamma_curve" in x for x in ls) else None,
      "predicted": find(pred["best_feasible"]) if pred else None,
      "predicted_swept": find(pred["best_swept"]) if pred else None,
      "predicted_fit": find(pred.get("best_fit")) if pred else None,
  }


def comparison_rows(rows: List[dict], pred: Optional[dict]) -> List[Tuple[str, Optional[dict], Optional[list]]]:
  """(name, row or None, pair) of the paper's comparison: the predicted best pairs against the measured best."""
  best = best_rows(rows, pred)
  out = [
      ("measured best by gamma", best["measured_gamma"], None),
      ("measured best by wall clock (this CPU)", best["measured"], None),
  ]
  if pred:
    out.append(("predicted: Theorem 2 best feasible (min J)", best["predicted"], pred["best_feasible"]))
    if pred.get("best_swept") != pred["best_feasible"]:
      out.append(("predicted: Theorem 2 best among swept", best["predicted_swept"], pred["best_swept"]))
    if pred.get("best_fit"):
      out.append(("predicted: fitted curve's best gamma", best["predicted_fit"], pred["best_fit"]))
  if best["curve"] is not None:
    out.append(("predicted: measured depth curve's best gamma", best["curve"], None))
  out.append(("predicted: cost identity on measured rates", best["rates"], None))
  return out


def _method_order(x: dict) -> tuple:
  """AR first, LoopSpec last, the baselines between in the registry's order (chain, draft, lookup)."""
  return (x["method"] == methods.LoopSpec.name, methods.NAMES.index(x["method"]))


def _method_cell(x: dict) -> str:
  if x["method"] == "loopspec":
    return f"LoopSpec {pair_str(x['d1'], x['d2'])}"
  if x["method"] == "chain":
    return f"chain d1={x['d1']}, gamma={x['draft_len']}"
  if x["method"] == "draft":
    return f"draft {x.get('draft_model')}, gamma={x['draft_len']}"
  if x["method"] == "lookup":
    return f"lookup ngram={x.get('ngram')}, gamma={x['draft_len']}"
  return x.get("label", x["method"])


def baselines_markdown(grp: List[dict]) -> List[str]:
  """Every method of one (task, sampling) group side by side: the speculative baselines' per-pass numbers
  (tokens per verify pass, acceptance, drafts per pass, draft cost share) next to gamma and the wall clock."""
  out = [
      "",
      "All methods (tokens / verify pass: AR 1, chain / draft / lookup per full-depth verify pass; acceptance: "
      "accepted / offered drafts; alpha: accepted / examined drafts; gamma: LoopSpec and chain on LoopSpec's "
      "scale, R x tokens / sequential recurrent steps, draft and lookup tokens per verify pass)",
      "",
      "| method | tokens / verify pass | acceptance | alpha | drafts / pass | draft cost share | gamma ± se | "
      "ratio vs AR | ratio (min/min) | ratio vs AR ref. | identical |",
      "|" + "---|" * 11,
  ]
  for x in sorted(grp, key=_method_order):
    m, separate, tree = x["method"], sweep_grid.is_separate_drafter(x["method"]), x.get("tau") is not None
    tpr = 1.0 if m == "ar" else x.get("tokens_per_round")
    drafts = x.get("mean_gamma") if separate else (x["draft_len"] if m == "chain" else None)
    drafts = x.get("nodes_per_pass") if tree else drafts  # a tree: draft nodes verified per pass
    share = x.get("draft_cost_share") if separate or tree else None
    out.append(
        f"| {_method_cell(x)} | {_f(tpr)} | {_f(x.get('acceptance_rate'), '.3f')} | {_f(x.get('alpha'), '.3f')} | "
        f"{_f(drafts)} | {_f(share, '.3f')} | {_gamma(x)} | {x['wall_clock_ratio']:.2f}x | "
        f"{_x(x.get('wall_clock_ratio_min'))} | {_x(x.get('wall_clock_ratio_reference', x['wall_clock_ratio']))} | "
        f"{_yes(x.get('identical_to_ar'))} |"
    )
  return out


def summary_markdown(rows: List[dict], preds: dict) -> str:
  """Markdown tables per (task, sampling): every method side by side (when the group has draft / lookup rows),
  the LoopSpec grid, chain, and measured vs predicted best."""
  out = []
  for task, samp in dict.fromkeys((x["task"], x["sampling"]) for x in rows):
    grp = [x for x in rows if (x["task"], x["sampling"]) == (task, samp)]
    pred = preds.get((task, samp))
    out += _group_head(grp, task, samp, pred)
    if any(sweep_grid.is_separate_drafter(x["method"]) or x.get("tau") is not None for x in grp):  # only then
      out += baselines_markdown(grp)
    ls = [x for x in grp if x["method"] == "loopspec"]
    if ls:
      out += _loopspec_table(ls, best_rows(grp, pred))
    ch = [x for x in grp if x["method"] == "chain"]
    if ch:
      out += _chain_table(ch)
    if ls:
      out += _comparison_table(grp, pred)
    out.append("")
  return "\n".join(out)


def _group_head(grp: List[dict], task: str, samp: str, pred: Optional[dict]) -> List[str]:
  """The group's heading (prompts, AR's tokens and speed) and Theorem 2's prediction for it."""
  ar = next((x for x in grp if x["method"] == "ar"), None)
  head = f"### {grp[0]['model']} / {task} / {samp}"
  if ar:
    head += (
        f": {ar['num_prompts']} prompts, AR {ar['tokens']} tokens, decode {ar['decode_seconds_median']:.3f} s "
        f"({ar['tokens_per_second']:.1f} tok/s), median of {ar['repeats']}"
    )
  out = [head]
  if pred:
    o = pred["optimal_continuous"]
    out.append(
        f"Theorem 2 from {pred['path']}: envelope phi(r) = {pred['beta']:.4g} r^-{pred['alpha']:.3f}; "
        f"optimum (d1*, d2*) = ({o[0]:.3f}, {o[1]:.3f}); predicted best feasible "
        f"{pair_str(*pred['best_feasible'])}"
        + (f"; best swept {pair_str(*pred['best_swept'])}" if pred["best_swept"] else "")
        + "."
    )
  return out


def _marks(x: dict, best: dict) -> str:
  """A LoopSpec row's marks: measured best (wall clock, gamma), predicted best, the fit's best."""
  marks = []
  if best["measured"] is x:
    marks.append("**measured best**")
  if best["measured_gamma"] is x:
    marks.append("**highest gamma**")
  if best["predicted"] is x:
    marks.append("**predicted best**")
  elif best["predicted_swept"] is x:
    marks.append("predicted best (swept)")
  if best["predicted_fit"] is x:
    marks.append("fit's best")
  return " ".join(marks)


def _loopspec_table(ls: List[dict], best: dict) -> List[str]:
  """The LoopSpec grid of a group: gamma every way it is measured and predicted, ratios, commits, rates."""
  out = [
      "",
      "| (d1, d2) | gamma ± se | gamma (ticks) | gamma R/C (rates) | gamma, all spawns (replay) | "
      "gamma (depth curve) | gamma (fit) | R/J (Thm 2) | ratio vs AR | ratio (min/min) | ratio vs AR ref. | "
      "x AR projected | commits f/s/r | skipped spawns | P(rej x1) | P(restart) | Thm 1 bound | gate open | "
      "identical | mark |",
      "|" + "---|" * 20,
  ]
  for x in ls:
    c = x["commits"]
    out.append(
        f"| {pair_str(x['d1'], x['d2'])} | {_gamma(x)} | "
        f"{_f(x.get('tokens_per_r_steps'))} | {_f(x.get('predicted_gamma'))} | "
        f"{_f(x.get('gamma_all_spawns'))}{'' if x.get('replay_first_matches', True) else ' (first differs!)'} | "
        f"{_f(x.get('gamma_curve'))} | "
        f"{_f(x.get('gamma_fit'))} | {_f(x.get('gamma_bound'))} | {x['wall_clock_ratio']:.2f}x | "
        f"{_x(x.get('wall_clock_ratio_min'))} | "
        f"{_x(x.get('wall_clock_ratio_reference', x['wall_clock_ratio']))} | {_x(x.get('projected_ratio'))} | "
        f"{c['first']}/{c['second']}/{c['restart']} | {x.get('skipped_spawns', 0)} | "
        f"{x.get('p_reject_first', 0):.3f} | "
        f"{x.get('p_restart', 0):.3f} | {_thm1(x)} | {x['gate_open_rate']:.2f} | "
        f"{_yes(x.get('identical_to_ar'))} | "
        f"{_marks(x, best)} |"
    )
  return out


def _chain_table(ch: List[dict]) -> List[str]:
  """The chain rows of a group against the i.i.d. acceptance fitted to their tokens per round."""
  a = DA.fit_chain_acceptance([x["draft_len"] for x in ch], [x["tokens_per_round"] for x in ch])
  out = [
      "",
      f"Chain (draft depth {ch[0]['d1']}; fitted i.i.d. acceptance a = {a:.3f})",
      "",
      "| draft len | gamma ± se | tokens / round | (1-a^(g+1))/(1-a) | drafts accepted | ratio vs AR | "
      "ratio (min/min) | ratio vs AR ref. | x AR projected | identical |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for x in ch:
    out.append(
        f"| {x['draft_len']} | {_gamma(x)} | {x['tokens_per_round']:.2f} | "
        f"{theory.chain_expected_tokens(a, x['draft_len']):.2f} | {x.get('acceptance_rate', 0):.3f} | "
        f"{x['wall_clock_ratio']:.2f}x | {_x(x.get('wall_clock_ratio_min'))} | "
        f"{_x(x.get('wall_clock_ratio_reference', x['wall_clock_ratio']))} | "
        f"{_x(x.get('projected_ratio'))} | {_yes(x.get('identical_to_ar'))} |"
    )
  return out


def _comparison_table(grp: List[dict], pred: Optional[dict]) -> List[str]:
  """The measured best against the predicted best pairs of a group (`comparison_rows`)."""
  out = [
      "",
      "| | (d1, d2) | gamma ± se | gamma, all spawns | gamma (fit) | R/J | ratio vs AR | x AR projected |",
      "|---|---|---|---|---|---|---|---|",
  ]
  cells = lambda x: (
      f"{_gamma(x)} | {_f(x.get('gamma_all_spawns'))} | {_f(x.get('gamma_fit'))} | {_f(x.get('gamma_bound'))} | "
      f"{x['wall_clock_ratio']:.2f}x | {_x(x.get('projected_ratio'))}"
  )
  return out + _comparison_lines(comparison_rows(grp, pred), cells, "not swept | | | | |")


def _comparison_lines(entries, cells, absent: str) -> List[str]:
  """One table line per `comparison_rows` entry: its name, pair and `cells(row)`, or `absent` for a predicted
  pair no row measured (entries without a row or a pair are left out)."""
  out = []
  for name, x, pair in entries:
    if x is not None:
      out.append(f"| {name} | {pair_str(x['d1'], x['d2'])} | {cells(x)} |")
    elif pair is not None:
      out.append(f"| {name} | {pair_str(*pair)} | {absent} |")
  return out


def replay_markdown(rows: List[dict], preds: dict) -> str:
  """Per task: the predicted vs measured best of the replayed grid, then gamma of every pair as a d1 x d2 grid."""
  out = []
  for task in dict.fromkeys(x["task"] for x in rows):
    grp = [x for x in rows if x["task"] == task]
    ls = [x for x in grp if x["method"] == "loopspec"]
    pred = preds.get((task, "greedy"))
    out.append(
        f"### {grp[0]['model']} / {task} / greedy (replay): {grp[0]['num_prompts']} prompts, {grp[0]['tokens']} tokens"
    )
    if pred:
      o = pred["optimal_continuous"]
      out.append(
          f"Envelope {pred['beta']:.4g} r^-{pred['alpha']:.3f}; (d1*, d2*) = ({o[0]:.3f}, {o[1]:.3f}); "
          f"Theorem 2 best feasible {pair_str(*pred['best_feasible'])}."
      )
    out += ["", "| | (d1, d2) | gamma ± se | gamma (depth curve) | gamma (fit) | R/J |", "|---|---|---|---|---|---|"]
    # no timing in a replay; the rates are the measurement
    entries = [e for e in comparison_rows(grp, pred) if "wall clock" not in e[0] and "measured rates" not in e[0]]
    cells = (
        lambda x: f"{_gamma(x)} | {_f(x.get('gamma_curve'))} | {_f(x.get('gamma_fit'))} | {_f(x.get('gamma_bound'))}"
    )
    out += _comparison_lines(entries, cells, "not in grid | | |")
    d1s = sorted({x["d1"] for x in ls})
    d2s = sorted({x["d2"] for x in ls if x["d2"] is not None})
    out += ["", "gamma by (d1 rows, d2 columns; '-' single proposal):", ""]
    out.append("| d1 \\ d2 | " + " | ".join(str(v) for v in d2s) + " | - |")
    out.append("|" + "---|" * (len(d2s) + 2))
    cell = {(x["d1"], x["d2"]): x["mean_accepted_length"] for x in ls}
    for d1 in d1s:
      vals = [cell.get((d1, d2)) for d2 in d2s + [None]]
      out.append(f"| {d1} | " + " | ".join("" if v is None else f"{v:.2f}" for v in vals) + " |")
    ch = [x for x in grp if x["method"] == "chain"]
    if ch:
      out += [
          "",
          f"Chain (draft depth {ch[0]['d1']}): "
          + ", ".join(
              f"g={x['draft_len']}: gamma {x['mean_accepted_length']:.2f}, {x['tokens_per_round']:.2f} tok/round"
              for x in ch
          ),
      ]
    out.append("")
  return "\n".join(out)


# ----------------------------------------------------------------------------------------------------------
# The headline: predicted vs measured best over every model, task and sampling that has results
# ----------------------------------------------------------------------------------------------------------
_HEADLINE = (
    "model",
    "task",
    "sampling",
    "depth curve: envelope beta r^-alpha (LS R^2)",
    "(d1*, d2*)",
    "predicted best (Thm 2)",
    "its gamma",
    "measured best gamma",
    "gamma source",
    "best wall clock (CPU, engine; by min/min)",
    "predicted pair on the engine (CPU)",
    "projected x AR at predicted / at best-gamma pair",
)
_TASK_ORDER = ("gsm8k", "math500", "mbpp", "humaneval", "shakespeare")


def _best(rows: List[dict], key: str) -> Optional[dict]:
  rows = [x for x in rows if x.get(key) is not None]
  tie = lambda x: (-x["d1"], -(x["R"] if x["d2"] is None else x["d2"]))
  return max(rows, key=lambda x: (x[key],) + tie(x)) if rows else None


def headline_markdown(model_dirs: List[str], wall_clock_subdir: str = "sweep") -> str:
  """The paper's comparison per (model, task, sampling): Theorem 2's predicted pair against the measured best
  by gamma (device independent; replay rows where present, else engine rows) and by wall clock (engine rows,
  this CPU), with the projected accelerator ratio. `model_dirs` hold depths/ and sweep/ of one model each; the
  wall-clock columns read <model_dir>/<wall_clock_subdir>/sweep.jsonl where it exists (e.g. a rerun of the engine
  sweep on a quieter machine), else sweep/."""
  lines = ["| " + " | ".join(_HEADLINE) + " |", "|" + "---|" * len(_HEADLINE)]
  for d in model_dirs:
    results = _headline_results(d, wall_clock_subdir)
    lines += ["| " + " | ".join(_headline_cells(s, **results)) + " |" for s in _depth_summaries(d)]
  return "\n".join(lines)


def _headline_results(d: str, wall_clock_subdir: str) -> dict:
  """One model directory's engine rows, timed rows (`wall_clock_subdir`, else the engine's), replay rows and
  projection (None without projection.json)."""
  engine = DA.read_jsonl(os.path.join(d, "sweep", "sweep.jsonl"), repair=False)
  wc_path = os.path.join(d, wall_clock_subdir, "sweep.jsonl")
  timed = DA.read_jsonl(wc_path if os.path.exists(wc_path) else os.path.join(d, "sweep", "sweep.jsonl"), False)
  replay = DA.read_jsonl(os.path.join(d, "sweep", "replay.jsonl"), repair=False)
  proj = None
  if os.path.exists(os.path.join(d, "sweep", "projection.json")):
    with open(os.path.join(d, "sweep", "projection.json")) as f:
      proj = json.load(f)
  return {"engine": engine, "timed": timed, "replay": replay, "proj": proj}


def _depth_summaries(d: str) -> List[dict]:
  """The depth JSONs under <d>/depths, by task (the prompt sets' order) and sampling."""
  summaries = []
  for name in sorted(os.listdir(os.path.join(d, "depths"))) if os.path.isdir(os.path.join(d, "depths")) else []:
    if name.startswith("depths_") and name.endswith(".json"):
      with open(os.path.join(d, "depths", name)) as f:
        summaries.append(json.load(f))
  task = lambda s: _TASK_ORDER.index(s["meta"]["task"]) if s["meta"]["task"] in _TASK_ORDER else 9
  return sorted(summaries, key=lambda s: (task(s), s["meta"]["sampling_name"]))


def _headline_cells(s: dict, engine: List[dict], timed: List[dict], replay: List[dict], proj) -> List[str]:
  """One headline row: the depth summary `s`'s prediction against the model's rows of its (task, sampling)."""
  m = s["meta"]
  task, samp = m["task"], m["sampling_name"]
  env, ls, t2 = s["fits"].get("envelope"), s["fits"].get("least_squares"), s.get("theorem2")
  of_group = lambda rows: [x for x in rows if (x["task"], x["sampling"], x["method"]) == (task, samp, "loopspec")]
  eng = [dict(x, **min_ratio_fields(x)) for x in of_group(engine)]
  rep = of_group(replay)
  gamma_rows, source = (rep, f"replay, {rep[0]['num_prompts']} prompts") if rep else (eng, "engine")
  if gamma_rows and not rep:
    source = f"engine, {gamma_rows[0]['num_prompts']} prompts, {len(gamma_rows)} pairs"
  cells = [m.get("model", ""), task, samp]
  cells.append(
      f"{env['beta']:.3g} r^-{env['alpha']:.2f} ({ls['r2']:.2f})" if env and ls and ls.get("r2") is not None else "-"
  )
  if not t2:
    return cells + ["-"] * (len(_HEADLINE) - len(cells))
  o, b = t2["optimal_continuous"], t2["best_feasible"]
  cells += [f"({o[0]:.2f}, {o[1]:.2f})", pair_str(*b)]
  find = lambda rs: next((x for x in rs if [x["d1"], x["d2"]] == list(b)), None)
  pg = find(gamma_rows)
  top = _best(gamma_rows, "mean_accepted_length")
  cells.append(_gamma(pg) if pg else "not swept")
  cells.append(f"{pair_str(top['d1'], top['d2'])} {_gamma(top)}" if top else "-")
  cells.append(source if top else "-")
  eng_t = [dict(x, **min_ratio_fields(x)) for x in of_group(timed)] or eng
  wc = _best(eng_t, "wall_clock_ratio_min") or _best(eng_t, "wall_clock_ratio")  # the less load-sensitive one
  wm = lambda x: f"{x['wall_clock_ratio']:.2f}x (min/min {_x(x.get('wall_clock_ratio_min'))})"
  cells.append(f"{pair_str(wc['d1'], wc['d2'])} {wm(wc)}" if wc else "-")
  pe, pt = find(eng), find(eng_t)
  cells.append(
      f"gamma {_gamma(pe)}, {pe['skipped_spawns']} skipped spawns, {wm(pt or pe)}"
      if pe
      else ("not swept" if eng else "-")
  )
  pr = [projection_fields(x, proj).get("projected_ratio") if x else None for x in (pg, top)]
  cells.append(" / ".join("-" if v is None else f"{v:.2f}x" for v in pr) if proj else "-")
  return cells
