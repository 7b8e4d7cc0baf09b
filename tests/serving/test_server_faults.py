"""Fault injection against loopspec-serve (127.0.0.1): each case bounded in time (request timeouts, joins).

engine exception      the engine's loop raises with requests running, waiting and streaming: each gets an
                      answer within seconds (500 / an error event, code engine_failed), /health and /ready
                      answer 503 naming the cause, /metrics' loopspec_engine_up is 0, later requests get 503,
                      the cause is logged, and the server loop exits 1 (experiments/serve.py)
slow client           a client stalled halfway through its body neither blocks other requests nor shutdown:
                      SIGTERM's graceful shutdown ends within `shutdown_timeout` (it never ended)
client vanishing      a client that closes its connection halfway through its body is not a server error
tokenizer child       the tokenizer's child process killed: the next long text is tokenized by a fresh one
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import ml_collections
import openai
import requests

import server_helpers as helpers
from loopspec_experiments import serve
from loopspec_jax.serving import Engine, EngineConfig
from loopspec_jax.serving import server as server_lib

MODEL = "tiny-raven"
LONG = {"model": MODEL, "prompt": "ROMEO:\n", "max_tokens": 200, "temperature": 0}


class _Served:
  """An app on `serve.serve_until_exit` (loopspec-serve's own loop) on a thread; `status` its exit status."""

  def __init__(self, engine, shutdown_timeout: float = 1.0):
    import uvicorn

    c = ml_collections.ConfigDict(
        dict(host="127.0.0.1", port=helpers.free_port(), access_log=False, shutdown_timeout=shutdown_timeout)
    )
    self.engine, self.app = engine, server_lib.create_app(engine, MODEL)
    self.server = uvicorn.Server(serve.uvicorn_config(self.app, c))
    self.base, self.port, self.status = f"http://127.0.0.1:{c.port}", c.port, None
    self.thread = threading.Thread(target=self._run, daemon=True)
    self.thread.start()
    deadline = time.time() + 30
    while not self.server.started and time.time() < deadline:
      time.sleep(0.02)
    assert self.server.started

  def _run(self):
    self.status = serve.serve_until_exit(self.server, self.engine, grace_s=0.3)

  def close(self, timeout: float = 10.0) -> float:
    """Asks for shutdown (what SIGTERM does); returns the seconds it took to end."""
    t0 = time.perf_counter()
    self.server.should_exit = True
    self.thread.join(timeout)
    return time.perf_counter() - t0


def _half_body(port: int, sent: bytes = b'{"model": "tiny-raven", ') -> socket.socket:
  sock = socket.create_connection(("127.0.0.1", port))
  head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
  sock.sendall(head.encode() + sent)
  return sock


def _wait(cond, timeout: float) -> None:
  deadline = time.time() + timeout
  while not cond() and time.time() < deadline:
    time.sleep(0.01)
  assert cond()


def test_engine_exception_answers_every_request_and_exits_nonzero(caplog):
  model, _ = helpers.tiny_raven_engine(2)
  eng = Engine(model, EngineConfig(**dict(helpers.TINY_RAVEN_ENGINE, max_queue=4)))  # the shared compiled loop
  loop_sp, fault = eng._loop_sp, threading.Event()

  def faulty():
    if fault.is_set():
      raise RuntimeError("injected device fault")
    return loop_sp()

  eng._loop_sp = faulty
  eng.start()
  srv = _Served(eng)
  client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0, timeout=20)
  out = {}

  def plain(i):
    out[i] = requests.post(srv.base + "/v1/completions", json=LONG, timeout=20)

  def streamed():
    try:
      for _ in client.completions.create(**LONG, stream=True):
        pass
      out["stream"] = "ended without an error"
    except openai.APIError as e:
      out["stream"] = e

  threads = [threading.Thread(target=plain, args=(i,)) for i in range(3)] + [threading.Thread(target=streamed)]
  with caplog.at_level(logging.ERROR, logger="loopspec_jax.serving"):
    for t in threads:
      t.start()
    _wait(lambda: eng.running == 2 and eng.waiting == 2 and eng.metrics.tokens > 0, timeout=60)
    t0 = time.perf_counter()
    fault.set()
    for t in threads:
      t.join(timeout=10)
    answered = time.perf_counter() - t0
  assert not any(t.is_alive() for t in threads) and answered < 10, answered
  for i in range(3):
    assert out[i].status_code == 500 and out[i].json()["error"]["code"] == "engine_failed", out[i].text
    assert "injected device fault" in out[i].json()["error"]["message"]
  assert isinstance(out["stream"], openai.APIError) and "injected device fault" in str(out["stream"])
  health = requests.get(srv.base + "/health", timeout=5)
  assert health.status_code == 503 and health.json()["status"] == "failed" and not health.json()["ready"]
  assert "injected device fault" in health.json()["error"]
  assert requests.get(srv.base + "/ready", timeout=5).status_code == 503
  assert "loopspec_engine_up 0\n" in requests.get(srv.base + "/metrics", timeout=5).text
  later = requests.post(srv.base + "/v1/completions", json=LONG, timeout=5)
  assert later.status_code == 503 and later.json()["error"]["code"] == "engine_failed"
  assert any("injected device fault" in r.getMessage() for r in caplog.records)
  srv.thread.join(timeout=10)  # the supervisor shuts the server down by itself
  assert not srv.thread.is_alive() and srv.status == 1


