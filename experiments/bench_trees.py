"""Token trees side by side with every other method in ONE run: tau and wall clock, greedy and sampled.

  python -P -m loopspec_jax.experiments.bench_trees --config=bench/trees.py         # configs/bench/trees.py
  python -P -m loopspec_jax.experiments.bench_trees --config=bench/trees.py:quick
  python -P -m loopspec_jax.experiments.bench_trees --config=bench/trees.py --config.out_dir=results/trees/<run>
  python -P -m loopspec_jax.experiments.bench_trees --config=bench/trees.py --config.out_dir=... --table_only

Per sampling mode and task (each task's prompts one batch, text prompts cut to their last max_len // 2 tokens as loopspec-bench
does) and sampling mode, every method (spec strings, `methods.parse_list`) runs once untimed (compiles), then
`repeats` timed runs, interleaved: every repeat runs all methods, the order rotated by one each repeat, so
load on the host hits all methods alike. Reported per row: tau (tokens per full-depth verify pass; LoopSpec:
its mean accepted length on the release's R-step scale, marked *), accepted drafts and nodes verified per
pass, drafting's share of the layer calls, the median decode seconds, the median over repeats of AR's time
in that repeat divided by the method's (speed vs AR), and whether the tokens equal AR's (sampled: only exact
copies of AR's draws can; chain-style speculative sampling is exact in distribution, not in tokens). tau is
a property of the tokens and does not depend on the host's load; wall clock does. The issue's target line
(tau_tree >= tau_chain + share (gamma + 1 - tau_chain), same d1 and gamma) is printed below the table.
Results go to out_dir/bench_trees.json and out_dir/table.md (docs blocks copy table.md; `docs_tables`).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from absl import flags
from ml_collections import config_flags

import loopspec_jax
from loopspec_jax import methods as methods_lib
from loopspec_jax.experiments import bench
from loopspec_jax.experiments import common

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("bench/trees.py"), "Tree benchmark settings.", flag_values=FLAGS
)
_TABLE_ONLY = flags.DEFINE_bool(
    "table_only", False, "rewrite table.md from out_dir/bench_trees.json", flag_values=FLAGS
)


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


def run_group(model, prompts, specs: list, sampling: dict, cfg, log) -> list:
  """All methods on one batch of prompts under one sampling mode; one row per method."""
  parsed = methods_lib.parse_list(specs)
  if parsed[0].name != "ar":
    raise ValueError(f"the first method must be 'ar' (the reference), got {specs[0]!r}")
  n = len(specs)
  secs = {i: [] for i in range(n)}
  last = {}
  for rep in range(cfg.repeats + 1):  # rep 0 compiles and is not timed
    for i in [(rep + k) % n for k in range(n)]:
      res = loopspec_jax.generate(
          model, prompts, max_new_tokens=cfg.max_new_tokens, method=parsed[i], seed=cfg.seed, **sampling
      )
      last[i] = res
      if rep:
        secs[i].append((rep, res.stats["decode_seconds"]))
      fig = row_figures(res.stats)
      log(f"  rep {rep} {specs[i]}: {res.stats['decode_seconds']:.2f} s, tau {fig['tau']:.2f}")
  ar_by_rep = dict(secs[0])
  rows = []
  for i, spec in enumerate(specs):
    times = [s for _, s in secs[i]]
    rows.append(
        {
            "method": spec,
            "label": parsed[i].label,
            **row_figures(last[i].stats),
            "decode_seconds": times,
            "decode_seconds_median": statistics.median(times),
            "speed_vs_ar_median": statistics.median(ar_by_rep[r] / s for r, s in secs[i]),
            "identical_to_ar": last[i].tokens == last[0].tokens,
        }
    )
  return rows


def _fmt(x, f="{:.2f}"):
  return "-" if x is None else f.format(x)


def table(rows: list) -> str:
  head = (
      "| task | sampling | method | tau | accepted/pass | nodes/pass | draft share | decode s (median) "
      "| speed vs AR (median) | = AR |"
  )
  lines = [head, "|" + "---|" * 10]
  for r in rows:
    tau = _fmt(r["tau"]) + ("*" if r["tau_release_scale"] else "")
    lines.append(
        f"| {r['task']} | {r['sampling']} | {r['method']} | {tau} | {_fmt(r['accepted_per_pass'])} | "
        f"{_fmt(r['nodes_per_pass'], '{:.1f}')} | {_fmt(r['draft_cost_share'])} | {r['decode_seconds_median']:.2f} | "
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


def report(rows: list, cfg) -> str:
  text = table(rows)
  lines = target_lines(rows, cfg.target.gamma, cfg.target.share)
  note = "\\* LoopSpec: mean accepted length on the release's R-step scale (it has no verify passes)."
  return text + "\n\n" + note + ("\n\n" + lines if lines else "") + "\n"


def main(argv):
  del argv
  cfg = _CONFIG.value
  path = os.path.join(cfg.out_dir, "bench_trees.json")
  if _TABLE_ONLY.value:
    with open(path) as f:
      rows = json.load(f)["rows"]
    common.atomic_write_text(os.path.join(cfg.out_dir, "table.md"), report(rows, cfg))
    print(report(rows, cfg))
    return
  os.makedirs(cfg.out_dir, exist_ok=True)
  logf = open(os.path.join(cfg.out_dir, "log.txt"), "a")

  def log(msg):
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    print(line, flush=True)
    logf.write(line + "\n")
    logf.flush()

  model = loopspec_jax.load(cfg.model)
  meta = {"machine": common.machine_description(), "start": time.strftime("%Y-%m-%d %H:%M:%S"), "config": cfg.to_dict()}
  log(f"machine: {meta['machine']}; load average {os.getloadavg()}")
  rows = []
  prompts = {
      task: bench.load_prompt_set(task, model, cfg.num_prompts, 0, cfg.seed) for task in common.split_list(cfg.tasks)
  }
  # tasks inner: prompts cut to the same length bucket share the compiled programs of a sampling mode
  for samp in common.split_list(cfg.samplings):
    for task, batch in prompts.items():
      log(f"{task} {samp}: {len(batch)} prompts, {len(cfg.methods)} methods; load average {os.getloadavg()}")
      group = run_group(model, batch, list(cfg.methods), dict(cfg.sampling_settings[samp]), cfg, log)
      rows += [{"task": task, "sampling": samp, **r} for r in group]
      meta["end"] = time.strftime("%Y-%m-%d %H:%M:%S")
      meta["load_average_end"] = os.getloadavg()
      common.atomic_write_json(path, {"meta": meta, "rows": rows})
      common.atomic_write_text(os.path.join(cfg.out_dir, "table.md"), report(rows, cfg))
    common.release_compiled()
  print(report(rows, cfg))


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  sys.exit(run())
