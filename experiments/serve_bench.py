"""loopspec-serve-bench: open-loop Poisson load against the serving engine, in process and over HTTP.

  loopspec-serve-bench --model=tiny-raven --methods='ar;loopspec:2,8' --rates=1,4,16 --num_requests=12

For each method (one engine each, compiled and warmed on every prompt first) and each arrival rate (requests/s;
0 = one request at a time, closed loop), requests arrive at Poisson times (seeded) with the demo prompts in
turn; the table reports throughput (generated tokens / span from the first arrival to the last completion),
time to first token (TTFT) and inter-token latency (ITL: the gap between a request's consecutive chunks, split
evenly over the chunk's tokens) p50 / p99 in ms, in process (`engine`) and through the HTTP server (`http`,
streamed completions over a local socket). Rate 0 also reports `generate`'s decode ms per token for the same
requests, and the engine's per-token overhead against it.

  loopspec-serve-bench --soak_minutes=10 --soak_out=results/serve_soak/<run>

runs the soak instead (loopspec_jax/serving/soak.py): `loopspec-serve` as its own process on 127.0.0.1 (with
`--soak_server_args`), N minutes of mixed load with faults (disconnects, malformed and oversized bodies, slow
and vanishing clients, the tokenizer process killed), /health probed throughout, then SIGTERM with a stalled
client; it prints (and writes to `soak_out`/summary.json) the outcome of every request by kind and status.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import List

import numpy as np
from absl import flags

import loopspec_jax as lj
from loopspec_jax import methods
from loopspec_jax.experiment.prompts import demo_prompt_ids
from loopspec_experiments import common
from loopspec_experiments.serve import build_engine
from loopspec_jax.serving import Request

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "model", "tiny-raven", "Bundled model, checkpoint directory or random:<family>:<variant>.", flag_values=FLAGS
)
flags.DEFINE_string(
    "methods",
    "ar;loopspec:2,8",
    "';'-separated method specs of the registry (loopspec_jax.methods).",
    flag_values=FLAGS,
)
flags.DEFINE_string("rates", "0,2,8,32", "Arrival rates in requests/s (0: one request at a time).", flag_values=FLAGS)
flags.DEFINE_integer("num_requests", 12, "Requests per rate.", flag_values=FLAGS)
flags.DEFINE_integer("max_tokens", 48, "Tokens per request.", flag_values=FLAGS)
flags.DEFINE_integer("slots", 4, "Engine slots.", flag_values=FLAGS)
flags.DEFINE_integer("max_len", None, "Context per slot (default: the model's).", flag_values=FLAGS)
flags.DEFINE_integer("ticks_per_call", 16, "Loop iterations per device call.", flag_values=FLAGS)
flags.DEFINE_boolean(
    "greedy", True, "Greedy requests on greedy-only engines (else T=1, top-p 0.7 requests).", flag_values=FLAGS
)
flags.DEFINE_boolean("http", True, "Also measure through the HTTP server.", flag_values=FLAGS)
flags.DEFINE_integer("seed", 0, "Arrival-time seed.", flag_values=FLAGS)
flags.DEFINE_string("out", None, "Write the rows as JSON here.", flag_values=FLAGS)
flags.DEFINE_float(
    "soak_minutes", 0.0, "> 0: run the soak (mixed load with faults) this long instead.", flag_values=FLAGS
)
flags.DEFINE_string("soak_server_args", "", "Soak: extra loopspec-serve flags (space-separated).", flag_values=FLAGS)
flags.DEFINE_string("soak_out", None, "Soak: write summary.json into this directory.", flag_values=FLAGS)


def parse_methods(text: str) -> list:
  """'ar;loopspec:2,8;chain:2,6' -> [(label, EngineConfig kwargs)]: any spec of the registry
  (`loopspec_jax.methods`), the Method object itself as `method`."""
  return [(m.spec, {"method": m}) for m in methods.parse_list(text)]


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


def soak_main(f) -> int:
  """The soak (loopspec_jax/serving/soak.py): prints its report; exit 1 when anything failed."""
  import os

  from loopspec_jax.serving import soak

  run = soak.Soak(f.soak_minutes, f.soak_server_args.split(), model=f.model, seed=f.seed)
  print(f"soak: loopspec-serve on {run.base} for {f.soak_minutes:g} minutes ...", flush=True)
  summary = soak.run_and_report(run)
  if f.soak_out:
    os.makedirs(f.soak_out, exist_ok=True)
    common.atomic_write_json(os.path.join(f.soak_out, "summary.json"), summary)
  return 0 if summary["ok"] else 1


def main(argv):
  del argv

  f = FLAGS
  if f.soak_minutes > 0:
    return soak_main(f)
  rates = [float(x) for x in common.split_list(f.rates)]
  rows = []
  for label, kw in parse_methods(f.methods):
    model, engine = build_engine(
        f.model,
        slots=f.slots,
        max_len=f.max_len,
        ticks_per_call=f.ticks_per_call,
        greedy_only=f.greedy,
        max_queue=max(64, f.num_requests),
        **kw,
    )
    prompts = demo_prompt_ids(model)
    sampling = dict(temperature=0.0) if f.greedy else dict(temperature=1.0, top_p=0.7)
    reqs = [
        Request(prompt=prompts[i % len(prompts)], max_tokens=f.max_tokens, seed=i, **sampling)
        for i in range(f.num_requests)
    ]
    print(f"[{label}] compiling ...", flush=True)
    for p in prompts:  # every prefill bucket and the decode loop
      engine.generate(Request(prompt=p, max_tokens=2, **sampling))
    engine.start()
    base = None
    if f.http:
      base, stop_server = _serve(engine, "bench")
    for rate in rates:
      offsets = arrivals(rate, f.num_requests, f.seed)
      row = dict(method=label, rate=rate, path="engine", **run_engine(engine, reqs, offsets, rate == 0))
      if rate == 0:
        gen, eng = one_at_a_time_overhead(engine, model, reqs[: len(prompts)], kw, f.greedy)
        row.update(generate_ms_per_token=gen, engine_ms_per_token=eng)
      rows.append(row)
      print(table([row]).splitlines()[-1], flush=True)
      if base:
        row = dict(method=label, rate=rate, path="http", **run_http(base, "bench", reqs, offsets, rate == 0))
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    if base:
      stop_server()
    engine.stop()
  print(
      f"\n{f.model}, {f.num_requests} requests x {f.max_tokens} tokens per rate, {f.slots} slots, "
      f"context {f.max_len or 'of the model'}, {f.ticks_per_call} iterations per device call, "
      f"{'greedy' if f.greedy else 'T=1 top-p 0.7'}\n"
  )
  print(table(rows))
  if f.out:
    common.atomic_write_json(f.out, rows)
  return 0


def _serve(engine, name: str):
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


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
