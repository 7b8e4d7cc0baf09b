"""Typed stats: raw counts that add across runs; each method derives its figures from the summed counts."""

import pytest

import helpers
import loopspec_jax as lj
from loopspec_jax.analysis import theory
from loopspec_jax.decoding.stats import DecodeStats

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9]]


@pytest.mark.parametrize(
    "method",
    [
        lj.AR(),
        pytest.param(lj.Chain(d1=1, gamma=3), marks=pytest.mark.slow),
        lj.LoopSpec(d1=2, d2=4),  # (1, 2) has twice the stages: twice the compile
        pytest.param(lj.Lookup(ngram=2, gamma=3), marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_runs_add_to_the_batched_run(method):
  model = helpers.tiny_model("huginn:tiny", contraction=0.7)
  solo = [lj.generate(model, [p], max_new_tokens=8, method=method, request_ids=[i]) for i, p in enumerate(PROMPTS)]
  both = lj.generate(model, PROMPTS, max_new_tokens=8, method=method)
  added = solo[0].counts + solo[1].counts
  assert sum(r.counts for r in solo).per_request == added.per_request  # sum() works too
  assert added.per_request == both.counts.per_request  # per-request counts do not depend on batching
  assert added.totals["calls"] == 2 and added.tokens == both.counts.tokens == 16
  fig = added.summary()
  for k in ("mean_accepted_length", "tokens_per_r_steps", "tokens_per_pass", "acceptance"):
    assert fig[k] == both.counts.summary()[k], k  # figures of per-request counts: batch-independent
  if isinstance(method, lj.LoopSpec):
    c = fig["commits"]
    assert fig["mean_accepted_length"] == theory.gamma_from_counts(
        model.config.recurrence, 2, 4, 16, c["second"] + c["restart"], c["restart"]
    )


def test_only_one_configuration_adds():
  a = DecodeStats("chain", {"d1": 1}, {"tokens": [3]})
  with pytest.raises(ValueError, match="only runs of one method and configuration add"):
    a + DecodeStats("chain", {"d1": 2}, {"tokens": [3]})
  assert DecodeStats.total([a, a]).per_request == {"tokens": [3, 3]}
