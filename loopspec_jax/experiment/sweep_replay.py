"""Greedy replay: gamma of every feasible LoopSpec pair (and chain draft length) without decoding it.

For each task, the first `replay_prompts` prompts are decoded greedily at full depth (or their AR tokens are
taken from the depth analysis's records), their `DA.greedy_agreement` bits computed in one forward per prompt,
and `DA.replay_loopspec_counts` / `DA.replay_chain_counts` give every configuration's commits, hence gamma
exactly as the engine would count it (no skipped spawns assumed). `loopspec-sweep --config.mode=replay`.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List

import loopspec_jax
from loopspec_jax import methods
from loopspec_jax.analysis import depth_metrics as DA
from loopspec_jax.analysis import theory
from loopspec_jax.experiment import files
from loopspec_jax.experiment import prompts as prompt_sets
from loopspec_jax.experiment import settings
from loopspec_jax.experiment import sweep_grid
from loopspec_jax.experiment import sweep_report
from loopspec_jax.experiment import sweep_stats


def _depth_records(cfg, task: str, prompts: list) -> Dict[int, dict]:
  """Greedy depth-analysis records (index -> record) of `task` whose prompts equal ours, from depths.jsonl."""
  path = cfg.get("depths_jsonl") or ""
  if not path:
    pattern = cfg.get("depths_json") or ""
    if not pattern:
      return {}
    path = os.path.join(os.path.dirname(pattern), "depths.jsonl")
  out = {}
  for rec in DA.read_jsonl(path, repair=False):
    try:
      key = json.loads(rec["key"])
    except (KeyError, TypeError, json.JSONDecodeError):
      continue
    i = rec.get("index", -1)
    greedy = float((key.get("sampling") or {}).get("temperature", 0.0)) == 0.0
    if (
        key.get("task") == task
        and greedy
        and key.get("max_new_tokens") == cfg.max_new_tokens
        and 0 <= i < len(prompts)
        and rec["prompt"] == list(prompts[i])
    ):
      out[i] = rec
  return out


def _agreement(cfg, model, task: str, n_prompts: int):
  """The task's first `n_prompts` prompts, greedy agreement bits [R, positions] per prompt, and how many of
  them came from depth records (the rest decoded here with AR)."""
  prompts = prompt_sets.prompts_for(cfg, task, model, num_prompts=n_prompts)
  recs = _depth_records(cfg, task, prompts)
  agree = []
  for i, p in enumerate(prompts):
    if i in recs:
      tokens = recs[i]["tokens"]
    else:
      res = loopspec_jax.generate(model, [p], max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, request_ids=[i])
      tokens = res.tokens[0]
    agree.append(DA.greedy_agreement(model, p, tokens))
  return prompts, agree, len(recs)


def _loopspec_row(base: dict, agree: list, r: int, d1: int, d2) -> dict:
  """The replayed row of LoopSpec (d1, d2): commits, gamma from them and the cost identity's prediction."""
  m = methods.LoopSpec(d1=d1, d2=d2)
  n_tok = sum(a.shape[1] for a in agree)
  per = [DA.replay_loopspec_counts(a, d1, d2) for a in agree]
  counts = [[c["n"], c["first"], c["second"], c["restart"], c["reject_first"]] for c in per]
  tot = [sum(col) for col in zip(*counts)]
  c = {"first": tot[1], "second": tot[2], "restart": tot[3]}
  row = dict(base, method=m.name, label=sweep_grid.row_label(m))
  row.update(d1=d1, d2=d2, draft_len=None, tokens=n_tok, commits=c, per_prompt=counts)
  row["mean_accepted_length"] = theory.gamma_from_counts(r, d1, d2, n_tok, tot[4], tot[3])
  row["gamma_se"] = sweep_stats.gamma_standard_error(m, r, counts)
  row.update(DA.predicted_loopspec(r, d1, d2, n_tok, tot[4], tot[3]))
  row.update(sweep_stats.rate_standard_errors(counts))
  return row


