"""Decode a prompt with a looped model: `loopspec-generate --config.prompt_ids=1,2,3 --config.max_new_tokens=16`.

Loads the checkpoint (an HF directory, one saved by `loopspec_jax.save`, or a bundled model name), encodes the
prompt (text through the checkpoint's tokenizer when it has one, else the comma-separated `prompt_ids`),
decodes with the chosen method and prints the continuation (text or ids) and the decoding speed. Settings:
configs/generate.py.
"""

from __future__ import annotations

from typing import Optional

from absl import app
from absl import flags
from ml_collections import config_flags

import loopspec_jax
from loopspec_experiments import common

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("generate.py"), "Generation settings.", flag_values=FLAGS
)


def parse_ids(text: str) -> list:
  text = str(text).strip()
  if not text:
    return []
  try:
    return [int(t) for t in text.replace(" ", "").split(",") if t]
  except ValueError as e:
    raise ValueError(f"prompt_ids must be comma-separated integers, got {text!r}") from e


def prompt_tokens(model: loopspec_jax.LoopedModel, config) -> tuple:
  """(token ids, how they were obtained) from the config's prompt text or prompt_ids."""
  if config.prompt and model.tokenizer is not None:
    return model.encode(config.prompt), "text"
  ids = parse_ids(config.prompt_ids)
  if not ids:
    if config.prompt:
      raise ValueError(f"the checkpoint {model.source!r} has no tokenizer.json; give the prompt as prompt_ids")
    raise ValueError("give a prompt (text) or prompt_ids")
  return ids, "ids"


def generate_from_config(config, model: Optional[loopspec_jax.LoopedModel] = None) -> dict:
  """Runs one generation described by `config` (configs/generate.py); prints and returns the result."""
  if model is None:
    model = loopspec_jax.load(config.checkpoint)
  ids, kind = prompt_tokens(model, config)
  if kind == "ids" and config.prompt:
    print("note: the checkpoint has no tokenizer; using prompt_ids instead of the prompt text")
  extra = {k: config[k] for k in ("d1", "d2", "gamma") if config[k] is not None}
  res = loopspec_jax.generate(
      model,
      [ids],
      max_new_tokens=config.max_new_tokens,
      method=config.method,
      temperature=config.temperature,
      top_k=config.top_k,
      top_p=config.top_p,
      seed=config.seed,
      eos_id=model.config.eos_id,
      **extra,
  )
  new = res.tokens[0]
  stats = res.stats
  print(f"model: {model.family} (R={model.recurrence}) from {model.source}; method {config.method}")
  if model.tokenizer is not None:
    print(f"prompt: {model.decode(ids)!r}")
    print(f"output: {model.decode(new)!r}")
  else:
    print(f"prompt ids: {ids}")
    print(f"output ids: {new}")
  print(speed_line(stats))
  return {
      "prompt_ids": ids,
      "tokens": new,
      "text": model.decode(new) if model.tokenizer is not None else None,
      "stats": stats,
  }


def speed_line(stats: dict) -> str:
  """Tokens, decode seconds and rate with compiling left out, and the compile seconds beside them."""
  line = (
      f"{stats['tokens_generated']} tokens in {stats['decode_seconds']:.3f} s of decoding "
      f"({stats['tokens_per_second']:.1f} tokens/s; prefill {stats['prefill_seconds']:.3f} s)"
  )
  if stats.get("compile_seconds", 0.0) > 0.05:
    line += f"; compiling took {stats['compile_seconds']:.1f} s more (not counted; a warm call skips it)"
  return line


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  generate_from_config(_CONFIG.value)


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
