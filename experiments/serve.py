"""loopspec-serve: an OpenAI-compatible completions server with continuous batching (FastAPI + uvicorn).

  loopspec-serve --config.model=tiny-raven --config.method=loopspec:2,8 --config.port=8000

Settings: configs/serve.py (`--config.<field>=<value>` overrides any of them; `--help` lists them). The model
is a bundled model name, a checkpoint directory (HF or `lj.save` output) or 'random:<family>:<variant>'; the
method any spec of the registry (`loopspec_jax.methods.NAMES`). The port opens once the model is loaded and the
engine built (its prefill compiled): /health answers (liveness) while the decode loop compiles (`warmup`),
/ready and the completion routes answer 503 until it is done. Serves POST /v1/completions and
/v1/chat/completions (streamed or not), GET /v1/models[/{id}], /health, /ready and /metrics
(loopspec_jax/serving/server.py).

Supervision: if the engine's loop dies, the requests in flight get a 500, /health and /ready a 503 naming the
cause, and after `FAILURE_GRACE_S` (for those answers to go out) the server shuts down and the process exits 1,
for its supervisor (systemd `Restart=on-failure`, a container's restart policy) to start a fresh one. SIGTERM
shuts down gracefully within `shutdown_timeout` seconds: connections still open then (a client stalled halfway
through its body) are closed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Optional

from absl import flags
from ml_collections import config_flags

from loopspec_jax import methods
from loopspec_experiments import common
from loopspec_jax.serving import Engine, EngineConfig, Request

FAILURE_GRACE_S = 1.0  # after an engine failure: time for the in-flight error answers before shutting down
FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config",
    common.config_path("serve.py"),
    f"Server settings (methods: {', '.join(methods.NAMES)}).",
    flag_values=FLAGS,
)


def build_engine(model_spec: str, *, dtype: str = "float32", mesh=None, draft_model: str = "", **config):
  """(model, Engine) for a model spec and EngineConfig fields (`method`: a spec or Method of the registry;
  `draft_model`: the drafter's model spec for method 'draft')."""
  model = common.resolve_model(model_spec, dtype=dtype)
  if draft_model:
    config["method"] = methods.build(
        config.get("method", "draft"), draft_model=common.resolve_model(draft_model, dtype=dtype)
    )
  return model, Engine(model, EngineConfig(**config), mesh=mesh)


def warm_up(engine) -> None:
  """Runs one short request through prefill, admission and the decode loop so that they are compiled."""
  engine.generate(Request(prompt=[1, 2, 3], max_tokens=2, temperature=0.0))


def served_name(model_spec: str, name: Optional[str]) -> str:
  return name or os.path.basename(os.path.normpath(model_spec))


def engine_from_config(c):
  """(model, Engine) of a configs/serve.py config."""
  return build_engine(
      c.model,
      dtype=c.dtype,
      draft_model=c.draft_model,
      method=c.method,
      slots=c.slots,
      max_queue=c.max_queue,
      ticks_per_call=c.ticks_per_call,
      greedy_only=c.greedy_only,
      max_len=c.max_len,
      seed=c.seed,
  )


def uvicorn_config(app, c):
  """uvicorn's settings for a configs/serve.py config (host, port, logs, graceful-shutdown bound)."""
  import uvicorn

  return uvicorn.Config(
      app,
      host=c.host,
      port=c.port,
      log_level="info" if c.access_log else "warning",
      access_log=c.access_log,
      timeout_graceful_shutdown=c.shutdown_timeout,
  )


def serve_until_exit(server, engine, grace_s: float = FAILURE_GRACE_S) -> int:
  """Runs a uvicorn `server` until it exits (SIGTERM / SIGINT, or `should_exit`); returns the exit status: 0,
  or 1 when the engine failed (then it asks the server to exit `grace_s` after the failure)."""
  over = threading.Event()

  def watch():
    while not over.is_set():
      if engine.failed.wait(timeout=0.2):
        print(f"the engine failed ({engine.failure}); shutting down (exit 1)", file=sys.stderr, flush=True)
        time.sleep(grace_s)
        server.should_exit = True
        return

  threading.Thread(target=watch, name="loopspec-supervisor", daemon=True).start()
  try:
    server.run()
  finally:
    over.set()
  return 1 if engine.failure is not None else 0


def build_app(c, model, engine, ready=None):
  """The FastAPI app of a configs/serve.py config: the served name, the chat template (`chat_template`, else
  the one the checkpoint ships: every bundled model has one), the body limit."""
  from loopspec_jax.serving import chat
  from loopspec_jax.serving import server  # FastAPI: the optional 'serve' extra

  return server.create_app(
      engine,
      served_name(c.model, c.served_model_name),
      ready=ready,
      chat_template=chat.load(model, c.chat_template or None),
      max_body_bytes=c.max_body_bytes,
  )


def main(argv):
  del argv
  import uvicorn

  c = _CONFIG.value
  print(f"loading {c.model} and building the {c.method} engine ({c.slots} slots) ...", flush=True)
  model, engine = engine_from_config(c)
  engine.start()
  ready = threading.Event()

  def warm():
    if c.warmup:
      print("compiling (/ready answers 503 until done) ...", flush=True)
      warm_up(engine)
    ready.set()
    print("ready", flush=True)

  threading.Thread(target=warm, name="loopspec-warmup", daemon=True).start()
  app = build_app(c, model, engine, ready)
  print(f"serving {served_name(c.model, c.served_model_name)!r} on http://{c.host}:{c.port}/v1", flush=True)
  try:
    return serve_until_exit(uvicorn.Server(uvicorn_config(app, c)), engine)
  finally:
    engine.stop()


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  sys.exit(run())
