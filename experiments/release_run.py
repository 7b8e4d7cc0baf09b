"""Runs one of the LoopSpec release's experiments (configs/release/suite.py) through loopspec-evaluate.

  python -m loopspec_experiments.release_run --config=release/suite.py:110     # bundled models, 2 docs

For each release model, sampling and task of the preset: the task's shots, budget and seed 1234, every depth
configuration of the model as one method ('baseline' -> 'ar', 'K:X' -> 'loopspec:K:X'), one request at a time,
through `evaluate.run_evaluation` (rows appended to <out_dir>/<model>/eval.jsonl as they are measured). Tasks
that cannot run here are named and skipped: with `bundled`, a task with no offline twin in loopspec_jax/tasks.
A chat task (the thinking models' presets) runs through the model's chat template with thinking enabled
(`apply_chat_template`, `enable_thinking`; the response is the text after `think_end_token` when one is set). Writes <out_dir>/release.md.
"""

from __future__ import annotations

import os

from absl import flags
from ml_collections import config_flags

from loopspec_configs.eval import default as eval_default
from loopspec_configs.release import suite
from loopspec_experiments import common
from loopspec_experiments import evaluate

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("release/suite.py"), "Release preset.", flag_values=FLAGS
)


def method_spec(depth: str, lane_capacity: str = "") -> str:
  """The release's configuration name -> our method spec: 'baseline' -> 'ar', '2:4' -> 'loopspec:2:4' (with
  the lane capacity, if given)."""
  if depth == "baseline":
    return "ar"
  return f"loopspec:{depth}" + (f",lane_capacity={lane_capacity}" if lane_capacity else "")


def resolve_task(name: str, bundled: bool):
  """(lm-eval task to run, None) or (None, why it cannot run here)."""
  lm_task = suite.TASKS[name][0]
  if not bundled:
    return lm_task, None
  twin = suite.OFFLINE.get(lm_task)
  if twin is None:
    return None, f"{name}: no offline copy of the data set {lm_task!r} ships here (loopspec_jax/data)"
  return twin, None


def resolve_model(name: str, cfg) -> str:
  if not cfg.bundled:
    return cfg.models.get(name, name)
  prefix = next(p for p in suite.BUNDLED if name.startswith(p))
  return suite.BUNDLED[prefix]


def eval_config(cfg, model: str, task: str, depths: list, sampling: dict, release_task: str, out_dir: str):
  """The loopspec-evaluate config of one (model, task, sampling) job."""
  _, shots, max_gen, _, chat = suite.TASKS[release_task]
  if cfg.bundled:
    max_gen = min(max_gen, cfg.max_gen_toks_cap)
  gen = [f"max_gen_toks={max_gen}"]
  if sampling:
    gen += ["do_sample=true", f"temperature={sampling['temperature']}", f"top_p={sampling['top_p']}"]
  else:
    gen += ["do_sample=false", "temperature=0"]
  c = eval_default.get_config()
  c.model = model
  c.dtype = cfg.dtype
  c.tasks = task
  c.methods = ";".join(method_spec(d, cfg.lane_capacity) for d in depths)
  c.limit = cfg.limit
  c.num_fewshot = shots
  c.gen_kwargs = ",".join(gen)
  c.seed = cfg.seed
  c.allow_code_execution = cfg.allow_code_execution
  c.bootstrap_iters = 0
  c.out_dir = out_dir
  if chat:  # the release's thinking presets: the chat template, thinking on
    c.apply_chat_template, c.enable_thinking, c.think_end_token = True, True, cfg.think_end_token
  return c


def main(argv):
  del argv
  cfg = _CONFIG.value
  jobs = suite.experiment(cfg.experiment)
  include = common.split_list(cfg.include) if cfg.include else None
  unknown = sorted(set(include or []) - {job.get("model", key) for key, job in jobs.items()})
  if unknown:
    raise ValueError(f"include names models that experiment {cfg.experiment} does not run: {unknown}")
  jobs = {k: j for k, j in jobs.items() if include is None or j.get("model", k) in include}
  tables, missing = [], []
  for key, job in jobs.items():
    name = job.get("model", key)
    model = resolve_model(name, cfg)
    for samp_name, sampling in job["samplings"].items():
      for release_task in job["tasks"]:
        task, why = resolve_task(release_task, cfg.bundled)
        if task is None:
          missing.append(f"{name} / {samp_name} / {why}")
          print(f"skipped {missing[-1]}", flush=True)
          continue
        code = release_task.startswith(("humaneval", "mbpp"))
        if code and not cfg.allow_code_execution:
          missing.append(
              f"{name} / {samp_name} / {release_task}: runs model-written code: --config.allow_code_execution=true"
          )
          print(f"skipped {missing[-1]}", flush=True)
          continue
        out = os.path.join(cfg.out_dir, name, f"{release_task}__{samp_name}")
        res = evaluate.run_evaluation(eval_config(cfg, model, task, job["depths"], sampling, release_task, out))
        tables.append(f"### {name} ({model}), {release_task}, {samp_name}\n\n{res['table']}\n")
  text = f"# Release experiment {cfg.experiment}\n\n" + "\n".join(tables)
  if missing:
    text += "\nNot run here:\n\n" + "\n".join(f"- {m}" for m in missing) + "\n"
  print(text)
  if common.is_main_process():
    common.atomic_write_text(os.path.join(cfg.out_dir, "release.md"), text)


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
