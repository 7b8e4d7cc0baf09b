"""A bounded load test over HTTP (127.0.0.1): concurrent mixed requests, including cancels and stop strings.

Fifteen requests at once into a 2-slot server (the rest queued): non-streamed and streamed, with and without
stop strings, two streams dropped after their first chunk and a non-streamed one abandoned by a 0.5 s client
timeout. Every completed request equals its solo output (text, token ids, usage), none is lost, the cancelled
ones are counted as cancelled and the engine's counters add up. A few seconds of decoding on tiny-raven.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time

import openai
import requests

import server_helpers as helpers
from loopspec_jax.serving import Request

MODEL = "tiny-raven"
PROMPTS = ("ROMEO:\n", "JULIET:\n", "def fib(n):\n", "First Citizen:\n")
N = 24


@functools.lru_cache(maxsize=None)
def _solo(prompt: str) -> tuple:
  model, engine = helpers.tiny_raven_engine(16)
  return tuple(engine.generate(Request(prompt=model.encode(prompt), max_tokens=N)).tokens)


def _jobs(model) -> list:
  jobs = []
  for i in range(12):
    p = PROMPTS[i % 4]
    full = model.decode([t for t in _solo(p) if t != model.config.eos_id])
    stop = [full[4 + 2 * i : 7 + 2 * i]] if i % 3 == 2 and len(full) > 7 + 2 * i else None
    jobs.append({"kind": "stream" if i % 2 else "plain", "prompt": p, "stop": stop})
  jobs += [{"kind": "drop", "prompt": PROMPTS[0]}, {"kind": "drop", "prompt": PROMPTS[1]}]
  jobs.append({"kind": "abandon", "prompt": PROMPTS[2]})
  return jobs


def _run(base, client, job) -> dict:
  kw = dict(model=MODEL, prompt=job["prompt"], temperature=0)
  if job["kind"] == "plain":
    r = client.completions.create(max_tokens=N, stop=job["stop"], **kw)
    c = r.choices[0]
    return {"text": c.text, "ids": c.model_extra["token_ids"], "usage": r.usage.completion_tokens}
  if job["kind"] == "stream":
    chunks = list(client.completions.create(max_tokens=N, stop=job["stop"], stream=True, **kw))
    ids = [t for c in chunks for t in c.choices[0].model_extra["token_ids"]]
    return {"text": "".join(c.choices[0].text for c in chunks), "ids": ids, "usage": len(ids)}
  if job["kind"] == "drop":
    with requests.post(base + "/v1/completions", json=dict(kw, max_tokens=200, stream=True), stream=True) as r:
      assert next(r.iter_lines()).startswith(b"data: ")
    return {"cancelled": True}
  try:
    client.with_options(timeout=0.5).completions.create(max_tokens=200, **kw)
  except openai.APITimeoutError:
    return {"cancelled": True}
  raise AssertionError("the abandoned request finished within 0.5 s")


def test_mixed_concurrent_load():
  with helpers.tiny_raven_server(16) as (model, engine, base, client):
    jobs = _jobs(model)
    before = dict(engine.metrics.finished), engine.metrics.admitted
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
      results = list(pool.map(lambda j: _run(base, client, j), jobs))
    _wait_idle(engine)
  finished = {k: engine.metrics.finished[k] - before[0].get(k, 0) for k in engine.metrics.finished}
  assert len(results) == len(jobs)  # none lost
  for job, res in zip(jobs, results):
    if job["kind"] in ("drop", "abandon"):
      assert res == {"cancelled": True}
      continue
    text, ids = helpers.expected_stop(model, list(_solo(job["prompt"])), job["stop"] or [])
    assert (res["text"], res["ids"], res["usage"]) == (text, ids, len(ids)), job
  assert finished.get("cancelled", 0) == 3
  assert sum(finished.values()) == len(jobs)
  assert engine.metrics.admitted - before[1] <= len(jobs) and engine.running == 0 and engine.waiting == 0


def _wait_idle(engine, timeout: float = 30.0) -> None:
  deadline = time.time() + timeout
  while not engine.idle() and time.time() < deadline:
    time.sleep(0.01)
  assert engine.idle()
