"""logprobs and echo over HTTP, and lm-eval's `local-completions` scoring a loglikelihood task through them.

The server's log-probabilities are the full-depth model's (serving/scoring.py); they must equal the in-process
lm-eval backend's (`integrations/lm_eval.py LoopSpecLM.logprobs` / `score`, run here on a stand-in object
holding the attributes they read, so the test does not depend on the backend's constructor), and lm-eval's
`local-completions` over HTTP (its 'remote' tokenizer: the server's /tokenize routes) must give the same
loglikelihoods and is-greedy flags as that backend's `score` on the same token ids.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import requests

import server_helpers as helpers

MODEL = "tiny-raven"


@pytest.fixture(scope="module")
def served():
  with helpers.tiny_raven_server(16) as out:
    yield out


def _in_process(model):
  """The in-process backend's scoring methods, bound to a stand-in with the attributes they read."""
  from loopspec_jax.integrations import lm_eval as backend

  ns = types.SimpleNamespace(cfg=model.config, _eos=model.config.eos_id, model=model, depth=model.config.recurrence)
  ns.logprobs = lambda ids: backend.LoopSpecLM.logprobs(ns, ids)
  ns.score = lambda ctx, cont: backend.LoopSpecLM.score(ns, ctx, cont)
  return ns


def test_logprobs_and_echo_equal_the_in_process_backend(served):
  model, _, base, client = served
  prompt = model.encode("ROMEO:\n")
  r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, logprobs=3, echo=True)
  c = r.choices[0]
  gen = c.model_extra["token_ids"][len(prompt) :]
  seq = prompt + gen
  assert c.text == model.decode(prompt) + model.decode(gen) and len(gen) == 5 and r.usage.completion_tokens == 5
  lp = c.logprobs
  assert len(lp.tokens) == len(seq) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
  ref = _in_process(model).logprobs(seq[:-1])
  want = [float(ref[i - 1, seq[i]]) for i in range(1, len(seq))]
  np.testing.assert_allclose(lp.token_logprobs[1:], want, rtol=0, atol=1e-6)
  for i in range(len(prompt), len(seq)):  # greedy: every generated token is the most likely one
    assert lp.token_logprobs[i] == pytest.approx(max(lp.top_logprobs[i].values()), abs=1e-9)
    assert len(lp.top_logprobs[i]) >= 3
  assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]))
  plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, logprobs=0)
  assert plain.choices[0].logprobs.token_logprobs == lp.token_logprobs[len(prompt) :]
  only = requests.post(
      base + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
  ).json()["choices"][0]
  assert only["text"] == model.decode(prompt) and only["logprobs"]["token_logprobs"] == lp.token_logprobs[: len(prompt)]
  bad = requests.post(base + "/v1/completions", json={"model": MODEL, "prompt": "a", "logprobs": 1, "stream": True})
  assert bad.status_code == 400 and bad.json()["error"]["param"] == "logprobs"


def test_lm_eval_local_completions_loglikelihood_equals_the_backend(served):
  """lm-eval's own `local-completions` model (remote tokenizer from /tokenizer_info and /tokenize) scores
  (context, continuation) pairs over HTTP; each equals the in-process backend's `score` of the same ids."""
  pytest.importorskip("lm_eval")
  pytest.importorskip("tenacity")  # lm-eval's API models need it (the `dev` extra)
  from lm_eval.api.instance import Instance
  from lm_eval.models.openai_completions import LocalCompletionsAPI

  model, _, base, _ = served
  lm = LocalCompletionsAPI(base_url=base + "/v1/completions", model=MODEL, tokenizer_backend="remote", max_retries=1)
  pairs = [("ROMEO:\n", "I'll be a man"), ("def fib(n):\n", "  return n"), ("JULIET:\n", " O Romeo, Romeo")]
  reqs = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
  got = lm.loglikelihood(reqs, disable_tqdm=True)
  ref = _in_process(model)
  for (ctx, cont), (ll, greedy) in zip(pairs, got):
    ctx_ids, cont_ids = lm._encode_pair(ctx, cont)
    assert model.decode(ctx_ids + cont_ids) == ctx + cont  # the remote tokenizer is the model's
    want_ll, want_greedy = ref.score(ctx_ids, cont_ids)
    assert ll == pytest.approx(want_ll, abs=1e-5) and greedy == want_greedy, (ctx, cont)
  assert any(ll < -1 for ll, _ in got)  # real scores, not zeros
