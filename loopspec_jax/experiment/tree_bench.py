"""Token trees side by side with every other method in one run (`experiments/bench_trees.py` describes the
table): the method entries ('spec' or 'spec@model') planned into jobs with their AR reference, each group of
jobs run interleaved (one untimed compiling round, then `repeats` rotated timed rounds), the rows' figures
(tau, accepted drafts and nodes per pass, draft share, speed against AR) and the report's tables and lines.
"""

from __future__ import annotations

import os
import statistics
import time

import loopspec_jax
from loopspec_jax import methods as methods_lib
from loopspec_jax.experiment import timing
from loopspec_jax.experiment.files import atomic_write_json
from loopspec_jax.experiment.files import atomic_write_text
from loopspec_jax.experiment.host import machine_description
from loopspec_jax.experiment.prompts import load_prompt_set
from loopspec_jax.experiment.settings import split_list


def row_figures(stats: dict) -> dict:
  """The table's figures of one run's `stats` summary."""
  tau = stats.get("tokens_per_pass")
  starred = tau is None
  if tau is None:
    tau = stats.get("mean_accepted_length") or 1.0
  rounds = max(sum(stats.get("per_request", {}).get("rounds", [])), 1)
  n_nodes = stats.get("nodes_per_pass")
  if n_nodes is None and "drafted" in stats.get("per_request", {}):
    n_nodes = sum(stats["per_request"]["drafted"]) / rounds
  accepted = stats.get("per_request", {}).get("accepted")
  return {
      "tau": float(tau),
      "tau_release_scale": starred,
      "accepted_per_pass": None if accepted is None or starred else sum(accepted) / rounds,
      "nodes_per_pass": n_nodes,
      "draft_cost_share": stats.get("draft_cost_share"),
      "tokens": stats["tokens_generated"],
  }


def split_entry(entry: str):
  """'spec@model' -> (spec, model name); 'spec' -> (spec, None): the row runs on the config's `model`."""
  spec, sep, model = entry.rpartition("@")
  if not sep:
    return entry.strip(), None
  if not spec.strip() or not model.strip():
    raise ValueError(f"method entry {entry!r}: expected 'spec' or 'spec@model'")
  return spec.strip(), model.strip()


def plan_jobs(entries: list, models: dict, prompts: dict, default: str) -> list:
  """One job per method entry: its spec, parsed method, model name and prompts, and `ref`, the index of the
  AR job on the same model (its reference of tokens and wall clock). Every model needs an 'ar' row."""
  jobs = []
  for entry in entries:
    spec, name = split_entry(entry)
    name = name or default
    jobs.append({"entry": entry, "spec": spec, "model_name": name, "model": models[name], "prompts": prompts[name]})
  parsed = methods_lib.parse_list([j["spec"] for j in jobs])
  if parsed[0].name != "ar" or jobs[0]["model_name"] != default:
    raise ValueError(f"the first method must be 'ar' on the config's model (the reference), got {entries[0]!r}")
  refs = {}
  for i, (job, method) in enumerate(zip(jobs, parsed)):
    job["method"] = method
    if method.name == "ar":
      refs.setdefault(job["model_name"], i)
  for job in jobs:
    if job["model_name"] not in refs:
      raise ValueError(f"{job['entry']!r} runs on {job['model_name']!r}, which has no 'ar@{job['model_name']}' row")
    job["ref"] = refs[job["model_name"]]
  return jobs


def run_group(jobs: list, sampling: dict, cfg, log) -> list:
  """All methods on one batch of prompts (per model) under one sampling mode; one row per method."""
  n = len(jobs)
  secs = {i: {} for i in range(n)}
  last = {}
  for rep in range(cfg.repeats + 1):  # rep 0 compiles and is not timed
    for i in timing.rotated(n, rep):
      job = jobs[i]
      res = loopspec_jax.generate(
          job["model"],
          job["prompts"],
          max_new_tokens=cfg.max_new_tokens,
          method=job["method"],
          seed=cfg.seed,
          **sampling,
      )
      last[i] = res
      if rep:
        secs[i][rep] = res.stats["decode_seconds"]
      fig = row_figures(res.stats)
      log(f"  rep {rep} {job['entry']}: {res.stats['decode_seconds']:.2f} s, tau {fig['tau']:.2f}")
  rows = []
  for i, job in enumerate(jobs):
    ref = job["ref"]
    times = list(secs[i].values())
    rows.append(
        {
            "method": job["entry"],
            "label": job["method"].label,
            "model": job["model_name"],
            **row_figures(last[i].stats),
            "level_acceptance": last[i].stats.get("level_acceptance"),
            "decode_seconds": times,
            "decode_seconds_median": statistics.median(times),
            "speed_vs_ar_median": timing.median_ratio(list(secs[ref].values()), times),
            "identical_to_ar": last[i].tokens == last[ref].tokens,
        }
    )
  return rows


