"""loopspec-serve: an OpenAI-compatible completions server with continuous batching (FastAPI + uvicorn).

  loopspec-serve --model=tiny-raven --method=loopspec --d1=2 --d2=8 --port=8000

--model is a bundled model name, a checkpoint directory (HF or `lj.save` output) or 'random:<family>:<variant>'.
The engine (`loopspec_jax.serving.Engine`) compiles its decode loop before the port opens (--warmup), then
serves POST /v1/completions (streamed or not), GET /v1/models, GET /health and GET /metrics.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from absl import flags

from loopspec_jax.experiments import common
from loopspec_jax.serving import Engine, EngineConfig, Request

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "model", "tiny-raven", "Bundled model, checkpoint directory or random:<family>:<variant>.", flag_values=FLAGS
)
flags.DEFINE_string(
    "served_model_name", None, "The model id clients send (default: --model's basename).", flag_values=FLAGS
)
flags.DEFINE_enum("method", "loopspec", ["ar", "chain", "loopspec"], "Decoding method.", flag_values=FLAGS)
flags.DEFINE_integer("d1", None, "Draft depth (chain, loopspec).", flag_values=FLAGS)
flags.DEFINE_integer("d2", None, "LoopSpec's second-proposal depth (optional).", flag_values=FLAGS)
flags.DEFINE_integer("gamma", None, "Chain draft length.", flag_values=FLAGS)
flags.DEFINE_integer("lane_capacity", None, "LoopSpec lanes per request.", flag_values=FLAGS)
flags.DEFINE_integer("slots", 4, "Request slots decoded together (continuous batching).", flag_values=FLAGS)
flags.DEFINE_integer("max_queue", 64, "Waiting requests beyond which submissions get 429.", flag_values=FLAGS)
flags.DEFINE_integer("ticks_per_call", 16, "Decode-loop iterations per device call.", flag_values=FLAGS)
flags.DEFINE_boolean(
    "greedy_only", False, "Compile greedy kernels only (requests must use temperature 0).", flag_values=FLAGS
)
flags.DEFINE_integer("max_len", None, "Context per slot (default: the model's).", flag_values=FLAGS)
flags.DEFINE_integer("seed", 0, "The engine's base PRNG seed.", flag_values=FLAGS)
flags.DEFINE_string("dtype", "float32", "Parameter dtype.", flag_values=FLAGS)
flags.DEFINE_string("host", "127.0.0.1", "Address to bind.", flag_values=FLAGS)
flags.DEFINE_integer("port", 8000, "Port to bind.", flag_values=FLAGS)
flags.DEFINE_boolean("warmup", True, "Compile (one short request) before opening the port.", flag_values=FLAGS)


def build_engine(model_spec: str, *, dtype: str = "float32", mesh=None, **config):
  """(model, Engine) for a model spec and EngineConfig fields."""

  model = common.resolve_model(model_spec, dtype=dtype)
  return model, Engine(model, EngineConfig(**config), mesh=mesh)


def warm_up(engine) -> None:
  """Runs one short request through prefill, admission and the decode loop so that they are compiled."""

  engine.generate(Request(prompt=[1, 2, 3], max_tokens=2, temperature=0.0))


def served_name(model_spec: str, name: Optional[str]) -> str:
  return name or os.path.basename(os.path.normpath(model_spec))


def main(argv):
  del argv
  import uvicorn

  from loopspec_jax.serving import server  # FastAPI: the optional 'serve' extra

  f = FLAGS
  print(f"loading {f.model} and building the {f.method} engine ({f.slots} slots) ...", flush=True)
  _, engine = build_engine(
      f.model,
      dtype=f.dtype,
      method=f.method,
      d1=f.d1,
      d2=f.d2,
      gamma=f.gamma,
      lane_capacity=f.lane_capacity,
      slots=f.slots,
      max_queue=f.max_queue,
      ticks_per_call=f.ticks_per_call,
      greedy_only=f.greedy_only,
      max_len=f.max_len,
      seed=f.seed,
  )
  if f.warmup:
    print("compiling ...", flush=True)
    warm_up(engine)
  engine.start()
  name = served_name(f.model, f.served_model_name)
  print(f"serving {name!r} on http://{f.host}:{f.port}/v1", flush=True)
  try:
    uvicorn.run(server.create_app(engine, name), host=f.host, port=f.port, log_level="warning")
  finally:
    engine.stop()
  return 0


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  sys.exit(run())
