"""loopspec_jax/experiment/figure4.py (the paper's Figure 4 run) without compiling: the candidates and their
figures, one interleaved group with a fake `generate`, the pick of the best, the tables and the figure."""

import types

import pytest

import loopspec_jax
from loopspec_jax import methods
from loopspec_jax.experiment import figure4 as F


def test_candidates_and_figures():
  assert F.candidates("tiny-raven") == [
      "ar",
      "loopspec:2,8",
      "loopspec:4,16",
      "dflash:heads=tiny-raven-dflash,gamma=3",
      "dflash:heads=tiny-raven-dflash,gamma=6",
  ]
  pr = {"per_request": {"skipped_first": [0, 0], "skipped_second": [1]}}
  assert F.figures("loopspec:2,8", dict(pr, mean_accepted_length=3.5, tokens_generated=9)) == {
      "tokens": 9,
      "tau": 3.5,
      "skip_free": False,
  }
  got = F.figures(
      "dflash:heads=x,gamma=3", {"tau": 2.0, "alpha": 0.5, "level_acceptance": [0.5], "tokens_generated": 4}
  )
  assert got["tau"] == 2.0 and F.figures("ar", {})["tau"] == 1.0 and F.skip_free({})


def _fake_generate(model, prompts, *, max_new_tokens, method, seed, **kw):
  spec = method
  stats = {"decode_seconds": 0.0, "tokens_generated": 4, "mean_accepted_length": 2.0, "tau": 2.5, "alpha": 0.6}
  stats["level_acceptance"] = [0.6]
  return types.SimpleNamespace(
      stats=stats, tokens=[[1, 2]] if spec != "dflash:heads=tiny-raven-dflash,gamma=6" else [[1]]
  )


def test_run_group_best_tables_and_plot(monkeypatch, tmp_path):
  monkeypatch.setattr(methods, "build_checked", lambda spec, model: spec)
  monkeypatch.setattr(loopspec_jax, "generate", _fake_generate)
  rows = F.run_group(None, "tiny-raven", "greedy", {t: [[0]] for t in F.TASKS}, repeats=2, max_new=4)
  assert len(rows) == 5 * len(F.TASKS) and all(len(r["walls"]) == 2 for r in rows)
  assert [r["equals_ar"] for r in rows if r["spec"].endswith("gamma=6")] == [False, False]
  # made-up walls: loopspec:4,16 and DFlash gamma 3 are the fastest of their kinds
  walls = {"ar": 4.0, "loopspec:2,8": 2.0, "loopspec:4,16": 1.0}
  walls.update({"dflash:heads=tiny-raven-dflash,gamma=3": 2.0, "dflash:heads=tiny-raven-dflash,gamma=6": 3.0})
  for r in rows:
    r.update(median_wall=walls[r["spec"]], ar_median_wall=4.0, speed_vs_ar=4.0 / walls[r["spec"]])
  best = F.pick_best(rows)
  assert best == {
      ("tiny-raven", "greedy"): {"ar": "ar", "loopspec": "loopspec:4,16", "dflash": F.candidates("tiny-raven")[3]}
  }
  table, ratios = F.best_table(rows, best)
  assert [r["ratio"] for r in ratios] == [2.0, 2.0] and "| `gamma=3` | 2.50 | 4.00 | 4.00x | 2.00x | 2.00x |" in table
  cands = F.candidates_table(rows)
  assert "| tiny-raven | greedy | gsm8k | `loopspec:4,16` | 2.00 | yes | yes | 1.00 | 4.00x |" in cands
  pytest.importorskip("matplotlib")
  F.plot(rows, best, str(tmp_path / "figure4.png"))
  assert (tmp_path / "figure4.png").stat().st_size > 0
