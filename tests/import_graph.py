"""The import graph of a source tree, counting the imports written inside functions (tests/test_code_rules.py).

An import inside a function runs when the function is called, after every module is loaded, so Python accepts
a circle made of them; the layering does not: a function-level import of a higher layer is an upward
dependency like any other. `import_graph` reads every import statement of every module (module level, inside
functions and classes, under `if`), `cycles` finds the circles and `upward_imports` the imports that look up
a declared layer order.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, List, Sequence, Set


def modules(root: pathlib.Path, trees: Dict[str, str]) -> Dict[str, pathlib.Path]:
  """{dotted module name: path} of every .py file under root / folder, named `prefix`.<relative path>, for
  each folder: prefix of `trees` (a package's __init__.py is the package's name)."""
  out = {}
  for folder, prefix in trees.items():
    for path in sorted((root / folder).rglob("*.py")):
      parts = list(path.relative_to(root / folder).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      out[".".join([prefix] + parts)] = path
  return out


def imports(name: str, path: pathlib.Path, tree: ast.AST, known, top_level_only: bool = False) -> Set[str]:
  """The modules of `known` that module `name` (at `path`, parsed as `tree`) imports: every import statement
  anywhere in it, or only its module-level ones. `from pkg import mod` counts as mod when mod is a module of
  `known`, else as pkg; relative imports are resolved against `name`."""
  out = set()
  is_pkg = path.name == "__init__.py"
  for node in tree.body if top_level_only else ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names if a.name in known)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
        pkg = pkg[: len(pkg) - node.level + 1]
        base = ".".join(pkg + ([node.module] if node.module else []))
      for a in node.names:
        full = f"{base}.{a.name}"
        if full in known:
          out.add(full)
        elif base in known:
          out.add(base)
  return out - {name}


def import_graph(root: pathlib.Path, trees: Dict[str, str], top_level_only: bool = False) -> Dict[str, Set[str]]:
  """{module: the modules of the same trees it imports} (`modules`, `imports`): function-level imports count
  unless `top_level_only`."""
  found = modules(root, trees)
  parsed = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in found.items()}
  return {name: imports(name, found[name], parsed[name], found, top_level_only) for name in found}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
  """The circles of `graph`: its strongly connected components of more than one module (Tarjan), sorted."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return sorted(out)


def layer_of(name: str, layers: Sequence[Sequence[str]]):
  """The index of the layer whose longest prefix (a module or package name) matches `name`; None: unranked."""
  best, rank = -1, None
  for i, prefixes in enumerate(layers):
    for p in prefixes:
      if (name == p or name.startswith(p + ".")) and len(p) > best:
        best, rank = len(p), i
  return rank


def upward_imports(graph: Dict[str, Set[str]], layers: Sequence[Sequence[str]]) -> List[str]:
  """'a -> b' for every import of a module `a` of a layer below the layer of `b` (`layers`: lowest first;
  modules no layer names are not checked here, only by `cycles`)."""
  out = []
  for a in sorted(graph):
    ra = layer_of(a, layers)
    for b in sorted(graph[a]):
      rb = layer_of(b, layers)
      if ra is not None and rb is not None and rb > ra:
        out.append(f"{a} -> {b}")
  return out