def test_slow_client_blocks_neither_others_nor_shutdown(caplog):
  """A client stalled halfway through its body: other requests are served meanwhile, and shutdown (SIGTERM's
  path: should_exit) ends within shutdown_timeout (1 s here) instead of waiting for it for ever."""
  _, engine = helpers.tiny_raven_engine(2)
  srv = _Served(engine, shutdown_timeout=1.0)
  sock = _half_body(srv.port)
  try:
    r = requests.post(srv.base + "/v1/completions", json=dict(LONG, max_tokens=4), timeout=30)
    assert r.status_code == 200
    with caplog.at_level(logging.INFO, logger="loopspec_jax.serving"):
      took = srv.close(timeout=10)
    assert not srv.thread.is_alive() and took < 5, took
    assert srv.status == 0
    assert not any("internal error" in r.getMessage() for r in caplog.records)
  finally:
    sock.close()
    srv.close()


def test_client_vanishing_mid_body_is_not_an_error(caplog):
  _, engine = helpers.tiny_raven_engine(2)
  with helpers.http_server(server_lib.create_app(engine, MODEL)) as base:
    port = int(base.rsplit(":", 1)[1])
    with caplog.at_level(logging.INFO):
      for _ in range(3):
        sock = _half_body(port)
        time.sleep(0.1)
        sock.close()
      time.sleep(0.3)
      r = requests.post(base + "/v1/completions", json=dict(LONG, max_tokens=2), timeout=30)
    assert r.status_code == 200
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad]


def test_tokenizer_child_killed_is_replaced():
  """A text long enough for the tokenizer's child process; the child is killed (kill -9) between requests:
  the next one is tokenized by a fresh child, with the same ids, within seconds."""
  import os
  import signal

  model, engine = helpers.tiny_raven_engine(2)
  text = "O Romeo, Romeo, wherefore art thou Romeo? " * 500
  app = server_lib.create_app(engine, MODEL)
  with helpers.http_server(app) as base:
    first = requests.post(base + "/tokenize", json={"model": MODEL, "prompt": text}, timeout=30)
    assert first.status_code == 200 and first.json()["tokens"] == model.encode(text)
    pids = app.state.encoder.pids
    assert pids
    for pid in pids:
      os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    t0 = time.perf_counter()
    again = requests.post(base + "/tokenize", json={"model": MODEL, "prompt": text}, timeout=30)
    assert again.status_code == 200 and again.json()["tokens"] == first.json()["tokens"]
    assert time.perf_counter() - t0 < 10
    assert app.state.encoder.pids and set(app.state.encoder.pids).isdisjoint(pids)
