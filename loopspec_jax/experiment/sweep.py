"""(d1, d2) and chain-gamma sweep against AR, compared with the cost identity and Theorem 2's prediction.

Per (task, sampling): an AR reference (measured once, stored as a row and reused for every ratio, also by
a resumed run), then every LoopSpec pair of the grid (`theory.feasible_configs`, optionally restricted) and
the chain baseline for each draft length at one draft depth. Each configuration decodes every prompt once
untimed (compile) and `repeats` times timed (decode after prefill, summed over prompts, median). A row
holds the wall-clock ratio to AR, gamma (mean accepted length; LoopSpec also the tick-based value), commit
sources, gate-open and rejection rates, the cost C and gamma = R / C predicted from the measured rates
(`theory.expected_cost` with P(reject x1) = reject_first / N, P(restart) = restart / N), and for greedy
decoding whether the tokens equal AR's. Rows are appended to <out_dir>/sweep.jsonl one at a time (a single
fsynced line); a rerun skips keys already present (model, task, sampling, method config, prompt settings),
so a killed sweep loses at most the configuration in flight and never duplicates one. <out_dir>/sweep.md
tables every group and marks the measured best and Theorem 2's predicted best (from the depth JSON).

The classic speculative baselines can be rows of the same run: a separate draft model (`draft_model`, a bundled
name or checkpoint loaded once, for each of `draft_gammas`, "auto" allowed) and prompt lookup (`lookup_ngram`,
`lookup_gammas`). Their rows hold tokens per verify pass, the acceptance rate (accepted / offered drafts), the
per-draft acceptance alpha (accepted / examined drafts), drafts offered per pass and the draft cost share
(`decoding/draft.py` `draft_figures` of the prompts' summed `DecodeStats`), and a table compares every method
of the group (AR, chain, draft, lookup, LoopSpec) by those and the wall-clock ratio.

This module runs the sweep (the measurement loop, the cost projection); the grid and the files read beside the
rows are sweep_grid.py, the row statistics sweep_stats.py, the tables sweep_report.py and the greedy replay
(`--config.mode=replay`) sweep_replay.py; the timing (warm-up, repeats, interleaved AR) is timing.py. The command
line is experiments/sweep.py:

  loopspec-sweep                                    # configs/sweeps/default.py
  loopspec-sweep --config=sweeps/default.py:quick   # a few configurations
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, List

from tqdm import tqdm

from loopspec_jax import methods
from loopspec_jax.analysis import accelerators
from loopspec_jax.analysis import cost
from loopspec_jax.analysis import depth_metrics as DA
from loopspec_jax.config import ModelConfig
from loopspec_jax.experiment import files
from loopspec_jax.experiment import models
from loopspec_jax.experiment import prompts as prompt_sets
from loopspec_jax.experiment import settings
from loopspec_jax.experiment import sweep_grid
from loopspec_jax.experiment import sweep_report
from loopspec_jax.experiment import sweep_stats
from loopspec_jax.experiment import timing
from loopspec_jax.parallel import distributed


class SweepInterrupted(RuntimeError):
  """Raised after `stop_after` new rows (the config's stand-in for a killed sweep)."""


_DRAFTERS: Dict[str, object] = {}


def load_drafter(spec: str, model=None):
  """The draft model of `spec` (a bundled name or checkpoint directory), loaded once per process; `model`
  registers an already built one under that name (tests, a caller that loaded it)."""
  if model is not None:
    _DRAFTERS[spec] = model
  if spec not in _DRAFTERS:
    _DRAFTERS[spec] = models.resolve_model(spec)
  return _DRAFTERS[spec]


# ----------------------------------------------------------------------------------------------------------
# The measurement loop
# ----------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Sweep:
  """One run of the sweep: its config, model, the rows already in sweep.jsonl (by key), the keys of this run
  in order and the count of rows measured by it (for `stop_after`)."""

  cfg: object
  model: object
  existing: Dict[str, dict]
  bar: object
  keys: List[str] = dataclasses.field(default_factory=list)
  new_rows: int = 0

  @property
  def jsonl(self) -> str:
    return os.path.join(self.cfg.out_dir, "sweep.jsonl")

  def group(self, task: str, samp: str, prompts: list, specs: List[methods.Method]):
    """AR, then every method of `specs`, on one (task, sampling); rows already present are skipped."""
    cfg = self.cfg
    sampling = dict(cfg.sampling_settings[samp])
    base_key = dict(
        models.model_identity(cfg),
        task=task,
        sampling=sampling,
        num_prompts=len(prompts),
        max_new_tokens=cfg.max_new_tokens,
        prompt_len=cfg.prompt_len if task == "random" else None,
        max_prompt_tokens=cfg.get("max_prompt_tokens"),
        eos_id=cfg.get("eos_id"),
    )
    if cfg.get("lane_capacity"):  # part of the key only when set (rows of the default capacity keep theirs)
      base_key["lane_capacity"] = cfg.lane_capacity
    base = {
        "model": cfg.get("model_label") or cfg.model,
        "task": task,
        "sampling": samp,
        "sampling_settings": sampling,
        "num_prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens,
        "repeats": cfg.repeats,
        "lane_capacity": cfg.get("lane_capacity"),
    }
    print(f"sweep {base['model']} / {task} / {samp}: {len(prompts)} prompts, {len(specs)} configurations", flush=True)
    ar_key = DA.run_key(**base_key, method="ar")
    for m in [methods.AR()] + specs:
      drafter = sweep_grid.drafter_name(cfg, m)
      label = sweep_grid.row_label(m, drafter)
      key = DA.run_key(**base_key, method=label)
      self.keys.append(key)
      if key not in self.existing:
        ar_row = None if isinstance(m, methods.AR) else self.existing[ar_key]  # AR comes first in every group
        self.measure_row(dict(base, key=key), m, label, drafter, prompts, sampling, ar_row)
      self.bar.update(1)

  def measure_row(self, base: dict, m: methods.Method, label: str, drafter, prompts, sampling, ar_row):
    """Measures one configuration and appends its row (process 0 writes it: one row however many run)."""
    cfg = self.cfg
    if cfg.get("stop_after") and self.new_rows >= cfg.stop_after:
      raise SweepInterrupted(f"stopped after {self.new_rows} new rows (stop_after)")
    self.bar.set_postfix_str(f"{base['task']}/{base['sampling']}/{label}")
    if isinstance(m, methods.Draft):  # its drafter, loaded once when a draft row is first measured
      m = dataclasses.replace(m, draft_model=load_drafter(drafter))
    greedy = float(sampling.get("temperature", 0.0)) == 0.0
    kw = dict(max_new_tokens=cfg.max_new_tokens, repeats=cfg.repeats, seed=cfg.seed, eos_id=cfg.get("eos_id"))
    agg, times, outputs, ar_times, stats = timing.measure(
        self.model, prompts, m, sampling, **kw, interleave_ar=bool(cfg.get("interleave_ar", False))
    )
    r = self.model.config.recurrence
    per_prompt = sweep_stats.per_prompt_counts(stats)
    row = sweep_stats.make_row(
        base,
        m,
        label,
        agg,
        times,
        r,
        ar_row,
        outputs,
        greedy,
        ar_times=ar_times,
        per_prompt=per_prompt,
        drafter=drafter,
    )
    if files.is_main_process():
      DA.append_jsonl(self.jsonl, row)
    self.existing[base["key"]] = row
    self.new_rows += 1


def run_sweep(cfg, model, draft_model=None) -> dict:
  """Runs (or resumes) the sweep of `model`; returns {'rows': all rows of this run's keys, 'table': markdown,
  'predictions'}.

  `draft_model`: an already built drafter for the config's `draft_model` name (else it is loaded once)."""
  if cfg.get("draft_model") and draft_model is not None:
    load_drafter(str(cfg.draft_model), draft_model)
  r = model.config.recurrence
  jsonl = os.path.join(cfg.out_dir, "sweep.jsonl")
  # process 0's rows on every process (only it may see the file), so all processes skip the same keys
  rows = distributed.broadcast_json(DA.read_jsonl(jsonl) if files.is_main_process() else None)
  specs = sweep_grid.method_specs(cfg, r)
  groups = [(t, s) for t in settings.split_list(cfg.tasks) for s in settings.split_list(cfg.samplings)]
  bar = tqdm(total=len(groups) * (len(specs) + 1), desc="sweep", disable=not cfg.get("progress", True))
  run = _Sweep(cfg, model, {row["key"]: row for row in rows}, bar)
  try:
    prompts_by_task = {}
    for task, samp in groups:
      if task not in prompts_by_task:
        prompts_by_task[task] = prompt_sets.prompts_for(cfg, task, model)
      run.group(task, samp, prompts_by_task[task], specs)
      timing.release_compiled()  # as the bench does between groups (JIT code mappings)
  finally:
    bar.close()
    result = tabulate(cfg, groups, [run.existing[k] for k in run.keys if k in run.existing], r)
  return result


def tabulate(cfg, groups: list, rows: List[dict], r: int) -> dict:
  """The rows with their derived fields recomputed from the current depth JSON, replay and projection (never
  stored), and the markdown table (written to <out_dir>/sweep.md, or `table_md`)."""
  summaries = {(t, s): sweep_grid.load_depth_summary(cfg, t, s, r) for t, s in groups}
  replay_path = cfg.get("replay_jsonl") or os.path.join(cfg.out_dir, "replay.jsonl")
  replayed = {(y["task"], y["label"]): y for y in DA.read_jsonl(replay_path, repair=False)}
  rows = sweep_stats.with_derived(rows, summaries, sweep_grid.load_projection(cfg), replayed)
  preds = {(t, s): sweep_grid.load_prediction(cfg, t, s, r) for t, s in groups}
  table = sweep_report.summary_markdown(rows, preds)
  if files.is_main_process() and rows:
    files.atomic_write_text(os.path.join(cfg.out_dir, cfg.get("table_md") or "sweep.md"), table + "\n")
  return {"rows": rows, "table": table, "predictions": preds}


# ----------------------------------------------------------------------------------------------------------
# Projection onto an accelerator at a real model's shape (loopspec_jax/analysis/cost.py)
# ----------------------------------------------------------------------------------------------------------
def _projection_method(row: dict) -> methods.Method:
  """The method whose loop `sweep_stats.projection_key` names: LoopSpec with any d2 of the right kind (d2 only
  decides which lanes read out), chain at the row's draft length, AR."""
  if row["method"] == methods.LoopSpec.name:
    return methods.LoopSpec(d1=row["d1"], d2=None if row["d2"] is None else 2 * row["d1"])
  if row["method"] == methods.Chain.name:
    return methods.Chain(d1=row["d1"], gamma=row["draft_len"])
  return methods.AR()


def project_costs(cfg, rows: List[dict], projection_config: ModelConfig) -> dict:
  """Compiles (from abstract shapes) one iteration of every loop the rows need at `projection_config`'s shape
  (the config of `cfg.projection_model`) and stores its roofline seconds on `projection_accelerator` in
  projection.json (resumable, one key at a time)."""
  path = sweep_grid.projection_path(cfg)
  data = sweep_grid.load_projection(cfg) or {}
  acc = accelerators.ACCELERATORS[cfg.projection_accelerator]
  pcfg = projection_config.replace(dtype="bfloat16", max_len=int(cfg.projection_context))
  meta = {
      "model": cfg.projection_model,
      "context": int(cfg.projection_context),
      "dtype": "bfloat16",
      "accelerator": cfg.projection_accelerator,
      "peak_flops": acc["peak_flops"],
      "hbm_bandwidth": acc["hbm_bandwidth"],
  }
  if data.get("meta") != meta:
    data = {"meta": meta, "loops": {}}
  loops = {"ar": methods.AR()}
  loops.update({k: _projection_method(x) for x in rows for k in [sweep_stats.projection_key(x)] if k})
  for k in ["ar"] + sorted(k for k in loops if k != "ar"):
    m = loops[k]
    if k in data["loops"] or (isinstance(m, methods.LoopSpec) and m.d2 is not None and m.d2 >= pcfg.recurrence):
      continue
    args = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}  # the decoder's own arguments
    compiled = cost.compile_decode_loop(pcfg, m.name, greedy=True, **args)
    step = cost.loop_cost(compiled)
    data["loops"][k] = {
        "seconds": cost.step_seconds(step, acc["peak_flops"], acc["hbm_bandwidth"]),
        "flops": step.flops,
        "bytes": step.total_bytes,
        "compile_seconds": compiled.compile_seconds,
    }
    print(f"projection {k}: {data['loops'][k]['seconds'] * 1e3:.2f} ms per iteration", flush=True)
    if files.is_main_process():
      files.atomic_write_json(path, data)
  return data
