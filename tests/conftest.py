"""pytest configuration. Tests sit in folders mirroring the package (tests/decoding/tree/test_eagle.py tests
loopspec_jax/decoding/tree/eagle.py; the top-level modules' tests and the repository's rules in tests/ itself).
Shared test helpers live in tests/helpers.py (`import helpers`: pytest's default import mode puts this folder
on sys.path with this file); the package itself is pip-installed (`pip install -e .`).

One persistent jax compilation cache per test run: the first process that compiles a program (an xdist worker,
or a test that builds fresh jits of programs another test already compiled) writes the executable to a fresh
temporary folder, and every later identical compile in the run, in either worker, loads it instead of running
XLA again. Tracing is unchanged, so `_cache_size()` and `chex.assert_max_traces` count exactly as before; the
folder is removed at the end of the run. Subprocesses the tests start (the 8-device mesh workers, which count
backend compiles) do not use it. `LOOPSPEC_TEST_JAX_CACHE=off` turns it off; a folder name there keeps the
cache in that folder (not removed).

XLA compiles the tests' programs without LLVM's expensive optimisations (`FAST_COMPILE_FLAGS`, appended to
any XLA_FLAGS given): the tiny models' programs run in microseconds either way, and compiling is most of the
suite's time (a third less with these flags: tests/decoding/test_stats.py + test_methods.py 51 s -> 34 s). Every
comparison a test makes is between programs compiled alike in one run; `LOOPSPEC_TEST_FAST_COMPILE=off`
compiles as a user's program does.
"""

import os
import shutil
import tempfile

import pytest

_ENV = "LOOPSPEC_TEST_JAX_CACHE"
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def _fast_compile():
  """Adds FAST_COMPILE_FLAGS to XLA_FLAGS (read when the backend starts, after this) unless turned off."""
  if os.environ.get("LOOPSPEC_TEST_FAST_COMPILE", "").lower() in ("off", "0"):
    return
  flags = os.environ.get("XLA_FLAGS", "")
  if FAST_COMPILE_FLAGS not in flags:
    os.environ["XLA_FLAGS"] = (flags + " " + FAST_COMPILE_FLAGS).strip()


def pytest_configure(config):
  # the console scripts keep compiled programs and plans in the user's cache (loopspec_jax/user_cache.py);
  # tests that run them must not read or write it (a test of the cache sets its own folder)
  os.environ.setdefault("LOOPSPEC_CACHE_DIR", "off")
  _fast_compile()
  if _ENV not in os.environ:  # the xdist controller (or a serial run): the workers inherit the folder
    os.environ[_ENV] = tempfile.mkdtemp(prefix="loopspec-test-jax-cache-")
    config._loopspec_jax_cache = os.environ[_ENV]
  folder = os.environ[_ENV]
  if folder.lower() in ("", "0", "off"):
    return
  import jax

  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
  folder = getattr(config, "_loopspec_jax_cache", None)
  if folder:
    shutil.rmtree(folder, ignore_errors=True)
    os.environ.pop(_ENV, None)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops every compiled program after each test module (`jax.clear_caches`). XLA CPU maps 1,000-2,700 pages
  of JIT code per compiled decode loop (experiments/common.release_compiled), and a worker that compiles every
  method of many files in one process ran past the kernel's 65,530 mappings and crashed (a segmentation fault
  in test_dflash, 2026-12-06). Later modules that need a program again load it from the run's compilation
  cache (above) instead of compiling it."""
  yield
  import jax

  jax.clear_caches()
