"""The serving engine (loopspec_jax.serving): continuous batching is exact, compiles once, refuses bad input.

Twelve requests of different prompt lengths, budgets and sampling settings arrive at staggered times into an
engine of 4 slots (so slots are reused while others run, and LoopSpec admits at every stage clock value);
each request's tokens must equal its solo `generate` output: greedy requests the greedy run (decoded inside
the engine's sampled kernels at temperature 0), sampled ones the run with the same key
(`generate(seed=<engine seed>, request_ids=[seed])`).
"""

from __future__ import annotations

import numpy as np
import pytest

import helpers
import loopspec_jax as lj
from loopspec_jax.analysis import theory
from loopspec_jax.decoding import autoregressive
from loopspec_jax.decoding import chain
from loopspec_jax.decoding import common
from loopspec_jax.decoding.loopspec import tick
from loopspec_jax.decoding.tree import lookahead
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.serving import engine as E

SPEC = "huginn:tiny"  # R = 8
TREE, LOOKAHEAD = "tree:d1=1,gamma=3,branch=2,tree_nodes=6", "lookahead:window=3,ngram=3,guesses=3"
METHODS = {"ar": {}, "chain": dict(d1=2, gamma=3), "loopspec": dict(d1=2, d2=4), TREE: {}, LOOKAHEAD: {}}
MAX_LEN = 32  # the context of solo generate's bucket too: the engine reuses its prefill programs


def requests() -> list:
  """12 requests: prompt lengths 1..12, budgets 3..14, greedy and sampled (temperature / top-p / top-k)."""
  rng = np.random.default_rng(0)
  out = []
  for i in range(12):
    prompt = rng.integers(1, 64, size=1 + (7 * i) % 12).tolist()
    kw = dict(max_tokens=3 + (5 * i) % 12)
    if i % 3 == 1:
      kw.update(temperature=1.0, top_p=0.9, seed=100 + i)
    elif i % 3 == 2:
      kw.update(temperature=0.7, top_k=5 if i % 2 else 0, seed=7)  # a shared seed: different request streams
    out.append(E.Request(prompt=prompt, **kw))
  return out


def solo(model, method: str, req: E.Request, eos_id) -> list:
  """The request decoded alone by `generate` with the key the engine gives it."""
  kw = dict(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p)
  if req.temperature > 0:
    kw.update(seed=0, request_ids=[req.seed])
  return lj.generate(
      model, [req.prompt], max_new_tokens=req.max_tokens, method=method, eos_id=eos_id, **METHODS[method], **kw
  ).tokens[0]


def run_staggered(engine: E.Engine, reqs: list) -> list:
  """Submits 4 requests, then one more after every engine step (staggered arrivals); runs until idle."""
  seqs = [engine.submit(r) for r in reqs[:4]]
  for r in reqs[4:]:
    engine.step()
    seqs.append(engine.submit(r))
  engine.run_until_idle()
  return seqs


@pytest.mark.parametrize(
    "method",
    [pytest.param(m, marks=pytest.mark.slow) for m in ("ar", "chain", TREE, LOOKAHEAD)] + ["loopspec"],
    ids=["ar", "chain", "tree", "lookahead", "loopspec"],
)
def test_continuous_batching_equals_solo_generate(method):
  model = helpers.tiny_model(SPEC)
  """Three decode-loop compiles per method (the engine's, generate's greedy and sampled): AR and chain are slow."""
  loop_fn = {"ar": autoregressive.decode_loop, "chain": chain.decode_loop, "loopspec": tick.decode_loop}
  loop_fn = dict(loop_fn, **{TREE: self_spec.decode_loop, LOOKAHEAD: lookahead.decode_loop})[method]
  before = loop_fn._cache_size()
  inserts = E.insert_slot._cache_size()
  eng = E.Engine(
      model, E.EngineConfig(method=method, slots=4, ticks_per_call=3, max_len=MAX_LEN, eos_id=5, **METHODS[method])
  )
  reqs = requests()
  seqs = run_staggered(eng, reqs)
  assert loop_fn._cache_size() - before <= 1  # one compiled decode loop for the whole run
  assert E.insert_slot._cache_size() - inserts <= 1
  assert eng.metrics.admitted == 12 and eng.running == 0
  for i, (r, s) in enumerate(zip(reqs, seqs)):
    assert s.finished and s.finish_reason in ("stop", "length"), i
    assert s.tokens == solo(model, method, r, eos_id=5), (method, i)
    assert s.finish_reason == ("stop" if s.tokens[-1] == 5 else "length")
    assert [t for t, _ in s.chunk_times] == sorted(t for t, _ in s.chunk_times)
  if method == "loopspec":
    assert eng.mean_accepted_length() > 0 and "loopspec_lanes_live" in eng.prometheus()
  # the served figure is the method's own derivation from the summed counters (the cost identity)
  m, r, n = eng.metrics, model.config.recurrence, eng.metrics.count("n_new")
  kw = METHODS[method]
  want = {
      "ar": lambda: 1.0,
      "chain": lambda: theory.chain_accepted_length(r, kw["d1"], kw["gamma"], n, m.count("rounds")),
      "loopspec": lambda: theory.gamma_from_counts(
          r, kw["d1"], kw["d2"], n, m.count("second") + m.count("restart"), m.count("restart")
      ),
      TREE: lambda: n / m.count("rounds"),  # tau: tokens per verify pass
      LOOKAHEAD: lambda: n / m.count("rounds"),
  }[method]()
  assert eng.mean_accepted_length() == pytest.approx(want)


