"""Packaging: the wheel holds the library with its data and models, and experiments/ and configs/ as the
top-level packages `loopspec_experiments` / `loopspec_configs` (no `experiments`, `configs` or `tests`);
`import loopspec_jax` is the same complete library from the repository root and from any other directory; every
console script answers --help from outside the checkout.

The repository keeps experiments/ and configs/ at its top; setup.cfg installs them under their own prefixed
names with an explicit package list (checked here against the tree, so a new subpackage cannot be left out)."""

import configparser
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from helpers import ROOT

_SETUP = configparser.ConfigParser()
_SETUP.read(os.path.join(ROOT, "setup.cfg"))


def _lines(section, key) -> list:
  return [x.strip() for x in _SETUP.get(section, key).strip().splitlines() if x.strip()]


def _package_dirs() -> dict:
  """{package: directory} as setup.cfg's package_dir maps them."""
  return dict(tuple(x.strip() for x in line.split("=")) for line in _lines("options", "package_dir"))


def _source_dir(package: str) -> str:
  """The repository directory that `package` installs from (the longest package_dir prefix)."""
  mapping = _package_dirs()
  parts = package.split(".")
  for n in range(len(parts), 0, -1):
    head = ".".join(parts[:n])
    if head in mapping:
      return os.path.join(ROOT, mapping[head], *parts[n:])
  return os.path.join(ROOT, *parts)


def test_package_list_is_the_whole_tree():
  listed = set(_lines("options", "packages"))
  found = set()
  for top, package in (
      ("loopspec_jax", "loopspec_jax"),
      ("experiments", "loopspec_experiments"),
      ("configs", "loopspec_configs"),
  ):
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
      dirnames[:] = [d for d in dirnames if d != "__pycache__"]
      if "__init__.py" in filenames:
        rel = os.path.relpath(dirpath, os.path.join(ROOT, top))
        found.add(package if rel == "." else package + "." + rel.replace(os.sep, "."))
  assert listed == found, f"setup.cfg lacks {sorted(found - listed)}, lists missing {sorted(listed - found)}"
  for package in listed:
    assert os.path.isfile(os.path.join(_source_dir(package), "__init__.py")), package


def test_repository_layout():
  for name in ("loopspec_jax", "experiments", "configs", "tests", "launch", "docs", "setup.cfg"):
    assert os.path.exists(os.path.join(ROOT, name)), name
  assert not os.path.exists(os.path.join(ROOT, "data")), "one copy of each data set: loopspec_jax/data"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
  """The wheel built from a copy of the checkout without its build outputs (setuptools builds in the source
  tree, so a stale build/ of a used checkout would leak old files into a wheel built in place)."""
  out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src") / "checkout"
  skip = shutil.ignore_patterns(".git", ".venv", ".ci-venv", "build", "dist", "*.egg-info", "results", "__pycache__")
  shutil.copytree(ROOT, src, ignore=skip)
  subprocess.run(
      [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
      check=True,
      capture_output=True,
      timeout=600,
  )
  (path,) = [p for p in os.listdir(out) if p.endswith(".whl")]
  return zipfile.ZipFile(os.path.join(out, path))


def test_wheel_contents(wheel):
  names = set(wheel.namelist())
  for expected in (
      "loopspec_experiments/demo.py",
      "loopspec_experiments/common.py",
      "loopspec_configs/bench/bundled.py",
      "loopspec_configs/train/tiny_raven.py",
      "loopspec_jax/data/gsm8k/test.jsonl",
      "loopspec_jax/data/tinyshakespeare/heldout.jsonl",
      "loopspec_jax/tasks/loopspec_gsm8k_cot.yaml",
      "loopspec_jax/assets/models/tiny-raven/loopspec_config.json",
      "loopspec_jax/assets/heads/tiny-raven-medusa/heads_config.json",
      "loopspec_jax/assets/heads/tiny-raven-medusa/params/manifest.ocdbt",
  ):
    assert expected in names, expected
  tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
  assert tops == {"loopspec_jax", "loopspec_experiments", "loopspec_configs"}, sorted(tops)
  assert not any(n.startswith(("loopspec_jax/experiments/", "loopspec_jax/configs/")) for n in names)


# The library's every layer, and the experiments and configs beside it: what `import loopspec_jax` must give
_IMPORTS = (
    "import loopspec_jax as lj, loopspec_jax.api, loopspec_jax.planner, loopspec_jax.serving.engine; "
    "import loopspec_experiments.common, loopspec_configs.models; "
    "assert lj.methods.parse('auto') == lj.Auto() and not hasattr(lj, 'experiments'); "
    "print(lj.__file__)"
)


@pytest.mark.parametrize("where", ["root", "elsewhere"])
def test_import_gives_the_whole_library_from_the_root_and_elsewhere(where, tmp_path):
  """Plain `python` (no -P) puts the working directory first on sys.path: from the repository root that is
  the source folder loopspec_jax/, which must be the whole library (nothing is mapped into it)."""
  cwd = ROOT if where == "root" else tmp_path
  out = subprocess.run(
      [sys.executable, "-c", _IMPORTS],
      cwd=cwd,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
      capture_output=True,
      text=True,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  if where == "root":
    assert os.path.realpath(out.stdout.strip()) == os.path.realpath(os.path.join(ROOT, "loopspec_jax", "__init__.py"))


def _console_scripts() -> list:
  return [line.split("=")[0].strip() for line in _lines("options.entry_points", "console_scripts")]


def test_every_console_script_answers_help_from_another_directory(tmp_path):
  """Run from an empty directory (nothing of the checkout on sys.path): the installed package serves them."""
  bindir = os.path.dirname(sys.executable)
  scripts = _console_scripts()
  missing = [s for s in scripts if not os.path.exists(os.path.join(bindir, s))]
  if missing:
    pytest.skip(f"console scripts not installed beside {sys.executable}: {missing}")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs = {
      s: subprocess.Popen(
          [os.path.join(bindir, s), "--help"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
      )
      for s in scripts
  }
  for s, p in procs.items():
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, f"{s} --help failed:\n{out.decode()[-2000:]}"
    assert b"usage" in out.lower() or b"flags" in out.lower(), (s, out.decode()[-500:])
