"""The house rules of the source tree, checked on the files themselves (issue 24).

- no function over 80 lines, no module over 600 lines, in the package (`loopspec_jax/`, `experiments/`,
  `configs/`: the last two install as `loopspec_jax.experiments` / `loopspec_jax.configs`);
- the library (everything but experiments and configs) never imports `loopspec_jax.experiments` or
  `loopspec_jax.configs`;
- results/ holds no .py or .sh file (scripts/ does);
- no import cycle between the package's modules (module-level imports; an import inside a function runs
  when it is called, after every module is loaded, and is the way to break one).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
_TREES = {"loopspec_jax": "loopspec_jax", "experiments": "loopspec_jax.experiments", "configs": "loopspec_jax.configs"}


def _modules() -> dict:
  """{dotted module name: path} of every .py file of the package."""
  out = {}
  for folder, prefix in _TREES.items():
    for path in sorted((ROOT / folder).rglob("*.py")):
      parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      out[".".join([prefix] + parts)] = path
  return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}


def _rel(name: str) -> str:
  return str(MODULES[name].relative_to(ROOT))


def _imports(name: str, top_level_only: bool) -> set:
  """Package modules `name` imports (`from pkg import mod` counts as mod when mod is a module, else pkg)."""
  tree, out = TREES[name], set()
  is_pkg = MODULES[name].name == "__init__.py"
  nodes = tree.body if top_level_only else list(ast.walk(tree))
  for node in nodes:
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names if a.name in MODULES)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative import
        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
        pkg = pkg[: len(pkg) - node.level + 1]
        base = ".".join(pkg + ([node.module] if node.module else []))
      for a in node.names:
        full = f"{base}.{a.name}"
        if full in MODULES:
          out.add(full)
        elif base in MODULES:
          out.add(base)
  return out - {name}


def test_functions_are_short():
  long = []
  for name, tree in TREES.items():
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > MAX_FUNCTION_LINES:
          long.append(f"{_rel(name)}:{node.lineno} {node.name} ({n} lines)")
  assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_modules_are_short():
  long = [
      f"{_rel(name)} ({n} lines)"
      for name, path in MODULES.items()
      if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
  ]
  assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_library_does_not_import_experiments_or_configs():
  """The library (imported from the repository root too, where the source folder has neither subpackage:
  `method="auto"` failed there when the planner read configs/accelerators.py) imports neither."""
  bad = [
      f"{_rel(name)} imports {m}"
      for name in MODULES
      if not name.startswith(("loopspec_jax.experiments", "loopspec_jax.configs"))
      for m in _imports(name, top_level_only=False)
      if m.startswith(("loopspec_jax.experiments", "loopspec_jax.configs"))
  ]
  assert not bad, bad


def _cycles(graph: dict) -> list:
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph[v]:
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

  for v in graph:
    if v not in index:
      visit(v)
  return out


def test_no_import_cycle():
  graph = {name: _imports(name, top_level_only=True) for name in MODULES}
  assert not _cycles(graph), _cycles(graph)


@pytest.mark.parametrize(
    "graph, cycles", [({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]), ({"a": {"b"}, "b": set()}, [])]
)
def test_cycle_finder(graph, cycles):
  assert _cycles(graph) == cycles


def test_results_hold_data_not_code():
  """Run folders under results/ hold data and a README with the command; scripts live in scripts/."""
  code = sorted(str(p.relative_to(ROOT)) for ext in ("*.py", "*.sh") for p in (ROOT / "results").rglob(ext))
  assert not code, f"move these to scripts/ (scripts/README.md): {code}"
