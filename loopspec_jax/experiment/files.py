"""Result files written so a killed run never leaves half of one, by process 0 of a multi-process run."""

from __future__ import annotations

import json
import os
import tempfile

import jax
import numpy as np


def atomic_write_text(path: str, text: str):
  """Write-then-rename so a killed process never leaves a half-written file."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def json_default(x):
  """numpy scalars and arrays as JSON numbers and lists (`json.dumps(default=...)`)."""
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    return float(x)
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(type(x))


def atomic_write_json(path: str, obj):
  """`obj` as indented JSON (numpy values as plain numbers), written atomically."""
  atomic_write_text(path, json.dumps(obj, indent=2, default=json_default))


def write_report(out_dir: str, name: str, payload, markdown: str):
  """An experiment's results as out_dir/name.json (payload) and out_dir/name.md (markdown), each written
  atomically, and a line saying where they went."""
  atomic_write_json(os.path.join(out_dir, f"{name}.json"), payload)
  atomic_write_text(os.path.join(out_dir, f"{name}.md"), markdown.rstrip("\n") + "\n")
  print(f"wrote {out_dir}/{name}.json and {name}.md")


def is_main_process() -> bool:
  """Whether this is process 0 (the one that writes results) of a possibly multi-process run."""
  return jax.process_index() == 0


def replace_block(path: str, name: str, text: str):
  """Rewrites only the part of the file `path` between `<!-- name -->` and `<!-- /name -->` with `text` (the
  rest of the page is other tools' or hand-written); a ValueError when the markers are missing."""
  with open(path) as f:
    page = f.read()
  start, end = f"<!-- {name} -->\n", f"\n<!-- /{name} -->"
  if start not in page or end not in page:
    raise ValueError(f"{path} has no {start.strip()} ... {end.strip()} block to rewrite")
  head, rest = page.split(start, 1)
  atomic_write_text(path, head + start + text.strip("\n") + end + rest.split(end, 1)[1])
