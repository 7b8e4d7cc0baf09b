"""loopspec_jax/experiment/evaluation.py (loopspec-evaluate) without the harness: the config checks, the metrics
of a harness result, the rows' ratios against AR and the table; its honest labels (the shots column says when
the backend cut few-shot prompts to fit the context; a resumed evaluation says which rows it skipped)."""

from __future__ import annotations

import types

import pytest

from loopspec_configs.eval import default
from loopspec_jax.experiment import evaluation as evaluate


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


def test_config_errors_come_before_anything_loads():
  cfg = default.get_config()
  cfg.tasks, cfg.methods = "loopspec_gsm8k_cot", "ar;loopspec:d1=2,d2=8"
  tasks, methods = evaluate.check_config(cfg)
  assert tasks == ["loopspec_gsm8k_cot"] and [m.label for m in methods] == ["ar", "loopspec(d1=2,d2=8)"]
  for field, value, match in (
      ("methods", "ar;ar", "methods repeat"),
      ("methods", "", "no methods"),
      ("tasks", " ", "no tasks"),
      ("batch_size", 0, "batch_size"),
      ("offline", "maybe", "offline must be"),
  ):
    bad = default.get_config()
    bad.tasks, bad.methods = cfg.tasks, cfg.methods
    setattr(bad, field, value)
    with pytest.raises(ValueError, match=match):
      evaluate.check_config(bad)


def test_metrics_digest_ratios_and_table():
  res = {"results": {"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": 0.1, "flag": True}}}
  assert evaluate.metrics_of(res, "t") == {"acc,none": 0.5}
  assert evaluate.metrics_of({"groups": {"g": {"acc,none": 1}}}, "g") == {"acc,none": 1}
  s1 = [{"doc_id": 1, "resps": [["x"]]}, {"doc_id": 0, "resps": [["y"]]}]
  assert evaluate.responses_digest(s1) == evaluate.responses_digest(s1[::-1] + s1)  # order and filters
  assert evaluate.responses_digest(None) is None
  speed = lambda tps: {
      "tokens_per_second": tps,
      "mean_accepted_length": 2.0,
      "commits": dict(first=1, second=2, restart=0),
  }
  base = dict(model="m", task="t", metric="acc,none", accuracy=0.5, docs=3, n_shot=0, greedy=True)
  rows = evaluate.with_ratios(
      [
          dict(base, method="ar", speed=speed(10.0), responses_sha256="a"),
          dict(base, method="loopspec", speed=speed(25.0), responses_sha256="a"),
          dict(base, method="chain", speed=None, responses_sha256="b"),
      ]
  )
  assert [r["ratio_vs_ar"] for r in rows] == [1.0, 2.5, None]
  assert [r["identical_to_ar"] for r in rows] == [True, True, False]
  lines = evaluate.table(rows).splitlines()
  assert len(lines) == 5 and "| 2.50x | 2.00 | 1/2/0 | yes | 3 |" in lines[3] and "| - | - | - | NO | 3 |" in lines[4]
