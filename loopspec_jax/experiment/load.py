"""The serving load generator behind `loopspec-serve-bench`: open-loop Poisson arrivals (or one request at a
time) against a started engine, in process or as streamed completions over HTTP, summarized as throughput,
time to first token (TTFT) and inter-token latency (ITL) percentiles; the engine's per-token overhead against
`generate` on the same requests; the markdown table of the rows; the HTTP app served on a local port.

A record is one request's {submit: perf_counter seconds, chunks: [(perf_counter seconds, n_tokens)]}.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import List

import numpy as np

import loopspec_jax as lj


def arrivals(rate: float, n: int, seed: int) -> np.ndarray:
  """Poisson arrival offsets in seconds (all 0 for rate 0: the closed loop submits after each completion)."""
  if rate <= 0:
    return np.zeros(n)
  return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=n))


def summarize(records: List[dict], t0: float) -> dict:
  """records: per request {submit, chunks: [(time, n_tokens)]} -> throughput, TTFT and ITL percentiles."""
  ttft, itl, tokens, end = [], [], 0, t0
  for r in records:
    chunks = [c for c in r["chunks"] if c[1] > 0]
    if not chunks:
      continue
    ttft.append(chunks[0][0] - r["submit"])
    for (ta, _), (tb, n) in zip(chunks, chunks[1:]):
      itl += [(tb - ta) / n] * n
    tokens += sum(n for _, n in chunks)
    end = max(end, chunks[-1][0])
  pct = lambda xs, q: float(np.percentile(xs, q) * 1e3) if xs else float("nan")
  return {
      "requests": len(records),
      "tokens": tokens,
      "tok_per_s": tokens / max(end - t0, 1e-9),
      "ttft_p50_ms": pct(ttft, 50),
      "ttft_p99_ms": pct(ttft, 99),
      "itl_p50_ms": pct(itl, 50),
      "itl_p99_ms": pct(itl, 99),
      "ms_per_token": (end - t0) * 1e3 / max(tokens, 1),
  }


def run_engine(engine, reqs: list, offsets: np.ndarray, closed_loop: bool) -> dict:
  """Submits at the offsets (or one after another) to a started engine and waits for every request."""
  t0 = time.perf_counter()
  seqs = []
  for req, off in zip(reqs, offsets):
    if closed_loop:
      seqs.append(engine.submit(req))
      seqs[-1].done_event.wait()
      continue
    time.sleep(max(0.0, t0 + off - time.perf_counter()))
    seqs.append(engine.submit(req))
  for s in seqs:
    s.done_event.wait()
  return summarize([{"submit": s.t_submit, "chunks": s.chunk_times} for s in seqs], t0)


def run_http(base: str, model_name: str, reqs: list, offsets: np.ndarray, closed_loop: bool) -> dict:
  """The same load as streamed completions over HTTP (one client thread per request)."""
  import requests as http

  records = [None] * len(reqs)

  def one(i, req):
    body = {
        "model": model_name,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "seed": req.seed,
        "stream": True,
    }
    rec = {"submit": time.perf_counter(), "chunks": []}
    with http.post(base + "/v1/completions", json=body, stream=True) as r:
      r.raise_for_status()
      for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
          continue
        n = len(json.loads(line[6:])["choices"][0]["token_ids"])
        rec["chunks"].append((time.perf_counter(), n))
    records[i] = rec

  t0 = time.perf_counter()
  threads = []
  for i, (req, off) in enumerate(zip(reqs, offsets)):
    if closed_loop:
      one(i, req)
      continue
    time.sleep(max(0.0, t0 + off - time.perf_counter()))
    threads.append(threading.Thread(target=one, args=(i, req)))
    threads[-1].start()
  for t in threads:
    t.join()
  return summarize(records, t0)


def one_at_a_time_overhead(engine, model, reqs: list, kw: dict, greedy: bool, repeats: int = 3) -> tuple:
  """Per-token latency of the engine against `generate`, one request at a time, interleaved request by
  request (so that both see the same machine load): (generate ms/token, engine ms/token), medians over
  repeats of the summed latency from submission (engine) or call (generate, prefill + decode) to the last
  token."""

  sampling = {} if greedy else dict(temperature=1.0, top_p=0.7)
  gen, eng = [], []
  for _ in range(repeats):
    g = e = toks = 0.0
    for req in reqs:
      st = lj.generate(
          model,
          [req.prompt],
          max_new_tokens=req.max_tokens,
          method=kw["method"],
          eos_id=engine.eos_id,
          **sampling,
      ).stats
      g += st["prefill_seconds"] + st["decode_seconds"]
      seq = engine.submit(req)
      seq.done_event.wait()
      e += seq.chunk_times[-1][0] - seq.t_submit
      toks += len(seq.tokens)
    gen.append(g * 1e3 / toks)
    eng.append(e * 1e3 / toks)
  return float(np.median(gen)), float(np.median(eng))


def table(rows: list) -> str:
  """The markdown table of bench rows ({method, path, rate, summarize's fields[, generate_ms_per_token,
  engine_ms_per_token]}); rate 0 reads '1 at a time'."""
  head = [
      "method",
      "path",
      "rate (req/s)",
      "tok/s",
      "TTFT p50 ms",
      "TTFT p99 ms",
      "ITL p50 ms",
      "ITL p99 ms",
      "ms/token",
      "engine / generate ms/token, interleaved",
  ]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    gen = r.get("generate_ms_per_token")
    vals = [
        r["method"],
        r["path"],
        "1 at a time" if r["rate"] == 0 else f"{r['rate']:g}",
        f"{r['tok_per_s']:.1f}",
        f"{r['ttft_p50_ms']:.0f}",
        f"{r['ttft_p99_ms']:.0f}",
        f"{r['itl_p50_ms']:.1f}",
        f"{r['itl_p99_ms']:.1f}",
        f"{r['ms_per_token']:.2f}",
        "-"
        if gen is None
        else f"{r['engine_ms_per_token']:.2f} / {gen:.2f} ({r['engine_ms_per_token'] / gen - 1:+.0%})",
    ]
    lines.append("| " + " | ".join(vals) + " |")
  return "\n".join(lines)


def serve_in_thread(engine, name: str):
  """Starts the HTTP app on a free local port in a thread; returns (base URL, stop function)."""

  import uvicorn

  from loopspec_jax.serving import server  # FastAPI: the optional 'serve' extra

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  srv = uvicorn.Server(
      uvicorn.Config(server.create_app(engine, name), host="127.0.0.1", port=port, log_level="warning")
  )
  thread = threading.Thread(target=srv.run, daemon=True)
  thread.start()
  while not srv.started:
    time.sleep(0.02)

  def stop():
    srv.should_exit = True
    thread.join()

  return f"http://127.0.0.1:{port}", stop
