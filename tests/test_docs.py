"""The docs cannot drift: results tables in docs/ equal their files, links resolve, figures cite results/.

- every `<!-- results: PATH -->` block in README.md and docs/*.md holds PATH's content byte for byte
  (`python -m loopspec_experiments.docs_tables --write` rewrites them);
- README.md has at most 250 lines;
- every relative link in README.md and docs/*.md points to a file or folder that exists;
- outside results blocks and code blocks, every paragraph of README.md and docs/*.md that states a measured
  figure (a ratio like `1.5x`, a time like `3.1 ms`, a rate like `250 tok/s`) cites a `results/` path.
"""

from __future__ import annotations

import os
import re

import pytest

from loopspec_experiments import docs_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = docs_tables.doc_files(ROOT)
LINK = re.compile(r"\]\(([^)\s]+)\)")
FIGURE = re.compile(r"\b\d+(?:\.\d+)?x\b|\b\d+(?:\.\d+)? ?(?:ms|tok/s|tokens/s|GB/s|GFLOP/s)\b")


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def _rel(path: str) -> str:
  return os.path.relpath(path, ROOT)


def _prose(text: str) -> str:
  """`text` without its results blocks and fenced code blocks (each replaced by a blank line)."""
  pieces, last = [], 0
  for _, start, end in docs_tables.blocks(text):
    pieces.append(text[last:start])
    last = end
  text = "".join(pieces) + text[last:]
  return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.M | re.S)


def test_docs_exist():
  names = {os.path.basename(p) for p in DOCS}
  for page in ("engine", "methods", "benchmarks", "serving", "evaluation", "depth-analysis", "scaling", "cost-model"):
    assert f"{page}.md" in names, sorted(names)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_results_blocks_equal_their_files(doc):
  text = _read(doc)
  for path, start, end in docs_tables.blocks(text):
    assert os.path.isfile(os.path.join(ROOT, path)), f"{_rel(doc)}: results block names a missing file {path}"
    want = _read(os.path.join(ROOT, path))
    assert text[start:end] == (want if want.endswith("\n") else want + "\n"), (
        f"{_rel(doc)}: the block of {path} differs from the file; run "
        "python -m loopspec_experiments.docs_tables --write"
    )


def test_readme_is_short():
  n = len(_read(os.path.join(ROOT, "README.md")).splitlines())
  assert n <= 250, f"README.md has {n} lines; move depth to docs/"


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_relative_links_resolve(doc):
  missing = []
  for target in LINK.findall(_prose(_read(doc))):
    if re.match(r"^[a-z]+:", target) or target.startswith("#"):
      continue  # a URL or an anchor in the same page
    path = os.path.normpath(os.path.join(os.path.dirname(doc), target.split("#")[0]))
    if not os.path.exists(path):
      missing.append(target)
  assert not missing, f"{_rel(doc)}: links to missing files {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_figures_cite_results(doc):
  uncited = [
      para.strip()[:120]
      for para in re.split(r"\n\s*\n", _prose(_read(doc)))
      if FIGURE.search(para) and "results/" not in para
  ]
  assert not uncited, f"{_rel(doc)}: paragraphs with measured figures and no results/ path: {uncited}"


def test_tool_checks_and_writes(tmp_path):
  """docs_tables fills a stale block, and then finds nothing stale."""
  (tmp_path / "docs").mkdir()
  (tmp_path / "results").mkdir()
  (tmp_path / "results" / "t.md").write_text("| a |\n|---|\n| 1.5x |\n")
  (tmp_path / "README.md").write_text("x\n<!-- results: results/t.md -->\nold\n<!-- /results -->\ny\n")
  (tmp_path / "docs" / "p.md").write_text("no blocks\n")
  assert docs_tables.stale(str(tmp_path)) == ["README.md"]
  assert docs_tables.main(["--root", str(tmp_path)]) == 1
  assert docs_tables.write(str(tmp_path)) == ["README.md"]
  assert (tmp_path / "README.md").read_text() == (
      "x\n<!-- results: results/t.md -->\n| a |\n|---|\n| 1.5x |\n<!-- /results -->\ny\n"
  )
  assert docs_tables.main(["--root", str(tmp_path)]) == 0