def test_cancel_frees_the_slot_and_others_are_unaffected():
  """A request cancelled mid-run frees its slot for a waiting one; the others' tokens are unchanged. (The
  engine configuration of the LoopSpec batching test: its compiled loop is reused; eos is a traced value.)"""
  model = helpers.tiny_model(SPEC)
  eng = E.Engine(
      model, E.EngineConfig(method="loopspec", slots=4, ticks_per_call=3, max_len=MAX_LEN, eos_id=-1, d1=2, d2=4)
  )
  long = eng.submit(E.Request(prompt=[3, 4, 5], max_tokens=28))
  others = [eng.submit(E.Request(prompt=[9, 8 + i], max_tokens=20)) for i in range(3)]
  waiting = eng.submit(E.Request(prompt=[1, 2, 3, 4], max_tokens=10))
  while len(long.tokens) == 0:
    eng.step()
  assert waiting.slot == -1
  eng.cancel(long)
  eng.step()
  assert long.finished and long.finish_reason == "cancelled" and len(long.tokens) < 28
  assert waiting.slot == long.slot  # admitted into the freed slot
  eng.run_until_idle()
  for s in others + [waiting]:
    assert s.tokens == solo(model, "loopspec", s.request, eos_id=None)
  cancelled_waiting = eng.submit(E.Request(prompt=[1], max_tokens=4))
  eng.cancel(cancelled_waiting)
  eng.step()
  assert cancelled_waiting.finish_reason == "cancelled" and cancelled_waiting.tokens == []
  assert eng.metrics.finished["cancelled"] == 2


def test_queue_overflow_is_refused():
  model = helpers.tiny_model(SPEC)
  eng = E.Engine(model, E.EngineConfig(method="ar", slots=1, max_queue=2, max_len=MAX_LEN, greedy_only=True))
  eng.submit(E.Request(prompt=[1], max_tokens=2))
  eng.submit(E.Request(prompt=[2], max_tokens=2))
  with pytest.raises(E.QueueFullError, match="queue is full"):
    eng.submit(E.Request(prompt=[3], max_tokens=2))
  assert eng.metrics.rejected == 1 and eng.waiting == 2
  eng.run_until_idle()
  assert eng.submit(E.Request(prompt=[3], max_tokens=2)) is not None  # room again


