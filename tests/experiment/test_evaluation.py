"""loopspec-evaluate's honest labels, without the harness: the table's shots column says when the backend cut
few-shot prompts to fit the context, and a resumed evaluation says which rows it skipped."""

from __future__ import annotations

import types

import pytest

from loopspec_configs.eval import default
from loopspec_experiments import evaluate


class FakeLM:
  """The backend's surface these labels read: cfg.max_len, tok_encode and the per-request budget rule."""

  cfg = types.SimpleNamespace(max_len=256)
  max_gen_toks = 96

  def tok_encode(self, text):
    return text.split()

  def _sampling(self, kw):
    return [], kw.get("max_gen_toks", self.max_gen_toks), {}

  def speed_stats(self):
    return None


def _samples():
  long, short = "w " * 300, "w " * 100
  gen = lambda ctx: {"max_gen_toks": 96, "until": ["\n"]}
  return [
      {"doc_id": 0, "arguments": [(long, gen(long))], "resps": [["a"]]},
      {"doc_id": 0, "arguments": [(long, gen(long))], "resps": [["a"]]},  # the same document, another filter
      {"doc_id": 1, "arguments": [(short, gen(short))], "resps": [["b"]]},
      {"doc_id": 2, "arguments": [("ctx", " cont")], "resps": [[(-1.0, True)]]},  # loglikelihood: not cut
  ]


def test_shots_label_says_when_prompts_were_cut():
  cuts = evaluate.prompt_cuts(FakeLM(), _samples())
  assert cuts == {"prompts": 2, "cut": 1, "kept_tokens": 160}
  assert evaluate.shots_label({"n_shot": 8, "prompt_cut": cuts}) == "8, 1/2 cut to the last 160 tok"
  assert evaluate.shots_label({"n_shot": 0, "prompt_cut": {"prompts": 2, "cut": 0, "kept_tokens": 160}}) == "0"
  assert evaluate.shots_label({}) == "-"


def test_resumed_evaluation_says_which_rows_it_skipped(tmp_path, monkeypatch, capsys):
  """A second run finds every row done: it names the skipped (task, method) rows and builds no backend."""
  pytest.importorskip("lm_eval")
  from loopspec_jax.integrations import lm_eval as backend

  task = "loopspec_gsm8k_cot"
  res = {
      "results": {task: {"alias": task, "exact_match,strict-match": 0.5}},
      "n-shot": {task: 8},
      "n-samples": {task: {"effective": 3}},
      "samples": {task: _samples()},
  }
  built = []
  monkeypatch.setattr(backend, "LoopSpecLM", lambda **kw: built.append(kw) or FakeLM())
  monkeypatch.setattr(evaluate, "evaluate_one", lambda cfg, lm, t, tm: res)
  monkeypatch.setattr(evaluate, "task_manager", lambda tasks: None)
  monkeypatch.setattr(evaluate, "expand_tags", lambda tm, tasks: list(tasks))
  cfg = default.get_config()
  cfg.tasks, cfg.methods, cfg.out_dir, cfg.progress, cfg.log_samples = (
      task,
      "ar;loopspec:d1=2,d2=8",
      str(tmp_path),
      False,
      False,
  )
  first = evaluate.run_evaluation(cfg, model=types.SimpleNamespace(source="fake"))
  assert first["new_rows"] == 2 and len(built) == 2
  assert "| 8, 1/2 cut to the last 160 tok | ar |" in first["table"]
  capsys.readouterr()
  again = evaluate.run_evaluation(cfg, model=types.SimpleNamespace(source="fake"))
  out = capsys.readouterr().out
  assert again["new_rows"] == 0 and len(built) == 2
  assert (
      f"resuming: 2 row(s) already in {tmp_path}/eval.jsonl, skipped: {task} / ar; {task} / loopspec(d1=2,d2=8)" in out
  )
