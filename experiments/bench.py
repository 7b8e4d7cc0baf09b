"""Side-by-side decoding benchmark: AR, chain, draft model, prompt lookup and LoopSpec on the same prompts in one run.

Every method decodes every prompt (one request at a time, as the paper measures), after an untimed warm-up
that compiles. Repeats are interleaved (method order rotated) so machine noise hits all methods alike; the
report gives medians of decode time after prefill, wall-clock ratios against AR from the same repeat, mean
accepted length (R * tokens / sequential recurrent steps, the same scale for chain and LoopSpec), where the time
goes (loop iterations: AR tokens, chain rounds, LoopSpec ticks; ms per iteration), core-step calls per token,
commit sources and gate-open rate.

  loopspec-bench                                          # configs/bench/default.py
  loopspec-bench --config=bench/bundled.py:quick          # a config of configs/, a preset
  python -m loopspec_experiments.bench --config=bench/bundled.py:two --config.repeats=1
  loopspec-bench --config=bench/bundled.py:baselines     # + draft model, prompt lookup, gamma=auto, trees

Method specs are 'name:arg=value,...': integers, 'none', 'auto' (gamma) and, for draft_model, a bundled
model name or checkpoint directory (loaded once). With `table = 'baselines'` the report adds tau (tokens per
full-depth verify pass), acceptance and draft cost share (the speculative baselines' columns); the tree
methods ('tree:...', 'chain:...,branch=4,tree_nodes=32', 'lookahead:...') and the head methods
('medusa:heads=tiny-raven-medusa,...', 'eagle:heads=tiny-raven-eagle,...', 'mtp:heads=tiny-raven-mtp' on the
model tiny-raven-mtp) are rows like any other.
"""

from __future__ import annotations

import time

from absl import flags
from ml_collections import config_flags

from loopspec_jax.experiment.prompts import load_prompt_set
from loopspec_jax.experiment.timing import benchmark, row_labels
from loopspec_experiments import common

__all__ = ["benchmark", "row_labels", "load_prompt_set", "markdown_table", "baselines_table", "run"]

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("bench/default.py"), "Benchmark settings.", flag_values=FLAGS
)


def markdown_table(rows: list) -> str:
  """One line per (model, task, sampling, method); ms/tick is the median decode time per loop iteration."""
  head = (
      "| model | task | sampling | method | mean acc. len | tok/s (decode) | ratio vs AR | per-prompt median / min "
      "| tokens/tick | ms/tick | core steps/tok | commits f/s/r | gate open | identical |"
  )
  lines = [head, "|" + "---|" * 14]
  for row in rows:
    c = row["commits"]
    ms_tick = 1e3 * row["decode_seconds_median"] / max(row["ticks"], 1)
    lines.append(
        f"| {row['model']} | {row['task']} | {row['sampling']} | {row['method']} | {row['mean_accepted_length']:.2f} | "
        f"{row['tokens_per_second_median']:.1f} | {row['wall_clock_ratio_median']:.2f}x | "
        f"{row['prompt_ratio_median']:.2f}x / {row['prompt_ratio_min']:.2f}x | {row['tokens_per_tick']:.2f} | {ms_tick:.2f} | "
        f"{row['core_step_calls_per_token']:.2f} | {c['first']}/{c['second']}/{c['restart']} | "
        f"{row['gate_open_rate']:.2f} | {'yes' if row['identical_to_ar'] else ('-' if row['sampling'] != 'greedy' else 'NO')} |"
    )
  return "\n".join(lines)


def baselines_table(rows: list) -> str:
  """The speculative baselines side by side: one line per (model, task, sampling, method)."""
  head = (
      "| model | task | sampling | method | tau (tokens/pass) | acceptance | mean gamma | draft cost share | mean acc. len "
      "| tok/s (decode) | ratio vs AR | per-prompt median / min | ms/tick | identical |"
  )
  fmt = lambda x, f="{:.2f}": "-" if x is None else f.format(x)
  lines = [head, "|" + "---|" * 14]
  for row in rows:
    ms_tick = 1e3 * row["decode_seconds_median"] / max(row["ticks"], 1)
    same = "yes" if row["identical_to_ar"] else ("-" if row["sampling"] != "greedy" else "NO")
    lines.append(
        f"| {row['model']} | {row['task']} | {row['sampling']} | {row['method']} | {fmt(row.get('tokens_per_pass'))} | "
        f"{fmt(row.get('acceptance'))} | {fmt(row.get('mean_gamma'))} | {fmt(row.get('draft_cost_share'))} | "
        f"{row['mean_accepted_length']:.2f} | {row['tokens_per_second_median']:.1f} | "
        f"{row['wall_clock_ratio_median']:.2f}x | {row['prompt_ratio_median']:.2f}x / {row['prompt_ratio_min']:.2f}x | "
        f"{ms_tick:.2f} | {same} |"
    )
  return "\n".join(lines)


def main(argv):
  del argv
  cfg = _CONFIG.value
  rows = []
  for model_spec in common.split_list(cfg.models):
    model = common.resolve_model(
        model_spec, contraction=cfg.get("contraction"), seed=cfg.seed, dtype=cfg.get("dtype") or "float32"
    )
    name = cfg.get("model_label") or model_spec
    for task in common.split_list(cfg.tasks):
      prompts = load_prompt_set(task, model, cfg.num_prompts, cfg.prompt_len, cfg.seed)
      for samp_name in common.split_list(cfg.samplings):
        sampling = dict(cfg.sampling_settings[samp_name])
        methods = (
            list(cfg.methods_by_model.get(name, cfg.methods)) if cfg.get("methods_by_model") else list(cfg.methods)
        )
        print(f"model {name}, task {task}, {samp_name}: {len(prompts)} prompts, methods {methods}", flush=True)
        res = benchmark(
            model, prompts, methods, sampling, max_new_tokens=cfg.max_new_tokens, repeats=cfg.repeats, seed=cfg.seed
        )
        for label, r in res.items():
          rows.append({"model": name, "task": task, "sampling": samp_name, **r})
        common.release_compiled()  # a long bench ran out of memory mappings for JIT code
  table = baselines_table(rows) if cfg.get("table") == "baselines" else markdown_table(rows)
  print(table)
  if common.is_main_process():
    meta = {
        "machine": common.machine_description(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "config": cfg.to_dict(),
    }
    common.write_report(cfg.out_dir, "bench", {"meta": meta, "rows": rows}, f"Machine: {meta['machine']}\n\n{table}")


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
