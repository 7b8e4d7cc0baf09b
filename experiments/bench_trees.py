"""Token trees side by side with every other method in ONE run: tau and wall clock, greedy and sampled.

  python -m loopspec_experiments.bench_trees --config=bench/trees.py         # configs/bench/trees.py
  python -m loopspec_experiments.bench_trees --config=bench/trees.py:quick
  python -m loopspec_experiments.bench_trees --config=bench/trees.py --config.out_dir=results/trees/<run>
  python -m loopspec_experiments.bench_trees --config=bench/trees.py --config.out_dir=... --table_only

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
A method entry 'spec@model' runs on another target model (e.g. 'mtp:heads=tiny-raven-mtp@tiny-raven-mtp': MTP
drafts from its own model); each such model needs its own 'ar@model' row, the reference of its rows' "= AR"
and speed. With `heads_target` (the `:heads` preset, issue 27) the report adds per-level acceptance (EAGLE),
the EAGLE line (tau >= heads_target.eagle_tau and above Medusa's) and every drafting row's
(tau - 1) / draft share against the best chain row's.
Results go to out_dir/bench_trees.json and out_dir/table.md (docs blocks copy table.md; `docs_tables`).
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags
from ml_collections import config_flags

# re-exported: tests read these names here
from loopspec_jax.experiment.tree_bench import heads_lines  # noqa: F401
from loopspec_jax.experiment.tree_bench import plan_jobs  # noqa: F401
from loopspec_jax.experiment.tree_bench import report
from loopspec_jax.experiment.tree_bench import run_bench
from loopspec_jax.experiment.tree_bench import run_group  # noqa: F401
from loopspec_jax.experiment.tree_bench import split_entry  # noqa: F401
from loopspec_experiments import common

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("bench/trees.py"), "Tree benchmark settings.", flag_values=FLAGS
)
_TABLE_ONLY = flags.DEFINE_bool(
    "table_only", False, "rewrite table.md from out_dir/bench_trees.json", flag_values=FLAGS
)


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
  run_bench(cfg)


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  sys.exit(run())
