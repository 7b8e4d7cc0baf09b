"""Copies results tables into the docs, so that no benchmark table in docs/ is typed by hand.

  python -m loopspec_experiments.docs_tables --write    # rewrite every marked block from its file
  python -m loopspec_experiments.docs_tables            # check only: exit 1 if a block is stale

A block in README.md or docs/*.md is

  <!-- results: results/bundled/bench_2026-12-02/targets.md -->
  ... the named file's content, verbatim ...
  <!-- /results -->

and its content is the named file's, byte for byte (the path is relative to the repository root). The
benchmarks write those .md files beside their .json; this tool only copies them. tests/test_docs.py checks
that every block equals its file, so the docs cannot drift from the results they quote.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import List, Tuple

OPEN = re.compile(r"^<!-- results: (?P<path>\S+) -->\n", re.M)
CLOSE = "<!-- /results -->\n"


def doc_files(root: str) -> List[str]:
  """README.md and every docs/*.md under the repository `root` (absolute paths, sorted)."""
  docs = os.path.join(root, "docs")
  names = sorted(n for n in os.listdir(docs) if n.endswith(".md")) if os.path.isdir(docs) else []
  return [os.path.join(root, "README.md")] + [os.path.join(docs, n) for n in names]


def blocks(text: str) -> List[Tuple[str, int, int]]:
  """The marked blocks of a document: (results path, start, end) with text[start:end] the block's content.
  An opening marker without its closing one is a ValueError naming the path."""
  out = []
  for m in OPEN.finditer(text):
    end = text.find(CLOSE, m.end())
    if end < 0:
      raise ValueError(f"<!-- results: {m.group('path')} --> has no closing {CLOSE.strip()}")
    out.append((m.group("path"), m.end(), end))
  return out


def fill(text: str, root: str) -> str:
  """`text` with every marked block replaced by its file's content (ending in a newline)."""
  pieces, last = [], 0
  for path, start, end in blocks(text):
    with open(os.path.join(root, path), encoding="utf-8") as f:
      content = f.read()
    pieces += [text[last:start], content if content.endswith("\n") else content + "\n"]
    last = end
  return "".join(pieces) + text[last:]


def stale(root: str) -> List[str]:
  """The documents under `root` whose marked blocks differ from their files (relative paths)."""
  out = []
  for doc in doc_files(root):
    with open(doc, encoding="utf-8") as f:
      text = f.read()
    if fill(text, root) != text:
      out.append(os.path.relpath(doc, root))
  return out


def write(root: str) -> List[str]:
  """Rewrites every stale document under `root`; returns the ones it rewrote."""
  changed = stale(root)
  for rel in changed:
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8") as f:
      text = f.read()
    with open(path, "w", encoding="utf-8") as f:
      f.write(fill(text, root))
  return changed


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--write", action="store_true", help="rewrite stale blocks (default: check only)")
  parser.add_argument("--root", default=".", help="the repository root (default: the current directory)")
  args = parser.parse_args(argv)
  root = os.path.abspath(args.root)
  if args.write:
    for rel in write(root):
      print(f"rewrote {rel}")
    return 0
  bad = stale(root)
  for rel in bad:
    print(f"stale results block in {rel}: run python -m loopspec_experiments.docs_tables --write")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
