"""Stop strings over HTTP (openai client, 127.0.0.1): never leaked by a stream, and ending the tokens too.

Reference: the greedy tokens of the request without stop strings, decoded alone; a request with stop strings must end at the FIRST token whose
prefix text contains one (text cut where it starts, token ids and usage ending at that token), whatever the
chunking or the batch. Streamed text (the concatenated deltas) must equal the non-streamed text, including
for stop strings that straddle chunks, where text that may still become a stop string is held back.
"""

from __future__ import annotations

import concurrent.futures
import functools

import pytest

import server_helpers as helpers
from loopspec_jax.serving import Request

MODEL = "tiny-raven"


@pytest.fixture(scope="module")
def served():
  with helpers.tiny_raven_server(max_queue=16) as out:
    yield out


@functools.lru_cache(maxsize=None)
def _solo(prompt: str, n: int) -> tuple:
  """The greedy continuation without stop strings (up to and including an eos), decoded alone by the engine
  (tests/serving/test_server.py checks that it equals `generate`'s)."""
  model, engine = helpers.tiny_raven_engine(16)
  return tuple(engine.generate(Request(prompt=model.encode(prompt), max_tokens=n)).tokens)


def _reference_tokens(model, prompt: str, n: int) -> list:
  return list(_solo(prompt, n))


expected = helpers.expected_stop


def _both(client, prompt, n, stop) -> tuple:
  """(non-streamed response, streamed text, streamed token ids, last chunk) of one request."""
  r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0, stop=stop)
  chunks = list(
      client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0, stop=stop, stream=True)
  )
  ids = [t for c in chunks for t in (c.choices[0].model_extra or {}).get("token_ids", [])]
  return r, "".join(c.choices[0].text for c in chunks), ids, chunks[-1]


@pytest.mark.parametrize(
    "prompt,n,stop,text",
    [
        ("ROMEO:\n", 20, ["And, and"], "I'll be a man of the blood,\n"),  # issue 25's leaking streams
        ("def fib(n):\n", 20, ["\n\n"], ""),
    ],
)
def test_issue_examples_streamed_equals_non_streamed(served, prompt, n, stop, text):
  model, _, _, client = served
  r, streamed, ids, last = _both(client, prompt, n, stop)
  want_text, want_ids = expected(model, _reference_tokens(model, prompt, n), stop)
  assert r.choices[0].text == want_text == text
  assert streamed == text and last.choices[0].finish_reason == "stop"
  assert r.choices[0].model_extra["token_ids"] == want_ids == ids
  assert r.usage.completion_tokens == len(want_ids) and r.choices[0].finish_reason == "stop"


def test_many_stop_strings_straddling_chunks(served):
  """Substrings of the reference text at many offsets and lengths (most straddle a token and a chunk),
  also five at once (HumanEval's `until` has five): streamed == non-streamed == the brute-force cut."""
  model, _, _, client = served
  prompt, n = "ROMEO:\n", 40
  ref = _reference_tokens(model, prompt, n)
  full = model.decode(ref)
  cases = [[full[i : i + w]] for i, w in zip(range(3, len(full) - 8, 11), (2, 3, 5, 8, 4, 6, 7))]
  cases.append(["zzq", "\n\n\n\n", "xyzzy", full[30:33], full[50:52]])
  cases.append(["qqq", full[-3:]])
  for stop in cases:
    r, streamed, ids, _ = _both(client, prompt, n, stop)
    want_text, want_ids = expected(model, ref, stop)
    assert r.choices[0].text == want_text == streamed, stop
    assert r.choices[0].model_extra["token_ids"] == want_ids == ids, stop
    assert r.usage.completion_tokens == len(want_ids), stop


def test_stop_tokens_do_not_depend_on_batching(served):
  """Eight stop-string requests at once (two slots, the rest queued; admitted at different device calls):
  each one's text, token ids and usage equal the brute-force reference (= its solo run)."""
  model, engine, _, client = served
  prompts = ["ROMEO:\n", "JULIET:\n", "def fib(n):\n", "First Citizen:\n"]
  refs = {p: _reference_tokens(model, p, 30) for p in prompts}
  jobs = []
  for i in range(8):
    p = prompts[i % 4]
    full = model.decode(refs[p])
    jobs.append((p, [full[5 + 3 * i : 8 + 3 * i] or "\n"]))

  def one(job):
    p, stop = job
    return client.completions.create(model=MODEL, prompt=p, max_tokens=30, temperature=0, stop=stop)

  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    results = list(pool.map(one, jobs))
  for (p, stop), r in zip(jobs, results):
    want_text, want_ids = expected(model, refs[p], stop)
    assert r.choices[0].text == want_text, (p, stop)
    assert r.choices[0].model_extra["token_ids"] == want_ids, (p, stop)
    assert r.usage.completion_tokens == len(want_ids)
