"""Stop strings in the engine, sampled, many seeds: tokens end at the stop whatever the batching, and the
streamed chunks' text concatenates to the final text.

A tiny Huginn-style model with a fake tokenizer whose tokens decode to multi-character pieces
(server_helpers.PieceTokenizer), so stop strings straddle tokens and device calls; the LoopSpec engine
configuration of tests/serving/test_serving_engine.py (its compiled loop is reused when both run). Reference: the
same request without stop strings, decoded alone by the engine (test_serving_engine shows those equal
`generate`), cut by the brute-force rule (server_helpers.expected_stop).
"""

from __future__ import annotations

import helpers
import server_helpers
from loopspec_jax.serving import engine as E

STOPS = (["ab"], ["b a"], ["\n"], ["ca", "bb"], ["aab", " b", "cb", "zz", "q", "ba\n"], ["a b"])


def _engine(model):
  cfg = E.EngineConfig(method="loopspec", slots=4, ticks_per_call=3, max_len=32, eos_id=5, d1=2, d2=4)
  return E.Engine(model, cfg)


def test_sampled_stop_strings_many_seeds():
  model = server_helpers.with_pieces(helpers.tiny_model("huginn:tiny"))
  eng = _engine(model)
  reqs = [
      E.Request(prompt=[1 + i % 7, 3, 2 + i % 5], max_tokens=12 + i % 9, temperature=1.0, top_p=0.95, seed=1000 + i)
      for i in range(12)
  ]
  solo = []
  for r in reqs:  # one at a time: the stop-free reference
    solo.append(eng.generate(r).tokens)
  chunks = {}
  record = lambda seq, chunk: chunks.setdefault(seq.id, []).append(chunk)
  stopped = [E.Request(**{**r.__dict__, "stop": STOPS[i % len(STOPS)]}) for i, r in enumerate(reqs)]
  seqs = [eng.submit(r, on_chunk=record) for r in stopped[:5]]
  for r in stopped[5:]:  # staggered: admitted at different ticks, batched with different requests
    eng.step()
    seqs.append(eng.submit(r, on_chunk=record))
  eng.run_until_idle()
  hits = 0
  for i, (r, s) in enumerate(zip(stopped, seqs)):
    text, ids = server_helpers.expected_stop(model, solo[i], r.stop, eos_id=5)
    assert s.tokens == ids, i
    assert s.text == text, i
    assert "".join(c.text for c in chunks[s.id]) == text, i  # the stream never sent a stop string's start
    assert [t for c in chunks[s.id] for t in c.tokens] == ids, i
    hits += len(ids) < len(solo[i]) or (s.finish_reason == "stop" and solo[i][-1] != 5)
  assert hits >= 6  # most requests did stop on a stop string