@pytest.mark.parametrize(
    "field,value,param,match",
    [
        ("max_tokens", -1, "max_tokens", "max_tokens must be"),
        ("max_tokens", 0, "max_tokens", "max_tokens must be"),
        ("max_tokens", 31, "max_tokens", "exceeds the context of 32"),
        ("prompt", [], "prompt", "non-empty"),
        ("prompt", "text", "prompt", "non-empty list"),
        ("prompt", [1, 64], "prompt", "outside the vocabulary"),
        ("prompt", [-1], "prompt", "outside the vocabulary"),
        ("prompt", list(range(1, 33)), "prompt", "exceeds the context"),
        ("temperature", -0.5, "temperature", "temperature"),
        ("temperature", 1.0, "temperature", "greedy-only"),
        ("top_p", 0.0, "top_p", r"\(0, 1\]"),
        ("top_p", 1.5, "top_p", r"\(0, 1\]"),
        ("top_k", -2, "top_k", "top_k"),
        ("seed", -1, "seed", "seed"),
        ("stop", [""], "stop", "stop"),
        ("stop", ["a"], "stop", "tokenizer"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(field, value, param, match):
  model = helpers.tiny_model(SPEC)
  eng = _greedy_ar_engine(model)
  req = E.Request(prompt=[1, 2], max_tokens=2)
  setattr(req, field, value)
  with pytest.raises(E.RequestError, match=match) as info:
    eng.submit(req)
  assert info.value.param == param
  assert eng.waiting == 0


_ENGINES = {}


def _greedy_ar_engine(model):
  if "ar" not in _ENGINES:
    _ENGINES["ar"] = E.Engine(model, E.EngineConfig(method="ar", slots=1, max_len=MAX_LEN, greedy_only=True))
  return _ENGINES["ar"]


def test_engine_config_errors():
  model = helpers.tiny_model(SPEC)
  with pytest.raises(ValueError, match="d1"):
    E.Engine(model, E.EngineConfig(method="loopspec", d1=3))
  with pytest.raises(ValueError, match="max_len"):
    E.Engine(model, E.EngineConfig(method="ar", max_len=1000))
  with pytest.raises(ValueError, match="slots"):
    E.Engine(model, E.EngineConfig(method="ar", slots=0))
  with pytest.raises(ValueError, match="1 <= branch"):  # the tree methods' envelopes, before any compile
    E.Engine(model, E.EngineConfig(method="tree:branch=0"))
  with pytest.raises(ValueError, match="integer branch >= 1"):
    E.Engine(model, E.EngineConfig(method="chain:d1=1,gamma=3,branch=0"))
  with pytest.raises(ValueError, match="2 <= ngram <= 16"):
    E.Engine(model, E.EngineConfig(method="lookahead:ngram=1"))


def test_temperature_zero_rows_are_greedy_in_the_sampled_kernel():
  """process_logits at temperature 0 gives one-hot(argmax) rows, mixed per row with sampled ones."""
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 4, 64)).astype(np.float32)
  sp = common.make_sampling_params(
      3, 4, np.asarray([0.0, 1.0, 0.0]), np.asarray([0, 3, 2]), np.asarray([1.0, 0.5, 0.3]), 0, None
  )
  probs = np.asarray(common.row_distributions(logits, sp))
  onehot = np.eye(64)[logits.argmax(-1)]
  np.testing.assert_array_equal(probs[0], onehot[0])
  np.testing.assert_array_equal(probs[2], onehot[2])
  assert np.all((probs[1] > 0).sum(-1) <= 3) and np.allclose(probs[1].sum(-1), 1.0)


_MESH_WORKER = """
import json, sys
sys.path.insert(0, "tests")
import helpers
import loopspec_jax as lj
from loopspec_jax.parallel import sharding
from loopspec_jax.serving import engine as E
mesh = sharding.make_mesh((2, 2))
model = helpers.tiny_model("huginn:tiny")
eng = E.Engine(model, E.EngineConfig(method="loopspec", d1=2, d2=4, slots=4, ticks_per_call=3, max_len=32,
                                     greedy_only=True, eos_id=-1), mesh=mesh)
prompts = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [40, 41], [9], [3, 3, 3, 3], [7, 8]]
seqs = [eng.submit(E.Request(prompt=p, max_tokens=6 + i)) for i, p in enumerate(prompts)]
eng.run_until_idle()
ref = [lj.generate(model, [p], max_new_tokens=6 + i, method="loopspec", d1=2, d2=4).tokens[0]
       for i, p in enumerate(prompts)]
spec = str(eng.state.tokens.sharding.spec)
print(json.dumps({"same": [s.tokens == r for s, r in zip(seqs, ref)], "spec": spec}))
"""


@pytest.mark.slow
def test_engine_on_a_mesh_shards_slots_over_data():
  """Slots over the data axis of a (2 data, 2 model) mesh of 4 simulated CPU devices (a subprocess: the device
  count is fixed when jax starts); every request equals its solo generate output."""
  import json
  import os
  import subprocess
  import sys

  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, "-P", "-c", _MESH_WORKER],
      cwd=helpers.ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=1500,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  rep = json.loads(out.stdout.strip().splitlines()[-1])
  assert all(rep["same"]), rep
  assert "data" in rep["spec"], rep
