"""What every experiment entry point shares: flag parsing, quiet logs, model and method specs, stats sums, files.

Conventions of all experiments (the `loopspec-*` console scripts and `python -m loopspec_experiments.X`):
  * settings are one ml_collections config file per experiment, `--config=PATH[:VARIANT]`; PATH may be relative to
    the working directory or to the package's `configs/` folder (so `--config=bench/bundled.py:quick`
    works from any directory), and VARIANT is only a named preset (the file's `get_config(arg)`);
  * the one override syntax is `--config.<field>=<value>`;
  * "none" is spelled `none` everywhere on the command line and in spec strings (`--config.d2=none`,
    `loopspec:d1=2,d2=none`, `1,none` in a sweep's config list); in Python configs it is `None`;
  * absl, jax and orbax log at WARNING unless `--verbosity` (`-v`) asks for more, so a script prints only its own
    progress and results.
Each experiment module keeps its flags in its own `flags.FlagValues` (`FLAGS`), so tests and notebooks can import
several experiments into one process without their `--config` flags colliding.
"""

from __future__ import annotations

import ast
import functools
import glob
import json
import logging as py_logging
import os
import platform
import sys
import tempfile
from typing import List, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags
import numpy as np

import loopspec_jax
from loopspec_jax.decoding.stats import DecodeStats
from loopspec_jax import api
from loopspec_jax import methods
from loopspec_jax import user_cache
import loopspec_configs as configs
from loopspec_jax.analysis import depth_metrics
from loopspec_jax.checkpoint import native
from loopspec_jax.config import ModelConfig
from loopspec_configs import models as model_configs

NONE = "none"  # the one spelling of "no value" on the command line and in spec strings
CONFIG_DIR = os.path.dirname(os.path.abspath(configs.__file__))
# Python loggers of libraries that log start-up chatter (checkpointer settings, backends not found) at INFO.
_CHATTY_LOGGERS = ("jax", "jax._src.xla_bridge", "orbax", "orbax.checkpoint", "absl")


# ---------------------------------------------------------------------------------------------------
# Flags, config paths, logs
# ---------------------------------------------------------------------------------------------------
def config_path(relative: str) -> str:
  """The absolute path of a config file inside the package, e.g. config_path("bench/bundled.py")."""
  return os.path.join(CONFIG_DIR, relative)


def resolve_config_arg(value: str) -> str:
  """'PATH[:VARIANT]' with PATH made absolute: as given if it exists, else inside configs/."""
  path, sep, variant = value.partition(":")
  if os.path.exists(path):
    return value
  for prefix in ("configs/", "configs/"):
    if path.startswith(prefix):
      path = path[len(prefix) :]
  candidate = config_path(path)
  return candidate + sep + variant if os.path.exists(candidate) else value


def _default_config_arg(own: flags.FlagValues) -> str:
  """The default `--config` value of an experiment (the path given to DEFINE_config_file)."""
  return ast.literal_eval(own["config"].default_as_str)


def config_argv(argv: Sequence[str], own: flags.FlagValues) -> List[str]:
  """argv with `--config` resolved (package-relative paths) and present (the default inserted when absent).

  config_flags reads the `--config.<field>` overrides when `--config` itself is parsed, so the flag is always
  given explicitly, ahead of its overrides.
  """
  out = [argv[0]]
  given = False
  for arg in argv[1:]:
    if arg.startswith("--config="):
      arg = "--config=" + resolve_config_arg(arg[len("--config=") :])
      given = True
    out.append(arg)
  if not given and "config" in own:
    out.insert(1, "--config=" + _default_config_arg(own))
  return out


def quiet_logs(verbosity_given: bool = False):
  """absl logs at WARNING and the chatty library loggers too, unless the user passed --verbosity."""
  if verbosity_given:
    return
  logging.set_verbosity(logging.WARNING)
  for name in _CHATTY_LOGGERS:
    py_logging.getLogger(name).setLevel(py_logging.WARNING)


def parse_flags(own: flags.FlagValues, argv: Sequence[str]) -> List[str]:
  """Parses an experiment's own flags (`--config`, `--config.*`), then absl's (`--verbosity`, ...).

  Returns the positional arguments (argv[0] first), as absl's parser does. Re-parsing in one process (tests)
  is allowed: the override flags a previous parse defined are removed first.
  """
  argv = config_argv(argv, own)
  for name in [n for n in own if n.startswith("config.")]:
    delattr(own, name)
  if any(a in ("--help", "-h", "--helpshort", "-?") for a in argv[1:]):
    print(own.get_help())
    given = [a[len("--config=") :] for a in argv[1:] if a.startswith("--config=")]
    if given:
      print(config_help(given[-1]))
    print("Override any config field with --config.<field>=<value>; 'none' spells an absent value.")
    print(f"absl's own flags (--verbosity, ...): {os.path.basename(argv[0])} --helpfull")
    sys.exit(0)  # help asked for is not an error
  saved = sys.argv
  sys.argv = list(argv)  # config_flags looks for the --config.* overrides in sys.argv
  try:
    rest = own(argv, known_only=True)
  finally:
    sys.argv = saved
  rest = flags.FLAGS(rest)
  quiet_logs(flags.FLAGS["verbosity"].present)
  return rest


