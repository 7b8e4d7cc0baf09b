"""Prompt sets (loopspec_jax/prompts.py): formats, determinism, truncation, exemplar hygiene, data lookup."""

import json
import os

import pytest

from helpers import ROOT
from loopspec_jax import prompts as P

DATA = os.path.join(ROOT, "loopspec_jax", "data")


def rows(*path):
  with open(os.path.join(DATA, *path), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("task", P.TASKS)
def test_deterministic_and_truncated(task):
  three = P.load_prompts(task, 3)
  assert len(three) == 3 and all(isinstance(p, str) and p for p in three)
  assert P.load_prompts(task, 2) == three[:2]
  assert P.load_prompts(task, 0) == []


def test_gsm8k_three_shot_from_train():
  train, test = rows("gsm8k", "train.jsonl"), rows("gsm8k", "test.jsonl")
  ps = P.load_prompts("gsm8k", 2)
  for p, t in zip(ps, test):
    assert p.count("Question: ") == 4 and p.count("Answer:") == 4
    for ex in train[:3]:
      assert f"Question: {ex['question']}\nAnswer: {ex['answer']}\n\n" in p
    assert p.endswith(f"Question: {t['question']}\nAnswer:")
    assert t["answer"] not in p
  assert len(P.load_prompts("gsm8k")) == len(test)


def test_math500_exemplars_are_not_evaluated():
  data = rows("math500", "test.jsonl")
  ex = P.math500_exemplar_indices(data)
  assert len(ex) == 4
  ps = P.load_prompts("math500")
  assert len(ps) == len(data) - 4
  targets = {p.rsplit("Problem: ", 1)[1] for p in ps}
  for i in ex:
    assert f"{data[i]['problem']}\nSolution:" not in targets
    assert ps[0].count(data[i]["solution"]) == 1
  assert ps[0].count("Problem: ") == 5 and ps[0].endswith("Solution:")


def test_mbpp_and_humaneval_formats():
  first = rows("mbpp_sanitized", "test.jsonl")[0]
  assert P.load_prompts("mbpp", 1)[0] == f'"""\n{first["prompt"]}\n{first["test_list"][0]}\n"""\n'
  he = P.load_prompts("humaneval")
  assert len(he) == 164 and "def has_close_elements" in he[0] and he[0].rstrip().endswith('"""')


def test_shakespeare_held_out_tail():
  with open(os.path.join(DATA, "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
    text = f.read()
  tail = text[int(len(text) * 0.95) :]
  ps = P.load_prompts("shakespeare", 3, chunk_chars=100)
  assert ps == [tail[:100], tail[100:200], tail[200:300]]
  from loopspec_jax.train import data as train_data

  assert train_data.heldout_shakespeare().startswith("".join(P.load_prompts("shakespeare")))


def test_data_dir_override_and_errors(tmp_path, monkeypatch):
  (tmp_path / "gsm8k").mkdir()
  for split, q in (("train", "T"), ("test", "Q")):
    with open(tmp_path / "gsm8k" / f"{split}.jsonl", "w") as f:
      for i in range(4):
        f.write(json.dumps({"question": f"{q}{i}", "answer": f"A{i}"}) + "\n")
  monkeypatch.setenv("LOOPSPEC_DATA_DIR", str(tmp_path))
  assert P.data_dir() == str(tmp_path)
  assert P.load_prompts("gsm8k", 1) == [
      "Question: T0\nAnswer: A0\n\nQuestion: T1\nAnswer: A1\n\n" "Question: T2\nAnswer: A2\n\nQuestion: Q0\nAnswer:"
  ]
  with pytest.raises(ValueError, match="unknown task"):
    P.load_prompts("nope", 1)
  with pytest.raises(ValueError):
    P.load_prompts("gsm8k", -1)
