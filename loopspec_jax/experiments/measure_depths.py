"""Depth analysis: how close each depth's readout is to depth R along full-depth decoded text.

For every (task, sampling) of the config: decode each prompt with AR, read out every depth on prompt +
generated tokens in one jitted forward, and record greedy agreement, TV(p_r, p_R) and KL(p_R || p_r) at the
generated positions (loopspec_jax/analysis/depth_metrics.py). Per-prompt records are appended to
<out_dir>/depths.jsonl as they finish, so a rerun skips what is done. Writes per (task, sampling)
depths_<task>_<sampling>.json (per-depth means, power-law fits, Theorem 2's optimum and best feasible pair)
and depths_<task>_<sampling>.png.

  loopspec-measure-depths                                 # loopspec_jax/configs/sweeps/depths.py
  loopspec-measure-depths --config=sweeps/depths.py:tiny  # test-sized
"""

from __future__ import annotations

import os
import time

from absl import flags
from ml_collections import config_flags

from loopspec_jax.analysis import depth_metrics as DA
from loopspec_jax.experiments import common

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("sweeps/depths.py"), "Depth analysis settings.", flag_values=FLAGS
)


def summary_path(out_dir: str, task: str, sampling: str, ext: str = "json") -> str:
  return os.path.join(out_dir, f"depths_{task}_{sampling}.{ext}")


def run_depths(cfg, model=None) -> dict:
  """Runs the measurement for every (task, sampling); returns {(task, sampling): summary}."""
  model = model or common.load_model(cfg)
  ident = common.model_identity(cfg)
  label = cfg.get("model_label") or cfg.model
  r = model.config.recurrence
  jsonl = os.path.join(cfg.out_dir, "depths.jsonl")
  out = {}
  for task in common.split_list(cfg.tasks):
    prompts = common.prompts_for(cfg, task, model)
    for samp in common.split_list(cfg.samplings):
      sampling = dict(cfg.sampling_settings[samp])
      key = DA.run_key(
          **ident,
          task=task,
          sampling=sampling,
          max_new_tokens=cfg.max_new_tokens,
          prompt_len=cfg.prompt_len if task == "random" else None,
          max_prompt_tokens=cfg.get("max_prompt_tokens"),
          eos_id=cfg.get("eos_id"),
      )
      print(f"depths: {label}, task {task}, {samp}: {len(prompts)} prompts", flush=True)
      records = DA.measure_depths(
          model,
          prompts,
          sampling=sampling,
          max_new_tokens=cfg.max_new_tokens,
          seed=cfg.seed,
          eos_id=cfg.get("eos_id"),
          out_jsonl=jsonl,
          key=key,
          progress=cfg.get("progress", True),
      )
      meta = {
          "model": label,
          **ident,
          "task": task,
          "sampling_name": samp,
          "sampling": sampling,
          "max_new_tokens": cfg.max_new_tokens,
          "time": time.strftime("%Y-%m-%d %H:%M:%S"),
      }
      summary = DA.summarize_depths(records, r, include_single=cfg.include_single, meta=meta)
      if common.is_main_process():
        common.atomic_write_json(summary_path(cfg.out_dir, task, samp), summary)
        DA.plot_depths(summary, summary_path(cfg.out_dir, task, samp, "png"), title=f"{label}: {task}, {samp} (R={r})")
      out[(task, samp)] = summary
      print(format_summary(summary, f"{label} / {task} / {samp}"))
  return out


def format_summary(s: dict, title: str) -> str:
  lines = [
      f"## {title}: {s['positions']} positions over {s['prompts']} prompts",
      "| depth | agreement | mean TV | mean KL |",
      "|---|---|---|---|",
  ]
  for d, a, t, k in zip(s["depths"], s["agreement"], s["mean_tv"], s["mean_kl"]):
    lines.append(f"| {d} | {a:.3f} | {t:.4f} | {k:.4f} |")
  for name, f in s["fits"].items():
    if f:
      lines.append(f"fit {name}: beta={f['beta']:.4g} alpha={f['alpha']:.3f}")
  t2 = s.get("theorem2")
  if t2:
    lines.append(
        f"Theorem 2 optimum (d1*, d2*) = ({t2['optimal_continuous'][0]:.3f}, "
        f"{t2['optimal_continuous'][1]:.3f}); best feasible {tuple(t2['best_feasible'])}, "
        f"guaranteed gamma >= {t2['predicted_gamma_bound']:.2f}"
    )
  return "\n".join(lines)


def main(argv):
  del argv
  run_depths(_CONFIG.value)


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
