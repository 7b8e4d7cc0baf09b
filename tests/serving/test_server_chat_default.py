"""Chat works out of the box (issue 42 item 7): every bundled model ships a chat template, and the default
server config (`loopspec-serve` with no flags: tiny-raven) answers /v1/chat/completions with 200."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import requests

import loopspec_jax as lj
import server_helpers as helpers
from loopspec_experiments import common
from loopspec_experiments import serve
from loopspec_jax.serving import chat

BUNDLED = ("tiny-raven", "tiny-ouro", "tiny-raven-draft", "tiny-raven-mtp")


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_model_ships_a_chat_template(name):
  model = lj.load(name)
  template = chat.load(model)
  assert template is not None, name
  text = template.render([{"role": "system", "content": "A play."}, {"role": "user", "content": "Speak."}])
  assert text.endswith("USER:\nSpeak.\n\nASSISTANT:\n") and model.encode(text)


def test_default_config_answers_chat_with_200():
  """The default config's app (experiments/serve.py build_app: the template found in the checkpoint) over the
  suite's tiny-raven engine: the openai client's chat completion is a 200, streamed and not."""
  common.parse_flags(serve.FLAGS, ["loopspec-serve"])
  c = serve._CONFIG.value
  assert c.model == "tiny-raven" and c.chat_template == ""
  model, engine = helpers.tiny_raven_engine(2)
  with helpers.http_server(serve.build_app(c, model, engine)) as base:
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Speak, ROMEO."}]
    r = client.chat.completions.create(model="tiny-raven", messages=messages, max_tokens=8, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens == 8
    parts = client.chat.completions.create(
        model="tiny-raven", messages=messages, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(p.choices[0].delta.content or "" for p in parts) == r.choices[0].message.content


@pytest.mark.slow  # starts `loopspec-serve` as its own process (compiles the default engine: minutes on 2 cores)
def test_default_command_answers_chat_with_200():
  port = helpers.free_port()
  cmd = [sys.executable, "-m", "loopspec_experiments.serve", f"--config.port={port}", "--config.access_log=false"]
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  base = f"http://127.0.0.1:{port}"
  try:
    deadline = time.time() + 900
    while time.time() < deadline:
      try:
        if requests.get(base + "/ready", timeout=2).status_code == 200:
          break
      except requests.ConnectionError:
        pass
      time.sleep(1)
    body = {"model": "tiny-raven", "messages": [{"role": "user", "content": "Speak."}], "max_tokens": 8}
    r = requests.post(base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
  finally:
    proc.terminate()
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM after its graceful shutdown
