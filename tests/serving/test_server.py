"""loopspec-serve's HTTP API against the official openai client, on a server started here on 127.0.0.1.

One uvicorn server (a greedy LoopSpec (2, 8) engine on tiny-raven, 2 slots, a queue of 2) serves every test:
non-streamed and streamed completions equal `generate`'s greedy text and concatenate to each other; stop
strings truncate; a client that disconnects mid-stream frees its slot while the others go on; a full queue
answers 429; every bad input gets a 4xx with an OpenAI-style error naming the field.
"""

from __future__ import annotations

import json
import time

import openai
import pytest
import requests

import server_helpers as helpers
import loopspec_jax as lj

MODEL = "tiny-raven"
PROMPT = "ROMEO:\n"  # its greedy continuation has no eos for 220 tokens


@pytest.fixture(scope="module")
def served():
  with helpers.tiny_raven_server() as out:
    yield out


def _reference_text(model, prompt: str, n: int) -> str:
  out = lj.generate(
      model, [model.encode(prompt)], max_new_tokens=n, method="loopspec", d1=2, d2=8, eos_id=model.config.eos_id
  ).tokens[0]
  return model.decode([t for t in out if t != model.config.eos_id])


def test_completions_streamed_and_not_equal_generate(served):
  model, engine, base, client = served
  assert [m.id for m in client.models.list().data] == [MODEL]
  r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
  assert r.choices[0].text == _reference_text(model, PROMPT, 24)
  assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 24
  assert r.usage.prompt_tokens == len(model.encode(PROMPT))
  chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True))
  assert len(chunks) >= 2 and chunks[-1].choices[0].finish_reason == "length"
  assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
  ids = client.completions.create(model=MODEL, prompt=model.encode(PROMPT), max_tokens=24, temperature=0)
  assert ids.choices[0].text == r.choices[0].text  # the prompt as token ids


def test_stop_string_truncates(served):
  model, _, _, client = served
  full = _reference_text(model, PROMPT, 24)
  stop = full[10:13]
  r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
  assert r.choices[0].text == full[: full.index(stop)] and r.choices[0].finish_reason == "stop"
  parts = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True)
  assert "".join(c.choices[0].text for c in parts) == r.choices[0].text


def _metric(base: str, name: str) -> float:
  for line in requests.get(base + "/metrics").text.splitlines():
    if line.startswith(name + " ") or line.startswith(name + "{"):
      return float(line.split()[-1])
  raise KeyError(name)


def test_disconnect_frees_the_slot_and_full_queue_is_429(served):
  model, engine, base, client = served
  body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 220, "temperature": 0, "stream": True}
  cancelled0 = engine.metrics.finished["cancelled"]
  deadline = time.time() + 300
  streams = []
  for i in range(4):  # 2 run, 2 wait (each submission lands before the next one is sent)
    streams.append(requests.post(base + "/v1/completions", json=body, stream=True))
    assert streams[-1].status_code == 200
    while (engine.running, engine.waiting) != (min(i + 1, 2), max(i - 1, 0)) and time.time() < deadline:
      time.sleep(0.01)
  first = next(streams[0].iter_lines())  # the first stream is running
  assert first.startswith(b"data: ")
  with pytest.raises(openai.RateLimitError) as info:
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
  assert info.value.status_code == 429 and "queue is full" in info.value.message
  assert info.value.response.headers["retry-after"] == "1"
  assert _metric(base, "loopspec_requests_waiting") == 2 and _metric(base, "loopspec_requests_running") == 2
  for s in streams:
    s.close()  # disconnect mid-stream
  while engine.metrics.finished["cancelled"] < cancelled0 + 4 and time.time() < deadline:
    time.sleep(0.05)
  assert engine.metrics.finished["cancelled"] == cancelled0 + 4
  assert engine.running == 0 and engine.waiting == 0
  r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)  # still serving
  assert r.choices[0].text == _reference_text(model, PROMPT, 8)
  text = requests.get(base + "/metrics").text
  for name in (
      "requests_running",
      "requests_waiting",
      "tokens_per_second",
      "mean_accepted_length",
      "gate_open_rate",
      "lanes_live",
  ):
    assert f"# TYPE loopspec_{name} " in text
  assert _metric(base, "loopspec_mean_accepted_length") > 1


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"model": "gpt-4", "prompt": "a"}, 404, "model"),
        ({"model": MODEL, "prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "a", "top_p": 0}, 400, "top_p"),
        ({"model": MODEL, "prompt": "a", "top_p": 1.01}, 400, "top_p"),
        ({"model": MODEL, "prompt": "a " * 300}, 400, "prompt"),
        ({"model": MODEL, "prompt": "a", "max_tokens": 400}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": [1, 2, 99999]}, 400, "prompt"),
        ({"model": MODEL, "prompt": ""}, 400, "prompt"),
        ({"model": MODEL, "prompt": "a", "temperature": 1.0}, 400, "temperature"),  # a greedy-only engine
        ({"model": MODEL, "prompt": "a", "n": 2}, 400, "n"),
        ({"model": MODEL, "prompt": "a", "stream": "yes"}, 400, "stream"),
        ({"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
        ({"model": MODEL, "prompt": "a", "frobnicate": 1}, 400, "frobnicate"),
    ],
)
def test_bad_input_gets_openai_errors(served, body, status, param):
  _, _, base, _ = served
  r = requests.post(base + "/v1/completions", json=body)
  assert r.status_code == status, r.text
  err = r.json()["error"]
  assert err["param"] == param and err["message"] and err["type"]


def test_malformed_json_and_client_errors(served):
  _, _, base, client = served
  r = requests.post(base + "/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"})
  assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
  with pytest.raises(openai.BadRequestError) as info:
    client.completions.create(model=MODEL, prompt="a", max_tokens=-3)
  assert info.value.body["param"] == "max_tokens"
  with pytest.raises(openai.NotFoundError):
    client.completions.create(model="nope", prompt="a")
  assert requests.get(base + "/health").json()["status"] == "ok"
  assert json.loads(requests.get(base + "/v1/models").text)["data"][0]["id"] == MODEL
