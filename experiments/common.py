"""What every experiment entry point shares: flag parsing, quiet logs, and the models of configs/.

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
import logging as py_logging
import os
import sys
from typing import List, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from loopspec_jax import user_cache
from loopspec_jax.experiment import models
import loopspec_configs as configs
from loopspec_configs import models as model_configs

# What experiments share lives in the library (loopspec_jax/experiment/, tested there); these names are
# re-exported for the entry points, which read them as `common.X`.
from loopspec_jax.experiment.files import atomic_write_json, atomic_write_text, is_main_process, write_report
from loopspec_jax.experiment.host import cpu_model, last_level_cache_bytes, machine_description
from loopspec_jax.experiment.models import best_depths, model_identity
from loopspec_jax.experiment.prompts import prompts_for
from loopspec_jax.experiment.settings import NONE, parse_number, parse_optional_int, split_list
from loopspec_jax.experiment.timing import release_compiled, time_line, total

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


# ---------------------------------------------------------------------------------------------------
# Models of configs/ (the library's `experiment.models`, handed this package's model-config table)
# ---------------------------------------------------------------------------------------------------
def resolve_model(spec: str, *, contraction: Optional[float] = None, seed: int = 0, dtype: str = "float32"):
  """'random:<family>:<variant>' (e.g. 'random:huginn:bench_r32') builds random weights of a configs/models
  config, contractive when `contraction` is given; anything else is a bundled model name or a checkpoint
  directory (HF or our own)."""
  return models.resolve_model(
      spec, model_config=model_configs.model_config, contraction=contraction, seed=seed, dtype=dtype
  )


def model_config_at(spec: str, dtype: str, context: int):
  """The `ModelConfig` (no weights) of a configs.models spec ("huginn:0125") or "bundled:<name>", at `dtype`
  with a context of `context` positions (the cost report's models)."""
  return models.model_config_at(spec, dtype, context, model_configs.model_config)


def load_model(cfg):
  """The model of an experiment config (fields model, contraction, seed)."""
  return models.load_model(cfg, model_configs.model_config)


def gb(x) -> str:
  """Bytes as GB (1e9) with two decimals; '-' for None."""
  return "-" if x is None else f"{x / 1e9:.2f}"


def md_table(header: str, lines: list) -> str:
  """A markdown table: header 'a | b | c' and one list of cells per line."""
  rule = "|" + "---|" * (header.count("|") + 1)
  return "\n".join([f"| {header} |", rule] + ["| " + " | ".join(str(c) for c in cells) + " |" for cells in lines])