def config_help(config_arg: str) -> str:
  """The fields of a config file (default values of its preset, their comments) and its presets, for --help."""
  import importlib.util
  import re

  path, _, variant = resolve_config_arg(config_arg).partition(":")
  try:
    spec = importlib.util.spec_from_file_location("_config_for_help", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(variant or None)
    source = open(path).read()
  except Exception as e:  # help must not fail on a config it cannot load
    return f"(cannot read the config {config_arg!r}: {e})"
  comments = dict(re.findall(r"^  c\.(\w+) = .*?#\s*(.*)$", source, re.M))
  presets = sorted(set(re.findall(r"arg == [\"'](\w+)[\"']", source)))
  name = os.path.relpath(path, CONFIG_DIR) if os.path.abspath(path).startswith(CONFIG_DIR) else path
  lines = [f"Config fields of {name}{':' + variant if variant else ''} (--config.<field>=<value>):"]
  for key, value in config.items():
    shown = NONE if value is None else repr(value)
    lines.append(f"  {key} = {shown}" + (f"  # {comments[key]}" if key in comments else ""))
  if presets:
    lines.append(f"Presets (--config={name}:<preset>): {', '.join(presets)}")
  return "\n".join(lines)


def run(main, own: flags.FlagValues):
  """absl's app.run with this experiment's own flags parsed first; logs quiet unless --verbosity asks.
  Compiled programs and plans are kept in the user cache (`user_cache.enable`: a second run loads them), and
  a bad setting ends the script with one line naming it (`main_with_clear_errors`), not a traceback."""
  user_cache.enable()
  app.run(main_with_clear_errors(main), flags_parser=functools.partial(parse_flags, own))


def main_with_clear_errors(main):
  """`main` whose ValueError / FileNotFoundError (a setting the library refused before compiling) prints as
  one line, 'error: <message>', and exits with status 2; `--verbosity=1` shows the traceback instead."""

  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except (ValueError, FileNotFoundError) as e:
      if logging.get_verbosity() >= logging.INFO:
        raise
      prog = os.path.basename(sys.argv[0]) if sys.argv else "loopspec"
      print(f"{prog}: error: {e} (settings: --config.<field>=<value>; --help lists them)", file=sys.stderr)
      sys.exit(2)

  return wrapped


class _OptionalParser(flags.ArgumentParser):
  """An int / float / str parser that also reads NONE ("none") as None, for optional config fields."""

  def __init__(self, kind):
    super().__init__()
    self._kind = kind
    self.syntactic_help = f"{kind.__name__} or {NONE}"

  def parse(self, argument):
    if isinstance(argument, str) and argument.strip() == NONE:
      return None
    return self._kind(argument)

  def flag_type(self):
    return self._kind.__name__


config_flags.register_flag_parser_for_type(int, _OptionalParser(int))
config_flags.register_flag_parser_for_type(float, _OptionalParser(float))
config_flags.register_flag_parser_for_type(str, _OptionalParser(str))


def parse_optional_int(text) -> Optional[int]:
  """'4' -> 4, 'none' -> None (NONE is the one spelling; ints and None pass through)."""
  if text is None or isinstance(text, int):
    return text
  text = str(text).strip()
  if text == NONE:
    return None
  try:
    return int(text)
  except ValueError as e:
    raise ValueError(f"expected an integer or {NONE!r}, got {text!r}") from e


def split_list(text) -> list:
  """'a,b' -> ['a', 'b'] (lists and tuples pass through as strings)."""
  if isinstance(text, (list, tuple)):
    return [str(x).strip() for x in text]
  return [x.strip() for x in str(text).split(",") if x.strip()]


# ---------------------------------------------------------------------------------------------------
# Models and methods
# ---------------------------------------------------------------------------------------------------
def resolve_model(spec: str, *, contraction: Optional[float] = None, seed: int = 0, dtype: str = "float32"):
  """'random:<family>:<variant>' (e.g. 'random:huginn:bench_r32') builds random weights, contractive when
  `contraction` is given; anything else is a bundled model name or a checkpoint directory (HF or our own)."""
  if spec.startswith("random:"):
    cfg = model_configs.model_config(spec[len("random:") :], dtype=dtype)
    return api.from_config(cfg, seed=seed, contraction=contraction)
  return loopspec_jax.load(spec, dtype=dtype)


def model_config_at(spec: str, dtype: str, context: int):
  """The `ModelConfig` (no weights) of a configs.models spec ("huginn:0125") or "bundled:<name>", at `dtype`
  with a context of `context` positions (the cost report's models)."""
  if spec.startswith("bundled:"):
    path = os.path.join(native.bundled_path(spec[len("bundled:") :]), native.OWN_CONFIG)
    with open(path) as f:
      cfg = ModelConfig.from_dict(json.load(f))
  else:
    cfg = model_configs.model_config(spec)
  return cfg.replace(dtype=dtype, max_len=context)


def best_depths(model) -> tuple:
  """The (d1, d2) the theory and our sweeps favour for the model's family and depth (`methods.default_depths`)."""
  return methods.default_depths(model.config)


def prompts_for(cfg, task: str, model) -> list:
  """The prompts of `task` as a depth / sweep config asks for them (count, length, seed, token cut)."""
  return depth_metrics.prepare_prompts(
      task,
      model,
      cfg.num_prompts,
      max_new_tokens=cfg.max_new_tokens,
      prompt_len=cfg.prompt_len,
      seed=cfg.seed,
      max_prompt_tokens=cfg.get("max_prompt_tokens") or None,
  )


def model_identity(cfg) -> dict:
  """What identifies the model in result keys: the spec, and for random models the contraction and seed."""
  contraction = cfg.get("contraction")
  random = cfg.model.startswith("random:")
  return {"model": cfg.model, "contraction": contraction if random else None, "seed": cfg.seed}


def load_model(cfg):
  """The model of an experiment config (fields model, contraction, seed)."""
  return resolve_model(cfg.model, contraction=model_identity(cfg)["contraction"], seed=cfg.seed)


def parse_number(text):
  """'4' -> 4, '0.25' -> 0.25, 'none' -> None (numbers and None pass through)."""
  try:
    return parse_optional_int(text)
  except ValueError:
    try:
      return float(text)
    except ValueError:
      raise ValueError(f"expected a number or {NONE!r}, got {text!r}") from None


def total(counts: list) -> dict:
  """Every figure of a list of runs of one method: their `DecodeStats` added, then `summary()` (the method's
  own class derives its figures from the summed raw counts)."""
  return DecodeStats.total(list(counts)).summary()


def release_compiled():
  """Drops every compiled program (`jax.clear_caches`) between groups of a long experiment.

  XLA CPU keeps 1,000-2,700 memory mappings of JIT code per compiled decode loop (measured on the bundled
  models), and a process that compiles many configurations runs out of the kernel's 65,530 (LLVM "Cannot
  allocate memory", then a crash). Groups (task, sampling) recompile their programs anyway."""
  jax.clear_caches()


def time_line(label: str, agg: dict, ar: Optional[dict] = None) -> str:
  """Where the time goes, from summed stats: 'loopspec: 81 ticks, 0.79 tokens/tick, 1.9 ms/tick (AR: 3.1 ms/token)'.

  `agg` and `ar` hold ticks, tokens and decode_seconds (as `total` returns them).
  """
  ticks = max(agg["ticks"], 1)
  text = (
      f"{label}: {agg['ticks']} ticks, {agg['tokens'] / ticks:.2f} tokens/tick, "
      f"{1e3 * agg['decode_seconds'] / ticks:.2f} ms/tick"
  )
  if ar is not None:
    text += f" (AR: {1e3 * ar['decode_seconds'] / max(ar['tokens'], 1):.2f} ms/token)"
  return text


# ---------------------------------------------------------------------------------------------------
# Files and processes
# ---------------------------------------------------------------------------------------------------
def atomic_write_text(path: str, text: str):
  """Write-then-rename so a killed process never leaves a half-written file."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def atomic_write_json(path: str, obj):
  atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default))


def cpu_model() -> str:
  """The processor's model name (/proc/cpuinfo; platform.processor() elsewhere): ratios on a CPU depend on it."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def machine_description() -> str:
  """Host, processor, cores and jax backend: what a benchmark's ratios depend on."""
  return (
      f"{platform.node()} {platform.machine()} ({cpu_model()}), {os.cpu_count()} CPU cores, jax {jax.__version__} on "
      f"{jax.devices()[0].platform}"
  )


def last_level_cache_bytes(default: int = 32 << 20) -> int:
  """The largest CPU cache of this host (Linux sysfs: cpu0's highest-level unified cache), or `default` where
  the kernel does not say."""
  sizes = []
  for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
    try:
      with open(path) as f:
        text = f.read().strip().upper()
    except OSError:
      continue
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    if digits.isdigit():
      sizes.append(int(digits) * unit)
  return max(sizes) if sizes else default


def write_report(out_dir: str, name: str, payload, markdown: str):
  """An experiment's results as out_dir/name.json (payload) and out_dir/name.md (markdown), each written
  atomically, and a line saying where they went."""
  atomic_write_json(os.path.join(out_dir, f"{name}.json"), payload)
  atomic_write_text(os.path.join(out_dir, f"{name}.md"), markdown.rstrip("\n") + "\n")
  print(f"wrote {out_dir}/{name}.json and {name}.md")


def _json_default(x):
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    return float(x)
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(type(x))


def is_main_process() -> bool:
  """Whether this is process 0 (the one that writes results) of a possibly multi-process run."""
  return jax.process_index() == 0


def gb(x) -> str:
  """Bytes as GB (1e9) with two decimals; '-' for None."""
  return "-" if x is None else f"{x / 1e9:.2f}"


def md_table(header: str, lines: list) -> str:
  """A markdown table: header 'a | b | c' and one list of cells per line."""
  rule = "|" + "---|" * (header.count("|") + 1)
  return "\n".join([f"| {header} |", rule] + ["| " + " | ".join(str(c) for c in cells) + " |" for cells in lines])
