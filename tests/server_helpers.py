"""Helpers shared by the serving test files (tests/test_serv*.py; `import server_helpers`).

PieceTokenizer               a fake tokenizer whose tokens decode to multi-character pieces (stop strings
                             then straddle tokens); `with_pieces(model)` attaches one
http_server(app)             context manager: `app` served by uvicorn on 127.0.0.1 (a free port) on a
                             thread; yields the base URL once it accepts requests
tiny_raven_engine(max_queue) the session's started greedy LoopSpec (2, 8) tiny-raven engine (2 slots), one
                             per queue size, all sharing one compiled decode loop
tiny_raven_server(max_queue=2, **app_kw)   that engine behind a fresh app: (model, engine, base URL,
                             openai client)
expected_stop(model, ref, stops)   (text, token ids) of a request whose stop-free continuation is `ref`:
                             it ends at the first token whose prefix text holds a stop string
health_during(base, fn)      (fn's result, /health latencies in s measured every 10 ms while fn ran on a thread)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import loopspec_jax


class PieceTokenizer:
  """Token i decodes to PIECES[i % len(PIECES)]: multi-character pieces over a tiny alphabet, so that stop
  strings made of these letters are hit often and straddle token (and chunk) boundaries."""

  PIECES = ("a", "b", "ab", " ", "ba", "\n", "aa", "b a", "c", "bc")

  def decode(self, ids) -> str:
    return "".join(self.PIECES[int(i) % len(self.PIECES)] for i in ids)

  def id_to_token(self, i: int) -> str:
    return self.PIECES[int(i) % len(self.PIECES)]


def with_pieces(model):
  return dataclasses.replace(model, tokenizer=PieceTokenizer())


def free_port() -> int:
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def http_server(app, **config_kw):
  """`app` served by uvicorn on 127.0.0.1 on a daemon thread; yields its base URL once it accepts requests."""
  import threading
  import time

  import uvicorn

  port = free_port()
  srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config_kw))
  thread = threading.Thread(target=srv.run, daemon=True)
  thread.start()
  deadline = time.time() + 60
  while not srv.started and time.time() < deadline:
    time.sleep(0.02)
  assert srv.started, "uvicorn did not start"
  try:
    yield f"http://127.0.0.1:{port}"
  finally:
    srv.should_exit = True
    thread.join(timeout=30)


TINY_RAVEN_ENGINE = dict(method="loopspec", d1=2, d2=8, slots=2, max_queue=2, ticks_per_call=8, greedy_only=True)


@functools.lru_cache(maxsize=None)
def tiny_raven_engine(max_queue: int = 2):
  """A started greedy LoopSpec (2, 8) engine on tiny-raven with 2 slots, one per queue size; every one shares
  the same compiled decode loop (the queue size is host-side only). Stopped at exit (daemon thread)."""
  from loopspec_jax.serving import Engine, EngineConfig

  model = loopspec_jax.load("tiny-raven")
  engine = Engine(model, EngineConfig(**dict(TINY_RAVEN_ENGINE, max_queue=max_queue)))
  engine.start()
  return model, engine


@contextlib.contextmanager
def tiny_raven_server(max_queue: int = 2, **app_kw):
  """(model, engine, base URL, openai client) of `tiny_raven_engine(max_queue)` behind a fresh app."""
  import openai

  from loopspec_jax.serving import server

  model, engine = tiny_raven_engine(max_queue)
  with http_server(server.create_app(engine, "tiny-raven", **app_kw)) as base:
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    yield model, engine, base, client


def expected_stop(model, ref: list, stops: list, eos_id=None) -> tuple:
  """(text, token ids) of a request with `stops` whose stop-free continuation is `ref` (brute force: the
  first token whose prefix text holds a stop string ends it; its text is cut where that string starts)."""
  eos = model.config.eos_id if eos_id is None else eos_id
  decode = lambda ids: model.decode([t for t in ids if t != eos])
  for k in range(1, len(ref) + 1):
    text = decode(ref[:k])
    hits = [text.find(s) for s in stops if s in text]
    if hits:
      return text[: min(hits)], list(ref[:k])
  return decode(ref), list(ref)


# A /health answer slower than this is a stall: tokenizing or generating on the event loop held it 2-3 s.
# Under it is a loaded host's scheduling (0.11 s was seen with five processes on 2 cores), not a stall.
HEALTH_STALL_S = 0.5


def health_during(base: str, fn) -> tuple:
  """(fn(), latencies): /health is requested every 10 ms (each must answer 200) while fn runs on a thread."""
  import threading
  import time

  import requests

  done, out = threading.Event(), {}

  def run():
    try:
      out["r"] = fn()
    finally:
      done.set()

  session = requests.Session()
  session.get(base + "/health")
  thread = threading.Thread(target=run)
  thread.start()
  latencies = []
  while not done.is_set():
    t0 = time.perf_counter()
    assert session.get(base + "/health").status_code == 200
    latencies.append(time.perf_counter() - t0)
    time.sleep(0.01)
  thread.join()
  return out["r"], latencies