def _chain_row(base: dict, agree: list, r: int, d1: int, g: int) -> dict:
  """The replayed row of chain (d1, draft length g): rounds, accepted drafts and gamma from them."""
  m = methods.Chain(d1=d1, gamma=g)
  n_tok = sum(a.shape[1] for a in agree)
  per = [DA.replay_chain_counts(a, d1, g) for a in agree]
  counts = [[c["n"], c["rounds"], c["accepted"]] for c in per]
  rounds, acc = sum(x[1] for x in counts), sum(x[2] for x in counts)
  row = dict(base, method=m.name, label=sweep_grid.row_label(m))
  row.update(d1=d1, d2=None, draft_len=g, tokens=n_tok, rounds=rounds, per_prompt=counts)
  row["commits"] = {"first": acc, "second": 0, "restart": n_tok - acc}
  row["mean_accepted_length"] = theory.chain_accepted_length(r, d1, g, n_tok, rounds)
  row["gamma_se"] = sweep_stats.gamma_standard_error(m, r, counts)
  row["tokens_per_round"] = n_tok / rounds
  row["acceptance_rate"] = acc / max(rounds * g, 1)
  return row


def _task_rows(cfg, model, task: str, label: str, r: int) -> List[dict]:
  """Every replayed row of one task: the LoopSpec grid, then chain at each draft length."""
  prompts, agree, from_records = _agreement(cfg, model, task, int(cfg.get("replay_prompts") or cfg.num_prompts))
  base = {
      "model": label,
      "task": task,
      "sampling": "greedy",
      "sampling_settings": {"temperature": 0.0},
      "num_prompts": len(prompts),
      "max_new_tokens": cfg.max_new_tokens,
      "source": "replay",
      "from_depth_records": from_records,
      "R": r,
  }
  grid = sweep_grid.loopspec_grid(cfg, r)
  rows = [_loopspec_row(base, agree, r, d1, d2) for d1, d2 in grid]
  if cfg.get("chain_d1"):
    rows += [_chain_row(base, agree, r, int(cfg.chain_d1), g) for g in sweep_grid.ints(cfg.chain_gammas)]
  n_tok = sum(a.shape[1] for a in agree)
  print(f"replay {label} / {task}: {len(prompts)} prompts, {n_tok} tokens, {len(grid)} pairs", flush=True)
  return rows


def replay_rows(cfg, model) -> dict:
  """Greedy gamma of every configuration of the grid (and chain draft length) on every task, by replay (see
  the module docstring). Writes <out_dir>/replay.jsonl (rewritten whole: it is cheap) and replay.md; returns
  {'rows', 'table', 'predictions'}."""
  r = model.config.recurrence
  label = cfg.get("model_label") or cfg.model
  tasks = settings.split_list(cfg.tasks)
  rows = [row for task in tasks for row in _task_rows(cfg, model, task, label, r)]
  summaries = {t: sweep_grid.load_depth_summary(cfg, t, "greedy", r) for t in tasks}
  proj = sweep_grid.load_projection(cfg)
  rows = [
      dict(
          x, **sweep_stats.curve_fields(x, summaries[x["task"]]), **sweep_stats.theorem1_fields(x, summaries[x["task"]])
      )
      for x in rows
  ]
  rows = [dict(x, **sweep_stats.projection_fields(x, proj)) for x in rows]
  preds = {(t, "greedy"): sweep_grid.load_prediction(cfg, t, "greedy", r) for t in tasks}
  table = sweep_report.replay_markdown(rows, preds)
  if files.is_main_process():
    text = "".join(json.dumps(x, default=DA._json_default) + "\n" for x in rows)
    files.atomic_write_text(os.path.join(cfg.out_dir, "replay.jsonl"), text)
    files.atomic_write_text(os.path.join(cfg.out_dir, "replay.md"), table + "\n")
  return {"rows": rows, "table": table, "predictions": preds}
