"""The house rules of the source tree, checked on the files themselves (issue 24).

- no function over 80 lines, no module over 600 lines, in the library (`loopspec_jax/`), `experiments/` and
  `configs/` (installed as the top-level packages `loopspec_experiments` / `loopspec_configs`);
- the library never imports `loopspec_experiments` or `loopspec_configs` (nor `experiments` / `configs`);
- results/ holds no .py or .sh file (scripts/ does);
- layers that only look down (issue 44): the import graph, counting the imports written inside functions
  (`import_graph.py`), has no circle, and no module imports a layer above its own (`LAYERS`).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import import_graph

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
_TREES = {"loopspec_jax": "loopspec_jax", "experiments": "loopspec_experiments", "configs": "loopspec_configs"}
# The library's layers, lowest first: a module may import its own layer and those below, never one above.
# Modules no layer names (config, analysis.theory / hardware / hlo, heads, probe, user_cache, ...) are held to
# the no-circle rule alone.
LAYERS = (
    ("loopspec_jax.config", "loopspec_jax.models", "loopspec_jax.checkpoint", "loopspec_jax.parallel"),
    ("loopspec_jax.decoding",),  # the verifiers, the tree machinery, each method's loop
    ("loopspec_jax.methods",),  # the registry
    ("loopspec_jax.analysis.cost", "loopspec_jax.analysis.calibrate"),  # the analysis that reads the registry
    ("loopspec_jax.planner",),
    ("loopspec_jax.api",),
    (
        "loopspec_jax.serving",
        "loopspec_jax.integrations",
        "loopspec_jax.experiment",
    ),  # experiment: what entry points share
    ("loopspec_experiments", "loopspec_configs"),
)

MODULES = import_graph.modules(ROOT, _TREES)
TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}


def _rel(name: str) -> str:
  return str(MODULES[name].relative_to(ROOT))


def _imports(name: str, top_level_only: bool) -> set:
  return import_graph.imports(name, MODULES[name], TREES[name], MODULES, top_level_only)


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


_NOT_LIBRARY = ("loopspec_experiments", "loopspec_configs", "experiments", "configs")


def _imported_roots(tree) -> set:
  """The top-level names of every module an AST imports (absolute imports, anywhere in it)."""
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name.split(".")[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      out.add(node.module.split(".")[0])
  return out


def test_library_does_not_import_experiments_or_configs():
  """`import loopspec_jax` is the whole library from the repository root too (its source folder), from any
  directory and installed or not: it needs nothing of experiments/ or configs/ (`method="auto"` once failed
  from the root when the planner read configs/accelerators.py, then mapped into the package)."""
  bad = [
      f"{_rel(name)} imports {root}"
      for name in MODULES
      if name.startswith("loopspec_jax")
      for root in sorted(_imported_roots(TREES[name]) & set(_NOT_LIBRARY))
  ]
  assert not bad, bad


def _graph() -> dict:
  """The package's import graph, function-level imports included."""
  return {name: _imports(name, top_level_only=False) for name in MODULES}


def test_no_import_circle():
  """Counting the imports inside functions: none may close a circle (issue 44 broke a 26-module one)."""
  circles = import_graph.cycles(_graph())
  assert not circles, circles


def test_layers_only_look_down():
  up = import_graph.upward_imports(_graph(), LAYERS)
  assert not up, f"imports of a higher layer (tests/test_code_rules.py LAYERS): {up}"


@pytest.mark.parametrize(
    "graph, cycles", [({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]), ({"a": {"b"}, "b": set()}, [])]
)
def test_cycle_finder(graph, cycles):
  assert import_graph.cycles(graph) == cycles


_HIGH = "from pkg import low\n\ndef g():\n  return low.f()\n"
_PLANTED = "\n\ndef planted():\n  from pkg import high  # an upward import, inside a function\n\n  return high\n"


def test_the_checks_catch_a_planted_function_level_upward_import(tmp_path):
  """A two-layer package whose low module imports the high one only inside a function: the import graph sees
  the edge (module-level imports alone would not), so both the circle and the layer checks fail on it."""
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "__init__.py").write_text("")
  (tmp_path / "pkg" / "high.py").write_text(_HIGH)
  (tmp_path / "pkg" / "low.py").write_text("def f():\n  return 1\n")
  layers = (("pkg.low",), ("pkg.high",))
  clean = import_graph.import_graph(tmp_path, {"pkg": "pkg"})
  assert not import_graph.cycles(clean) and not import_graph.upward_imports(clean, layers)
  (tmp_path / "pkg" / "low.py").write_text("def f():\n  return 1\n" + _PLANTED)
  planted = import_graph.import_graph(tmp_path, {"pkg": "pkg"})
  assert import_graph.cycles(planted) == [["pkg.high", "pkg.low"]]
  assert import_graph.upward_imports(planted, layers) == ["pkg.low -> pkg.high"]
  assert not import_graph.cycles(import_graph.import_graph(tmp_path, {"pkg": "pkg"}, top_level_only=True))


def test_results_hold_data_not_code():
  """Run folders under results/ hold data and a README with the command; scripts live in scripts/."""
  code = sorted(str(p.relative_to(ROOT)) for ext in ("*.py", "*.sh") for p in (ROOT / "results").rglob(ext))
  assert not code, f"move these to scripts/ (scripts/README.md): {code}"


def test_tests_mirror_the_package():
  """Each test file sits in tests/ (the top-level modules, the repository's own rules) or in the folder of the
  package part it tests (tests/decoding/tree/ for loopspec_jax/decoding/tree/, tests/experiments/ for
  experiments/); basenames are unique, as pytest's default import mode needs (tests/ has no __init__.py)."""
  tests = ROOT / "tests"
  files = sorted(tests.rglob("test_*.py"))
  homes = {p.parent.relative_to(tests) for p in files} - {pathlib.Path(".")}
  strays = sorted(
      str(h)
      for h in homes
      if not (ROOT / "loopspec_jax" / h).is_dir() and not (h.parts[0] == "experiments" and len(h.parts) == 1)
  )
  assert not strays, f"test folders with no package folder of that name: {strays}"
  names = [p.name for p in files]
  assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
