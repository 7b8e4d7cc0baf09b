"""The analysis notebook's defaults: the committed sweeps of the bundled models, a loud error when it finds no
rows, and figures outside the checkout (its full execution is a slow test in test_depth_sweep.py)."""

import json
import os

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _setup_cell() -> str:
  nb = json.load(open(os.path.join(_ROOT, "notebooks", "sweep_analysis.ipynb")))
  return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


def _run_setup(monkeypatch, **env):
  for k in ("SWEEP_JSONL", "REPLAY_JSONL", "DEPTHS_JSON", "FIG_DIR"):
    monkeypatch.delenv(k, raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  monkeypatch.chdir(_ROOT)
  monkeypatch.setattr("matplotlib.pyplot.show", lambda *a, **k: None)
  scope = {}
  exec(compile(_setup_cell(), "sweep_analysis.ipynb[setup]", "exec"), scope)
  return scope


def test_the_notebook_reads_the_bundled_sweeps_by_default(monkeypatch):
  scope = _run_setup(monkeypatch)
  assert len(scope["rows"]) > 0 and {"tiny-raven", "tiny-ouro"} <= set(scope["models"])
  assert not os.path.abspath(scope["FIG_DIR"]).startswith(_ROOT + os.sep)  # nothing written into the checkout
  for model, task, samp in scope["groups"][:2]:
    assert scope["depth_summary"](model, task, samp) is not None  # the bundled depth analyses are found


def test_the_notebook_fails_loudly_without_rows(monkeypatch, tmp_path):
  empty = tmp_path / "sweep.jsonl"
  empty.write_text("")
  with pytest.raises(RuntimeError, match="no engine rows"):
    _run_setup(monkeypatch, SWEEP_JSONL=str(empty), FIG_DIR=str(tmp_path / "figs"))
