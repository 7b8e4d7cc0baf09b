"""loopspec_jax/experiment/load.py (loopspec-serve-bench's load generator): Poisson arrivals, the latency
summary of chunk records, the in-process and HTTP drivers against fakes, and the table. No model, no server."""

import json
import threading
import time
import types

import numpy as np
import pytest

from loopspec_jax.experiment import load


def test_arrivals_are_seeded_poisson_offsets_and_zero_for_the_closed_loop():
  np.testing.assert_array_equal(load.arrivals(0, 3, seed=0), np.zeros(3))
  a = load.arrivals(4.0, 2000, seed=1)
  np.testing.assert_array_equal(a, load.arrivals(4.0, 2000, seed=1))
  assert np.all(np.diff(a) > 0) and a[-1] / len(a) == pytest.approx(0.25, rel=0.1)


def test_summarize_splits_a_chunk_gap_over_its_tokens():
  records = [
      {"submit": 10.0, "chunks": [(10.5, 1), (11.0, 0), (11.5, 4)]},  # an empty chunk is no chunk
      {"submit": 10.2, "chunks": [(10.4, 2)]},
      {"submit": 10.3, "chunks": []},  # nothing came back: no TTFT, counted as a request
  ]
  s = load.summarize(records, t0=10.0)
  assert s["requests"] == 3 and s["tokens"] == 7
  assert s["tok_per_s"] == pytest.approx(7 / 1.5) and s["ms_per_token"] == pytest.approx(1500 / 7)
  assert s["ttft_p50_ms"] == pytest.approx(350.0)  # TTFTs 0.5 s and 0.2 s
  assert s["itl_p50_ms"] == pytest.approx(250.0) and s["itl_p99_ms"] == pytest.approx(250.0)
  empty = load.summarize([], t0=0.0)
  assert empty["tokens"] == 0 and np.isnan(empty["ttft_p50_ms"])


class _Seq:

  def __init__(self, req):
    self.t_submit = time.perf_counter()
    self.chunk_times = [(self.t_submit + 0.001, 1), (self.t_submit + 0.002, req.max_tokens - 1)]
    self.tokens = [0] * req.max_tokens
    self.done_event = threading.Event()
    self.done_event.set()


class _Engine:
  eos_id = None

  def __init__(self):
    self.submitted = []

  def submit(self, req):
    self.submitted.append(req)
    return _Seq(req)


def _reqs(n):
  return [types.SimpleNamespace(prompt=[1, 2], max_tokens=3, temperature=0.0, top_p=1.0, seed=i) for i in range(n)]


@pytest.mark.parametrize("closed_loop", [True, False])
def test_run_engine_submits_every_request(closed_loop):
  engine, reqs = _Engine(), _reqs(3)
  s = load.run_engine(engine, reqs, np.array([0.0, 0.001, 0.002]), closed_loop)
  assert engine.submitted == reqs and s["requests"] == 3 and s["tokens"] == 9


def test_run_http_reads_streamed_token_ids(monkeypatch):
  sent = []

  class _Response:

    def __init__(self, body):
      sent.append(body)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      return False

    def raise_for_status(self):
      pass

    def iter_lines(self):
      chunk = {"choices": [{"token_ids": [5, 6]}]}
      return [b"", b"data: " + json.dumps(chunk).encode(), b": keep-alive", b"data: [DONE]"]

  monkeypatch.setattr("requests.post", lambda url, json, stream: _Response(json))
  s = load.run_http("http://x", "bench", _reqs(2), np.array([0.0, 0.001]), closed_loop=False)
  assert s["requests"] == 2 and s["tokens"] == 4
  assert sorted(b["seed"] for b in sent) == [0, 1] and all(b["stream"] and b["model"] == "bench" for b in sent)


def test_table_rows():
  row = dict(method="ar", path="engine", rate=0.0, tok_per_s=10.0, ttft_p50_ms=5, ttft_p99_ms=9)
  row.update(itl_p50_ms=1.0, itl_p99_ms=2.0, ms_per_token=3.0, generate_ms_per_token=2.0, engine_ms_per_token=3.0)
  lines = load.table([row, dict(row, path="http", rate=4.0, generate_ms_per_token=None)]).splitlines()
  assert len(lines) == 4 and lines[0].startswith("| method | path | rate")
  assert "| 1 at a time |" in lines[2] and lines[2].endswith("| 3.00 / 2.00 (+50%) |")
  assert "| 4 |" in lines[3] and lines[3].endswith("| - |")
