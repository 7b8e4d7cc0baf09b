"""Depth analysis: how close each depth's readout is to depth R along full-depth decoded text.

For every (task, sampling) of the config: decode each prompt with AR, read out every depth on prompt +
generated tokens in one jitted forward, and record greedy agreement, TV(p_r, p_R) and KL(p_R || p_r) at the
generated positions (loopspec_jax/analysis/depth_metrics.py). Per-prompt records are appended to
<out_dir>/depths.jsonl as they finish, so a rerun skips what is done. Writes per (task, sampling)
depths_<task>_<sampling>.json (per-depth means with standard errors across prompts, power-law fits with their
fit quality, Theorem 2's optimum and best feasible pair), depths_<task>_<sampling>.png, and depth_fits.md (one
table over every (task, sampling) of the run).

The command line is experiments/measure_depths.py (`loopspec-measure-depths`); the sweep reads the summaries
(sweep_grid.load_depth_summary).
"""

from __future__ import annotations

import os
import time

from loopspec_jax.analysis import depth_metrics as DA
from loopspec_jax.analysis import depth_plots
from loopspec_jax.experiment import files
from loopspec_jax.experiment import models
from loopspec_jax.experiment import prompts as prompt_sets
from loopspec_jax.experiment import settings


def summary_path(out_dir: str, task: str, sampling: str, ext: str = "json") -> str:
  """Where a (task, sampling)'s summary (ext "json") or plot ("png") goes: out_dir/depths_<task>_<sampling>.<ext>."""
  return os.path.join(out_dir, f"depths_{task}_{sampling}.{ext}")


def run_depths(cfg, model) -> dict:
  """Runs the measurement of `model` for every (task, sampling) of `cfg`; returns {(task, sampling): summary}."""
  ident = models.model_identity(cfg)
  label = cfg.get("model_label") or cfg.model
  r = model.config.recurrence
  jsonl = os.path.join(cfg.out_dir, "depths.jsonl")
  out = {}
  for task in settings.split_list(cfg.tasks):
    prompts = prompt_sets.prompts_for(cfg, task, model)
    for samp in settings.split_list(cfg.samplings):
      sampling = dict(cfg.sampling_settings[samp])
      more = dict(cfg.get("num_prompts_by_group") or {}).get(f"{task}_{samp}")
      group_prompts = prompts
      if more and more != len(prompts):  # a group whose rates vary more across prompts gets more of them
        group_prompts = prompt_sets.prompts_for(cfg, task, model, num_prompts=int(more))
      key = DA.run_key(
          **ident,
          task=task,
          sampling=sampling,
          max_new_tokens=cfg.max_new_tokens,
          prompt_len=cfg.prompt_len if task == "random" else None,
          max_prompt_tokens=cfg.get("max_prompt_tokens"),
          eos_id=cfg.get("eos_id"),
      )
      print(f"depths: {label}, task {task}, {samp}: {len(group_prompts)} prompts", flush=True)
      records = DA.measure_depths(
          model,
          group_prompts,
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
      if files.is_main_process():
        files.atomic_write_json(summary_path(cfg.out_dir, task, samp), summary)
        depth_plots.plot_depths(
            summary, summary_path(cfg.out_dir, task, samp, "png"), title=f"{label}: {task}, {samp} (R={r})"
        )
      out[(task, samp)] = summary
      print(format_summary(summary, f"{label} / {task} / {samp}"))
  if files.is_main_process() and out:
    files.atomic_write_text(os.path.join(cfg.out_dir, "depth_fits.md"), fits_markdown(list(out.values())) + "\n")
  return out


def fits_markdown(summaries: list, depths=(1, 2, 4, 8)) -> str:
  """One table over (task, sampling) summaries: positions, agreement at a few depths with standard errors
  (across prompts), the envelope and least-squares power laws with their fit quality, Theorem 2's optimum."""
  r_all = {s["recurrence"] for s in summaries}
  depths = [d for d in depths if all(d <= r for r in r_all)]
  head = ["model", "task", "sampling", "prompts x tokens"] + [f"agree d={d}" for d in depths]
  head += [f"TV d={d}" for d in depths[:2]]
  head += ["envelope beta, alpha", "LS beta, alpha", "LS R^2", "LS rmse (log)", "(d1*, d2*)", "best feasible"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for s in summaries:
    m = s.get("meta", {})
    cells = [
        m.get("model", ""),
        m.get("task", ""),
        m.get("sampling_name", ""),
        f"{s['prompts']} x {s['positions'] // max(s['prompts'], 1)}",
    ]
    se_a = s.get("agreement_se") or [0.0] * len(s["depths"])
    se_t = s.get("mean_tv_se") or [0.0] * len(s["depths"])
    cells += [f"{s['agreement'][d - 1]:.3f} ± {se_a[d - 1]:.3f}" for d in depths]
    cells += [f"{s['mean_tv'][d - 1]:.3f} ± {se_t[d - 1]:.3f}" for d in depths[:2]]
    env, ls = s["fits"].get("envelope"), s["fits"].get("least_squares")
    cells.append(f"{env['beta']:.3g}, {env['alpha']:.2f}" if env else "-")
    cells.append(f"{ls['beta']:.3g}, {ls['alpha']:.2f}" if ls else "-")
    cells.append(f"{ls['r2']:.3f}" if ls and ls.get("r2") is not None else "-")
    cells.append(f"{ls['rmse_log']:.2f}" if ls and ls.get("rmse_log") is not None else "-")
    t2 = s.get("theorem2")
    if t2:
      o, b = t2["optimal_continuous"], t2["best_feasible"]
      cells += [f"({o[0]:.2f}, {o[1]:.2f})", f"({b[0]}, {'-' if b[1] is None else b[1]})"]
    else:
      cells += ["-", "-"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def format_summary(s: dict, title: str) -> str:
  """One summary as markdown: per-depth agreement, TV and KL, the power-law fits and Theorem 2's optimum."""
  lines = [
      f"## {title}: {s['positions']} positions over {s['prompts']} prompts",
      "| depth | agreement | mean TV | mean KL |",
      "|---|---|---|---|",
  ]
  for d, a, t, k in zip(s["depths"], s["agreement"], s["mean_tv"], s["mean_kl"]):
    lines.append(f"| {d} | {a:.3f} | {t:.4f} | {k:.4f} |")
  for name, f in s["fits"].items():
    if f:
      q = f" (R^2 {f['r2']:.3f}, rmse log {f['rmse_log']:.2f})" if f.get("r2") is not None else ""
      lines.append(f"fit {name}: beta={f['beta']:.4g} alpha={f['alpha']:.3f}{q}")
  t2 = s.get("theorem2")
  if t2:
    lines.append(
        f"Theorem 2 optimum (d1*, d2*) = ({t2['optimal_continuous'][0]:.3f}, "
        f"{t2['optimal_continuous'][1]:.3f}); best feasible {tuple(t2['best_feasible'])}, "
        f"guaranteed gamma >= {t2['predicted_gamma_bound']:.2f}"
    )
  return "\n".join(lines)
