"""method="auto" with re-planning stops every request at its eos wherever the eos falls around the re-plan
boundary (planner.generate): the eos as the last token before it, exactly on it (the N-th new token: the
request must not run the continuation) and the first token after it; greedy and sampled, the tokens equal
AR's cut at the eos. Small planner settings (no depth probe, forced picks: the decodes are real)."""

import dataclasses

import pytest

import helpers
import loopspec_jax as lj
from loopspec_jax import planner
from test_planner import forced_measure
from test_planner import quick_planner  # noqa: F401  (a fixture)

N = 3  # re-plan after N new tokens (EOS_PROMPTS: a new token at N - 1, N and N + 1)
AUTO = planner.Auto(probe_tokens=0, measure=2, rounds=1, replan=N)
PROMPTS = helpers.EOS_PROMPTS


def eos_at(free, position: int):
  """(request, token) whose first occurrence in request's continuation `free` is at 1-based `position`."""
  for r, toks in enumerate(free):
    t = toks[position - 1]
    if t not in toks[: position - 1]:
      return r, t
  raise AssertionError(f"no request's token {position} is new: {free}")


@pytest.mark.parametrize(
    "kw,picks",
    [(dict(), ("chain", "ar")), (dict(temperature=1.0, top_k=20, seed=3, request_ids=[4, 0, 9]), ("ar", "ar"))],
    ids=["greedy", "sampled"],
)
def test_auto_stops_at_an_eos_on_either_side_of_the_replan_boundary(kw, picks, quick_planner, monkeypatch):
  model = helpers.tiny_model("huginn:tiny")
  methods = {"chain": lj.Chain(d1=1, gamma=2), "ar": lj.AR()}
  free = lj.generate(model, PROMPTS, max_new_tokens=helpers.MAX_NEW, method="ar", **kw).tokens
  for position in (N - 1, N, N + 1):
    r, eos = eos_at(free, position)
    want = lj.generate(model, PROMPTS, max_new_tokens=helpers.MAX_NEW, method="ar", eos_id=eos, **kw)
    assert len(want.tokens[r]) == position and want.tokens[r][-1] == eos
    planner.clear_plans()
    monkeypatch.setattr(planner, "measure", forced_measure([methods[p] for p in picks]))
    got = lj.generate(model, PROMPTS, max_new_tokens=helpers.MAX_NEW, method=AUTO, eos_id=eos, **kw)
    assert got.tokens == want.tokens, (position, r, got.stats["plan"])
    assert got.stats["per_request"]["tokens"] == [len(t) for t in want.tokens], position
    assert got.stats["plan"]["picks"] == [methods[p].spec for p in picks] or not any(
        len(t) > N for t in want.tokens
    ), got.stats["plan"]