def _fmt(x, f="{:.2f}"):
  return "-" if x is None else f.format(x)


def table(rows: list) -> str:
  """The markdown table of the rows (`run_group`'s, with task and sampling)."""
  head = (
      "| task | sampling | method | tau | accepted/pass | nodes/pass | draft share | decode s (median) "
      "| speed vs AR (median) | = AR |"
  )
  lines = [head, "|" + "---|" * 10]
  for r in rows:
    tau = _fmt(r["tau"]) + ("*" if r["tau_release_scale"] else "")
    lines.append(
        f"| {r['task']} | {r['sampling']} | {r['method']} | {tau} | {_fmt(r['accepted_per_pass'])} | "
        f"{_fmt(r['nodes_per_pass'], '{:.1f}')} | {_fmt(r['draft_cost_share'], '{:.3f}')} | {r['decode_seconds_median']:.2f} | "
        f"{r['speed_vs_ar_median']:.2f}x | {'yes' if r['identical_to_ar'] else 'no'} |"
    )
  return "\n".join(lines)


def target_lines(rows: list, gamma: int, share: float) -> str:
  """The issue's target for every tree row against the chain row of the same task, sampling, d1 and gamma."""
  # only tree and chain specs are parsed (a draft spec would load its drafter)
  envelope = lambda spec, name: (lambda m: (m.d1, m.gamma))(methods_lib.parse(spec)) if spec.startswith(name) else None
  out = []
  for r in rows:
    env = envelope(r["method"], "tree")
    if env is None or env[1] != gamma:
      continue
    want = [
        c
        for c in rows
        if (c["task"], c["sampling"]) == (r["task"], r["sampling"]) and envelope(c["method"], "chain") == env
    ]
    if not want:
      continue
    chain = want[0]["tau"]
    need = chain + share * (gamma + 1 - chain)
    out.append(
        f"- {r['task']} {r['sampling']} {r['method']}: tau {r['tau']:.2f} vs chain {chain:.2f}; "
        f"target {need:.2f}: {'met' if r['tau'] >= need else 'NOT met'}"
    )
  return "\n".join(out)


def _name(row) -> str:
  return split_entry(row["method"])[0].partition(":")[0]


def efficiency(row):
  """(tau - 1) / draft share: tokens gained per verify pass over AR's 1, per unit of drafting's share of the
  layer calls; None where the row drafts nothing or has no verify passes (LoopSpec)."""
  share = row["draft_cost_share"]
  if not share or row["tau_release_scale"]:
    return None
  return (row["tau"] - 1.0) / share


def heads_lines(rows: list, eagle_tau: float) -> str:
  """The heads table's target lines per task and sampling: EAGLE tau >= eagle_tau and above Medusa's best, and
  every drafting row's (tau - 1) / draft share against the best chain row's."""
  out = []
  for key in dict.fromkeys((r["task"], r["sampling"]) for r in rows):
    group = [r for r in rows if (r["task"], r["sampling"]) == key]
    medusa = max((r["tau"] for r in group if _name(r) == "medusa"), default=None)
    for r in (r for r in group if _name(r) == "eagle"):
      ok = r["tau"] >= eagle_tau and (medusa is None or r["tau"] > medusa)
      out.append(
          f"- {key[0]} {key[1]} {r['method']}: tau {r['tau']:.2f}; target >= {eagle_tau:.1f} and > Medusa's "
          f"{_fmt(medusa)}: {'met' if ok else 'NOT met'}"
      )
    chains = [(efficiency(r), r) for r in group if _name(r) == "chain" and efficiency(r) is not None]
    best = max(chains, key=lambda c: c[0]) if chains else None
    for r in group:
      e = efficiency(r)
      if e is None or _name(r) == "chain":
        continue
      vs = "" if best is None else f"; {'beats' if e > best[0] else 'below'} {best[1]['method']} ({best[0]:.1f})"
      out.append(f"- {key[0]} {key[1]} {r['method']}: (tau - 1) / draft share = {e:.1f}{vs}")
  return "\n".join(out)


