"""Task accuracy beside decoding speed: lm-evaluation-harness on a looped model, one row per (task, method).

For every task and method of the config, `lm_eval.simple_evaluate` (the harness's Python API) scores the model
through the `loopspec_jax` backend (`loopspec_jax.integrations.lm_eval`), with the offline task YAMLs of
`loopspec_jax/tasks/` on the include path. Each (task, method) becomes one JSONL row in <out_dir>/eval.jsonl,
appended (one fsynced line) as soon as it is measured: the harness's results JSON of that run (results,
configs, versions, n-shot, n-samples, config) under "lm_eval", the task's metrics, and our speed statistics of
its generate calls (tokens, decode seconds after compilation, tokens/s, mean accepted length, commit sources;
summed `DecodeStats`). A rerun skips the (task, method) rows already there (same model, limit,
few-shot, generation overrides, batch size, depth and seed), so a killed evaluation resumes without losing or
duplicating a row. The table (<out_dir>/eval.md, also printed) puts accuracy beside speed:

  task | method | metric | accuracy | tok/s | ratio vs AR | mean acc. len | commits f/s/r | identical | docs

`ratio vs AR` is tokens/s over the AR row's of the same task; `identical` says whether the harness's responses
equal AR's document for document (greedy decoding: every method is lossless, so yes, and accuracy is equal).

  loopspec-evaluate                                    # configs/eval/default.py
  loopspec-evaluate --config=eval/default.py:bundled   # the docs/evaluation.md table
  python -m loopspec_experiments.evaluate --config=eval/default.py:quick --config.out_dir=/tmp/eval
"""

from __future__ import annotations

import logging as py_logging
import os

from absl import flags
from ml_collections import config_flags

# re-exported: tests read these names here
from loopspec_jax.experiment.evaluation import EvaluationInterrupted  # noqa: F401
from loopspec_jax.experiment.evaluation import check_config  # noqa: F401
from loopspec_jax.experiment.evaluation import expand_tags  # noqa: F401
from loopspec_jax.experiment.evaluation import metrics_of  # noqa: F401
from loopspec_jax.experiment.evaluation import prompt_cuts  # noqa: F401
from loopspec_jax.experiment.evaluation import run_evaluation
from loopspec_jax.experiment.evaluation import shots_label  # noqa: F401
from loopspec_experiments import common

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("eval/default.py"), "Evaluation settings.", flag_values=FLAGS
)


def main(argv):
  del argv
  cfg = _CONFIG.value
  if not flags.FLAGS["verbosity"].present:  # the harness warns on every run about settings this script makes
    py_logging.getLogger("lm_eval").setLevel(py_logging.ERROR)
  res = run_evaluation(cfg)
  print(res["table"])
  print(f"rows in {os.path.join(cfg.out_dir, 'eval.jsonl')}, table in {os.path.join(cfg.out_dir, 'eval.md')}")


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
