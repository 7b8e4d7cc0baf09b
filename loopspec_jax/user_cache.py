"""What a process may keep between runs in the user's cache folder: compiled programs and the planner's plans.

Both are off by default in the library (a test or a notebook decides for itself) and on for every console
script (`experiments.common.run` calls `enable`), so that a second `loopspec-demo` loads its decode loops and
the plans of `method="auto"` instead of compiling and probing again.

  folder     $LOOPSPEC_CACHE_DIR, else $XDG_CACHE_HOME/loopspec_jax, else ~/.cache/loopspec_jax
             ("off" in LOOPSPEC_CACHE_DIR: nothing is kept)
  jax/       jax's persistent compilation cache (executables keyed by jax on program, backend and flags)
  plans/     one JSON file per plan (`PlanStore`), keyed by a hash of what the plan depends on: the model
             (its config and where it was loaded from), batch, prompt and context buckets, sampling settings,
             device, host and the planner's settings, and the package version

A plan is a measurement of this host; a plan of a model that was not loaded from a path (a random or
in-memory model), or with a drafter object, is kept in memory only.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Optional, Tuple

ENV = "LOOPSPEC_CACHE_DIR"
_STATE = {"plans": None}  # the enabled PlanStore's folder, or None (memory only)


def cache_dir() -> Optional[str]:
  """The user cache folder (module docstring), or None when LOOPSPEC_CACHE_DIR is 'off'."""
  given = os.environ.get(ENV)
  if given is not None:
    return None if given.strip().lower() in ("", "off", "0") else os.path.abspath(os.path.expanduser(given))
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "loopspec_jax")


def enable(folder: Optional[str] = None, min_compile_seconds: float = 0.5) -> Optional[str]:
  """Keeps compiled programs (jax's persistent compilation cache, those that took at least
  `min_compile_seconds` to compile) and plans under `folder` (default `cache_dir()`); returns the folder, or
  None when caching is off. Idempotent."""
  folder = cache_dir() if folder is None else folder
  if folder is None:
    return None
  import jax  # the library's import of this module must not configure jax

  os.makedirs(os.path.join(folder, "jax"), exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", os.path.join(folder, "jax"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
  _STATE["plans"] = os.path.join(folder, "plans")
  return folder


def disable_plans() -> None:
  """Plans stay in memory only (the jax compilation cache, once set, stays for the process)."""
  _STATE["plans"] = None


class Unstable:
  """A part of a key that names an object of this process only (a model not loaded from a path): a key that
  holds one is kept in memory, never on disk."""

  def __init__(self, obj):
    self.id = id(obj)

  def __eq__(self, other):
    return isinstance(other, Unstable) and other.id == self.id

  def __hash__(self):
    return hash(("Unstable", self.id))


def identity(obj):
  """What names `obj` across processes in a cache key: its `source` path (a loaded model), None for None,
  else `Unstable(obj)`."""
  if obj is None:
    return None
  source = getattr(obj, "source", None)
  return ("source", os.path.abspath(source)) if isinstance(source, str) and source else Unstable(obj)


def key_text(key) -> Optional[str]:
  """The text a key is stored under on disk (its repr), or None when a part of it is `Unstable`."""
  parts = list(key) if isinstance(key, tuple) else [key]
  while parts:
    x = parts.pop()
    if isinstance(x, Unstable):
      return None
    if isinstance(x, tuple):
      parts.extend(x)
  return repr(key)


def encode_method(m) -> dict:
  """A method object as JSON: its class (module and name) and the arguments that were given."""
  return {"class": f"{type(m).__module__}:{type(m).__qualname__}", "args": m.args}


def decode_method(saved: dict):
  """`encode_method` read back; only classes of this package are imported."""
  import importlib

  module, _, name = saved["class"].partition(":")
  if not module.startswith("loopspec_jax."):
    raise ValueError(f"not a loopspec_jax method class: {saved['class']!r}")
  return getattr(importlib.import_module(module), name)(**saved["args"])


class PlanStore(dict):
  """The planner's plan cache: a dict of plan key -> (method, plan) in memory, backed by one JSON file per
  plan in the user cache folder when `enable`d and the key has no `Unstable` part. `salt` (the planner's
  source, say) is hashed into every file name, so that plans of other code are never read."""

  def __init__(self, salt: str = ""):
    super().__init__()
    self._salt = salt

  def _path(self, key) -> Optional[str]:
    folder, text = _STATE["plans"], key_text(key)
    if folder is None or text is None:
      return None
    salt = f"{_version()}|{self._salt}|{platform.node()}|{text}"
    return os.path.join(folder, hashlib.sha256(salt.encode()).hexdigest()[:32] + ".json")

  def __contains__(self, key) -> bool:
    return dict.__contains__(self, key) or self._load(key) is not None

  def __getitem__(self, key) -> Tuple[object, dict]:
    if not dict.__contains__(self, key):
      got = self._load(key)
      if got is None:
        raise KeyError(key)
      dict.__setitem__(self, key, got)
    return dict.__getitem__(self, key)

  def __setitem__(self, key, value: Tuple[object, dict]) -> None:
    dict.__setitem__(self, key, value)
    path = self._path(key)
    if path is None:
      return
    method, plan = value
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
      json.dump({"key": key_text(key), "method": encode_method(method), "plan": plan}, f, default=_plain)
    os.replace(tmp, path)  # atomic: a reader sees a whole plan or none

  def _load(self, key) -> Optional[Tuple[object, dict]]:
    path = self._path(key)
    if path is None or not os.path.exists(path):
      return None
    try:
      with open(path) as f:
        saved = json.load(f)
      if saved["key"] != key_text(key):
        return None  # a hash collision, or a file of another version
      return decode_method(saved["method"]), dict(saved["plan"], from_disk=path)
    except (OSError, ValueError, KeyError, TypeError):
      return None  # a damaged or foreign file is a cache miss, never an error


def _plain(x):
  """JSON for numpy scalars and other plain-valued objects in a plan."""
  if hasattr(x, "item"):
    return x.item()
  if isinstance(x, (set, tuple)):
    return list(x)
  return str(x)


def _version() -> str:
  from importlib import metadata

  try:
    return metadata.version("loopspec_jax")
  except metadata.PackageNotFoundError:
    return "source"