def level_table(rows: list) -> str:
  """Per-level acceptance of the rows that report it (EAGLE): rounds accepting a depth-k draft among those
  that accepted depth k - 1."""
  have = [r for r in rows if r.get("level_acceptance")]
  if not have:
    return ""
  g = max(len(r["level_acceptance"]) for r in have)
  lines = [
      "| task | sampling | method | " + " | ".join(f"k={k}" for k in range(1, g + 1)) + " |",
      "|" + "---|" * (g + 3),
  ]
  for r in have:
    cells = " | ".join(f"{a:.3f}" for a in r["level_acceptance"])
    lines.append(f"| {r['task']} | {r['sampling']} | {r['method']} | {cells} |")
  return "\n".join(lines)


def report(rows: list, cfg) -> str:
  """table.md: the table, its notes, the per-level acceptance (heads preset) and the target lines."""
  text = table(rows)
  notes = ["\\* LoopSpec: mean accepted length on the release's R-step scale (it has no verify passes)."]
  if any(r.get("model") not in (None, cfg.model) for r in rows):
    notes.append(
        "`spec@model`: the row runs on that target model instead of " + cfg.model + ", and its `= AR` and speed "
        "are against that model's own `ar@model` row."
    )
  parts = [text, "\n".join(notes)]
  lines = target_lines(rows, cfg.target.gamma, cfg.target.share) if cfg.target else ""
  if cfg.get("heads_target"):
    levels = level_table(rows)
    if levels:
      parts.append(
          "Per-level acceptance (rounds accepting depth k among those that accepted depth k - 1):\n\n" + levels
      )
    lines = "\n".join(filter(None, [lines, heads_lines(rows, cfg.heads_target.eagle_tau)]))
  return "\n\n".join(parts + ([lines] if lines else [])) + "\n"


def run_bench(cfg) -> list:
  """Runs the config's table (module docstring) into cfg.out_dir; returns its rows."""
  path = os.path.join(cfg.out_dir, "bench_trees.json")
  os.makedirs(cfg.out_dir, exist_ok=True)
  logf = open(os.path.join(cfg.out_dir, "log.txt"), "a")

  def log(msg):
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    print(line, flush=True)
    logf.write(line + "\n")
    logf.flush()

  entries = [e for e in cfg.only.split(";") if e.strip()] if cfg.get("only") else list(cfg.methods)
  names = [cfg.model] + sorted({m for _, m in map(split_entry, entries) if m and m != cfg.model})
  models = {name: loopspec_jax.load(name) for name in names}
  meta = {"machine": machine_description(), "start": time.strftime("%Y-%m-%d %H:%M:%S"), "config": cfg.to_dict()}
  log(f"machine: {meta['machine']}; load average {os.getloadavg()}")
  rows = []
  prompts = {
      task: {name: load_prompt_set(task, m, cfg.num_prompts, 0, cfg.seed) for name, m in models.items()}
      for task in split_list(cfg.tasks)
  }
  # tasks inner: prompts cut to the same length bucket share the compiled programs of a sampling mode
  for samp in split_list(cfg.samplings):
    for task, batch in prompts.items():
      log(f"{task} {samp}: {cfg.num_prompts} prompts, {len(entries)} methods; load average {os.getloadavg()}")
      jobs = plan_jobs(entries, models, batch, cfg.model)
      group = run_group(jobs, dict(cfg.sampling_settings[samp]), cfg, log)
      rows += [{"task": task, "sampling": samp, **r} for r in group]
      meta["end"] = time.strftime("%Y-%m-%d %H:%M:%S")
      meta["load_average_end"] = os.getloadavg()
      atomic_write_json(path, {"meta": meta, "rows": rows})
      atomic_write_text(os.path.join(cfg.out_dir, "table.md"), report(rows, cfg))
    timing.release_compiled()
  print(report(rows, cfg))
  return rows
