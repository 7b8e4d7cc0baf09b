"""The evaluation behind `loopspec-evaluate`: lm-evaluation-harness on a looped model, one row per (task,
method), with accuracy beside decoding speed (the entry point experiments/evaluate.py describes the rows,
the table and resuming; this module is that, given a config).

For every task and method of the config, `lm_eval.simple_evaluate` scores the model through the
`loopspec_jax` backend (`loopspec_jax.integrations.lm_eval`), with the offline task YAMLs of
`loopspec_jax/tasks/` on the include path. Each (task, method) row is appended to <out_dir>/eval.jsonl as
soon as it is measured; a rerun skips the rows already there (same settings), and the table
(<out_dir>/eval.md) is rewritten from every row.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import List, Optional

import loopspec_jax
from loopspec_jax import methods as methods_lib
from loopspec_jax import tasks as offline_tasks
from loopspec_jax.analysis import depth_metrics as DA
from loopspec_jax.experiment.files import atomic_write_text
from loopspec_jax.experiment.files import is_main_process
from loopspec_jax.experiment.settings import split_list

_NOT_METRICS = ("alias", "name", "sample_len", "samples")


class EvaluationInterrupted(RuntimeError):
  """Raised after `stop_after` new rows (the config's stand-in for a killed evaluation)."""


def split_methods(text) -> list:
  """'ar;loopspec:d1=2,d2=8' (or a list of specs) -> [AR(), LoopSpec(d1=2, d2=8)]."""
  out = methods_lib.parse_list(list(text) if isinstance(text, (list, tuple)) else str(text))
  if not out:
    raise ValueError("no methods given")
  labels = [m.label for m in out]
  if len(set(labels)) != len(labels):
    raise ValueError(f"methods repeat: {labels}")
  return out


def check_code_opt_in(cfg, tasks: List[str]):
  """The offline code tasks run model-written programs: only with --config.allow_code_execution=true."""
  code = [t for t in tasks if t in offline_tasks.CODE_TASKS]
  if code and not cfg.allow_code_execution:
    raise ValueError(
        f"tasks {code} execute model-written code; opt in with --config.allow_code_execution=true "
        "(the harness's confirm_run_unsafe_code and HF_ALLOW_CODE_EVAL=1)"
    )


def check_config(cfg) -> tuple:
  """(tasks, methods) of the config, with every error raised before the model loads or anything compiles."""
  tasks = split_list(cfg.tasks)
  if not tasks:
    raise ValueError("no tasks given")
  methods = split_methods(cfg.methods)  # any registered method; an unknown name is refused here
  check_code_opt_in(cfg, tasks)
  if cfg.limit is not None and cfg.limit < 1:
    raise ValueError(f"limit must be >= 1 or none, got {cfg.limit}")
  if cfg.batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
  if str(cfg.offline).lower() not in ("auto", "true", "false"):
    raise ValueError(f"offline must be auto, true or false, got {cfg.offline!r}")
  return tasks, methods


def _set_environment(cfg, tasks: List[str]):
  """Hub offline mode (no network attempts) when only offline tasks run, and the code-execution opt-in."""
  offline = str(cfg.offline).lower()
  if offline == "true" or (
      offline == "auto" and all(t in offline_tasks.OFFLINE_TASKS + (offline_tasks.OFFLINE_TAG,) for t in tasks)
  ):
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE", "TRANSFORMERS_OFFLINE"):
      os.environ.setdefault(var, "1")
  if cfg.allow_code_execution:
    os.environ["HF_ALLOW_CODE_EVAL"] = "1"


def task_manager(tasks: List[str]):
  """A TaskManager over the offline tasks, plus the harness's own tasks when a requested name is not offline
  (indexing the ~15k upstream task files takes a while, so they are only read when needed)."""
  from lm_eval.tasks import TaskManager

  tm = TaskManager(include_path=offline_tasks.TASKS_DIR, include_defaults=False)
  if all(t in tm.all_tasks for t in tasks):
    return tm
  tm = TaskManager(include_path=offline_tasks.TASKS_DIR, include_defaults=True)
  missing = [t for t in tasks if t not in tm.all_tasks]
  if missing:
    raise ValueError(f"unknown lm-eval task(s) {missing}")
  return tm


def expand_tags(tm, tasks: List[str]) -> List[str]:
  """Task names with each tag (e.g. `loopspec_offline`) replaced by its tasks: a tag has no results of its own,
  so each member gets its own rows (a group, which aggregates its subtasks, stays one row)."""
  out = []
  for name in tasks:
    members = [n for n, e in tm.task_index.items() if name in (e.tags or ())] if name in tm.all_tags else [name]
    out += [m for m in sorted(members) if m not in out]
  return out


def metrics_of(results: dict, task: str) -> dict:
  """{'metric,filter': value} of a task's (or group's) harness results, stderr entries left out."""
  entry = results.get("results", {}).get(task)
  if entry is None:
    entry = results.get("groups", {}).get(task, {})
  return {
      k: v
      for k, v in entry.items()
      if k not in _NOT_METRICS and "_stderr" not in k and isinstance(v, (int, float)) and not isinstance(v, bool)
  }


def responses_digest(samples: Optional[list]) -> Optional[str]:
  """sha256 of the harness's raw responses, document by document (what `identical` compares); the harness logs
  one sample per (document, filter), with the same responses."""
  if samples is None:
    return None
  resps = sorted({(str(s["doc_id"]), json.dumps(s["resps"], sort_keys=True, default=str)) for s in samples})
  return hashlib.sha256(json.dumps(resps).encode("utf-8")).hexdigest()


def _json_safe(obj):
  from lm_eval.utils import handle_non_serializable

  return json.loads(json.dumps(obj, default=handle_non_serializable))


def evaluate_one(cfg, lm, task: str, tm) -> dict:
  """One harness run of one task with the backend `lm`; returns the harness results (samples included)."""
  import lm_eval

  lm.reset_stats()
  return lm_eval.simple_evaluate(
      model=lm,
      tasks=[task],
      num_fewshot=cfg.num_fewshot,
      limit=cfg.limit,
      gen_kwargs=cfg.gen_kwargs or None,
      bootstrap_iters=cfg.bootstrap_iters,
      log_samples=True,
      random_seed=cfg.seed,
      numpy_random_seed=cfg.seed,
      fewshot_random_seed=cfg.seed,
      task_manager=tm,
      confirm_run_unsafe_code=bool(cfg.allow_code_execution),
      apply_chat_template=bool(cfg.get("apply_chat_template", False)),
  )


def prompt_cuts(lm, samples: Optional[list]) -> Optional[dict]:
  """How many generation prompts the backend cut from the left to fit the context (its rule: keep the last
  max_len - max_gen_toks tokens): {'prompts', 'cut', 'kept_tokens'} (None without samples), so that the table
  does not call a prompt n-shot when most of its shots were cut away."""
  if samples is None:
    return None
  prompts, cut, kept, seen = 0, 0, None, set()
  for sample in samples:
    for args in sample["arguments"]:
      key = (str(sample["doc_id"]), json.dumps(args, sort_keys=True, default=str))
      if key in seen or not (isinstance(args, (list, tuple)) and len(args) == 2 and isinstance(args[1], dict)):
        continue  # a repeat (one sample per filter), or a loglikelihood request (not cut)
      seen.add(key)
      keep = lm.cfg.max_len - lm._sampling(dict(args[1]))[1]
      prompts += 1
      cut += len(lm.tok_encode(args[0])) > keep
      kept = keep if kept is None else min(kept, keep)
  return {"prompts": prompts, "cut": cut, "kept_tokens": kept}


def shots_label(row: dict) -> str:
  """'8' or '8, 10/10 cut to the last 160 tok' (few-shot prompts the backend cut to fit the context)."""
  shots = row.get("n_shot")
  text = "-" if shots is None else str(shots)
  pc = row.get("prompt_cut") or {}
  if pc.get("cut"):
    text += f", {pc['cut']}/{pc['prompts']} cut to the last {pc['kept_tokens']} tok"
  return text


def make_row(base: dict, label: str, res: dict, speed: Optional[dict], task: str, seconds: float, cuts=None) -> dict:
  """A JSONL row: what ran, the task's metrics (primary first), speed statistics and the harness's results."""
  metrics = metrics_of(res, task)
  primary = next(iter(metrics), None)
  samples = res.get("samples", {})
  task_samples = samples.get(task)
  if task_samples is None and samples:  # a group: every subtask's samples
    task_samples = [dict(s, doc_id=(t, s["doc_id"])) for t in sorted(samples) for s in samples[t]]
  row = dict(base)
  row.update(
      {
          "method": label,
          "metric": primary,
          "accuracy": metrics.get(primary),
          "metrics": metrics,
          "docs": sum(v.get("effective", 0) for v in res.get("n-samples", {}).values()),
          "n_shot": res.get("n-shot", {}).get(task),
          "prompt_cut": cuts,
          "speed": speed,
          "greedy": None if speed is None else speed.get("greedy"),
          "responses_sha256": responses_digest(task_samples),
          "eval_seconds": seconds,
          "time": time.strftime("%Y-%m-%d %H:%M:%S"),
          "lm_eval": _json_safe({k: v for k, v in res.items() if k != "samples"}),
      }
  )
  return row


def _write_samples(cfg, task: str, label: str, res: dict):
  path = os.path.join(cfg.out_dir, "samples", f"{task}__{label}.jsonl")
  rows = [dict(s, task=t) for t, ss in res.get("samples", {}).items() for s in ss]
  atomic_write_text(path, "".join(json.dumps(_json_safe(r)) + "\n" for r in rows))


def with_ratios(rows: List[dict]) -> List[dict]:
  """Rows with `ratio_vs_ar` (tokens/s over the AR row's of the same task) and `identical_to_ar` (responses)."""
  out = []
  for r in rows:
    ar = next((x for x in rows if x["task"] == r["task"] and x["method"] == "ar"), None)
    r = dict(r)
    sp, arsp = r.get("speed"), (ar or {}).get("speed")
    r["ratio_vs_ar"] = sp["tokens_per_second"] / arsp["tokens_per_second"] if sp and arsp else None
    sampled = r.get("greedy") is False or (ar or {}).get("greedy") is False  # sampled outputs differ by design
    r["identical_to_ar"] = None if ar is None or sampled else r["responses_sha256"] == ar["responses_sha256"]
    out.append(r)
  return out


def _fmt(v, spec: str, missing: str = "-") -> str:
  return missing if v is None else format(v, spec)


def table(rows: List[dict]) -> str:
  """The markdown table of the rows (see the module docstring)."""
  head = (
      "| model | task | shots | method | metric | accuracy | tok/s | ratio vs AR | mean acc. len | commits f/s/r "
      "| identical | docs |"
  )
  lines = [head, "|" + "---|" * 12]
  for r in rows:
    sp = r.get("speed")
    commits = "-" if not sp else "{first}/{second}/{restart}".format(**sp["commits"])
    ratio = "-" if r.get("ratio_vs_ar") is None else f"{r['ratio_vs_ar']:.2f}x"
    ident = r.get("identical_to_ar")
    lines.append(
        f"| {r['model']} | {r['task']} | {shots_label(r)} | {r['method']} | {r.get('metric') or '-'} | {_fmt(r.get('accuracy'), '.3f')} | "
        f"{_fmt(sp and sp['tokens_per_second'], '.1f')} | {ratio} | {_fmt(sp and sp['mean_accepted_length'], '.2f')} | "
        f"{commits} | {'-' if ident is None else ('yes' if ident else 'NO')} | {r.get('docs', '-')} |"
    )
  return "\n".join(lines)


# The backend's model arguments the config may set, with their defaults (a default is left out of a row's key).
_BACKEND_DEFAULTS = {"init_state": "zeros", "chat_template": "", "enable_thinking": None, "think_end_token": ""}


def backend_settings(cfg) -> dict:
  """The config's model arguments of the backend that are not the default."""
  return {k: cfg.get(k, d) for k, d in _BACKEND_DEFAULTS.items() if cfg.get(k, d) != d}


def run_evaluation(cfg, model=None) -> dict:
  """Runs (or resumes) the evaluation; returns {'rows': this run's rows with ratios, 'table': markdown}."""
  tasks, methods = check_config(cfg)
  _set_environment(cfg, tasks)
  from loopspec_jax.integrations import lm_eval as backend  # registers the backend; imports the harness

  dtype = backend.check_dtype(cfg.dtype)  # a clear error before the model loads
  tm = task_manager(tasks)
  tasks = expand_tags(tm, tasks)
  check_code_opt_in(cfg, tasks)
  label_of = {m.label: m for m in methods}
  jsonl = os.path.join(cfg.out_dir, "eval.jsonl")
  existing = {row["key"]: row for row in DA.read_jsonl(jsonl)}
  model_label = cfg.get("model_label") or cfg.model
  ident = {
      "model": cfg.model if model is None else (cfg.get("model_label") or model.source or cfg.model),
      "tokenizer": cfg.tokenizer or None,
      "dtype": cfg.dtype,
      "limit": cfg.limit,
      "num_fewshot": cfg.num_fewshot,
      "gen_kwargs": cfg.gen_kwargs or None,
      "batch_size": cfg.batch_size,
      "max_gen_toks": cfg.max_gen_toks,
      "depth": cfg.depth,
      "seed": cfg.seed,
  }
  ident.update(backend_settings(cfg))  # only where not the default: the keys of earlier rows stay valid
  ident.update({"apply_chat_template": True} if cfg.get("apply_chat_template") else {})
  keys = {(t, l): DA.run_key(**ident, task=t, method=l) for t in tasks for l in label_of}
  todo = [(t, l) for t in tasks for l in label_of if keys[(t, l)] not in existing]
  skipped = [f"{t} / {l}" for t in tasks for l in label_of if keys[(t, l)] in existing]
  if skipped:  # said even without progress: a resumed table mixes runs
    print(f"resuming: {len(skipped)} row(s) already in {jsonl}, skipped: {'; '.join(skipped)}", flush=True)
  new_rows = 0
  try:
    if todo:
      if model is None:
        model = loopspec_jax.load(cfg.model, dtype=dtype)
      lms = {}
      for task, label in todo:
        if cfg.get("stop_after") is not None and new_rows >= cfg.stop_after:
          raise EvaluationInterrupted(f"stopped after {new_rows} new rows (stop_after)")
        if label not in lms:
          lms[label] = backend.LoopSpecLM(
              model=model,
              tokenizer=cfg.tokenizer or None,
              method=label_of[label],
              batch_size=cfg.batch_size,
              max_gen_toks=cfg.max_gen_toks,
              depth=cfg.depth,
              seed=cfg.seed,
              warmup=cfg.warmup,
              **backend_settings(cfg),
          )
        if cfg.progress:
          print(f"evaluate {model_label} / {task} / {label}", flush=True)
        t0 = time.perf_counter()
        res = evaluate_one(cfg, lms[label], task, tm)
        speed = lms[label].speed_stats()  # every call since evaluate_one's reset (a group's subtasks too)
        base = {"key": keys[(task, label)], "model": model_label, "task": task, "settings": ident}
        cuts = prompt_cuts(lms[label], res.get("samples", {}).get(task))
        row = make_row(base, label, res, speed, task, time.perf_counter() - t0, cuts)
        if is_main_process():
          if cfg.log_samples:
            _write_samples(cfg, task, label, res)
          DA.append_jsonl(jsonl, row)
        existing[row["key"]] = row
        new_rows += 1
  finally:
    rows = with_ratios([existing[keys[(t, l)]] for t in tasks for l in label_of if keys[(t, l)] in existing])
    text = table(rows)
    if is_main_process() and rows:
      atomic_write_text(os.path.join(cfg.out_dir, "eval.md"), text + "\n")
  return {"rows": rows, "table": text, "new_rows": new_rows}
