"""loopspec_jax/experiment/reference.py (loopspec-reference-speed) without torch: the reference imported by
path as a package of its own, interleaved N / 2N timing with fake generate paths, greedy agreement, the
comparison against our row and the table. (tests/experiments/test_bench.py runs stream_bandwidth.)"""

import hashlib
import sys

from loopspec_jax.experiment import reference


def test_import_reference_runs_the_two_files_as_a_package(tmp_path, monkeypatch):
  (tmp_path / "raven_config_minimal.py").write_text("class RavenConfig:\n  pass\n")
  (tmp_path / "raven_modeling_minimal.py").write_text(
      "from .raven_config_minimal import RavenConfig\n\nclass RavenForCausalLM:\n  config_class = RavenConfig\n"
  )
  monkeypatch.setattr(sys, "modules", dict(sys.modules))  # the package it registers goes with the test
  config, lm = reference.import_reference(str(tmp_path))
  assert lm.config_class is config
  text = (tmp_path / "raven_config_minimal.py").read_bytes()
  assert reference.file_sha16(str(tmp_path / "raven_config_minimal.py")) == hashlib.sha256(text).hexdigest()[:16]


def test_agreement_counts_matches_and_the_identical_prefix():
  assert reference.agreement([1, 2, 3], [1, 2, 3]) == {"matching": 3, "total": 3, "identical_prefix": 3}
  assert reference.agreement([1, 5, 3], [1, 2, 3, 4]) == {"matching": 2, "total": 4, "identical_prefix": 1}


def test_measure_compare_and_table(capsys):
  calls = []

  def path(scale):
    return lambda prompt, n: calls.append((scale, n)) or list(range(n if scale == 1 else n - 1))

  fns = {"ours": path(1), "ref": path(2)}
  res = reference.measure(fns, [[0], [1]], n=4, repeats=2)
  assert len(calls) == 2 * 4 + 2 * 8  # per path an untimed round (2N, N per prompt), then 2 timed repeats
  assert res["ours"]["tokens"] == [[0, 1, 2, 3, 4, 5, 6, 7]] * 2 and len(res["ref"]["tokens_per_second"]) == 2
  assert "repeat 1: ref" in capsys.readouterr().out
  reference.compare_to(res, "ours")
  assert res["ours"]["agree"]["matching"] == 16 and res["ref"]["agree"] == {
      "matching": 14,
      "total": 16,
      "per_prompt": [{"matching": 7, "total": 8, "identical_prefix": 7}] * 2,
  }
  for r in res.values():
    r["share_of_bound"] = 0.5
  lines = reference.markdown_table(res, "ours").splitlines()
  assert len(lines) == 4 and lines[2].endswith("| - | 50% | - |") and lines[3].endswith("| 50% | 14/16 |")
