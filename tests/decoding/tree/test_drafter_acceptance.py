"""Acceptance of every bundled drafter against its recorded figure: a drafter bug that keeps output exact but
drafts worse (children under the wrong parents, head levels one position off, the n-gram pool ranked
oldest-first, heads trained one offset short) shows as a lower tau here, where the exactness tests pass.

Each drafter decodes the same two prompts greedily for NEW tokens on the bundled tiny-raven (MTP: its
tiny-raven-mtp model) with a small fixed envelope; its output must be AR's and its tau (tokens per
full-depth verify pass) the figure recorded in tests/fixtures/drafter_acceptance.json within TAU_TOL. Greedy
tau is deterministic (no timing, no sampling): one verify pass more or fewer over the 2 x NEW tokens moves it by
at least 0.029 (lookahead's 46 passes), about 3 x TAU_TOL, so the tolerance only absorbs the rounding of the
recorded decimals. The figures were recorded on the date and
host the file names (results/drafter_acceptance/2026-12-06/README.md); re-record with
`python tests/decoding/tree/test_drafter_acceptance.py --record` after an intended change of a drafter, and say why in the
commit.
"""

import functools
import json
import os
import sys

import pytest

import helpers
import loopspec_jax as lj

FIXTURE = os.path.join(helpers.FIXTURES, "drafter_acceptance.json")
TEXTS = (  # with repeats, so that the n-gram drafters (lookahead, lookup) find matches
    "ROMEO:\nWhat light, what light, what light through yonder window breaks? What light",
    "Question: Tom has 3 apples. Tom has 3 apples. Tom has 3 apples. Tom has",
)
NEW = 32
TAU_TOL = 0.01
DRAFTERS = {  # name: (model, generate's keyword arguments; heads and drafter models by bundled name)
    "tree": ("tiny-raven", dict(method="tree", d1=4, gamma=4, branch=2, tree_nodes=8)),
    "lookahead": ("tiny-raven", dict(method="lookahead", window=3, ngram=3, guesses=3)),
    "lookup": ("tiny-raven", dict(method="lookup", ngram=2, gamma=3, candidates=4)),
    "draft": ("tiny-raven", dict(method="draft", draft_model="tiny-raven-draft", gamma=3, branch=2, tree_nodes=6)),
    "medusa": ("tiny-raven", dict(method="medusa", heads="tiny-raven-medusa", tree_nodes=8, branch=2)),
    "eagle": ("tiny-raven", dict(method="eagle", heads="tiny-raven-eagle", gamma=4, branch=2, tree_nodes=8)),
    "mtp": ("tiny-raven-mtp", dict(method="mtp", heads="tiny-raven-mtp", gamma=2, branch=2)),
}


@functools.lru_cache(maxsize=None)
def load(name: str):
  return lj.load(name)


def run(name: str):
  """(result of the drafter, AR's tokens) on the prompt set."""
  model_name, kw = DRAFTERS[name]
  model = load(model_name)
  kw = dict(kw)
  if "heads" in kw:
    kw["heads"] = lj.load_heads(kw["heads"])
  if "draft_model" in kw:
    kw["draft_model"] = load(kw["draft_model"])
  prompts = [model.encode(t) for t in TEXTS]
  return lj.generate(model, prompts, max_new_tokens=NEW, **kw), _ar(model_name)


@functools.lru_cache(maxsize=None)
def _ar(model_name: str):
  model = load(model_name)
  return helpers.ar_tokens(model, [model.encode(t) for t in TEXTS], NEW)


def figures(res) -> dict:
  s = res.stats
  return {"tau": round(s["tau"], 6), "accepted_per_pass": round(s["accepted_per_pass"], 6)}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_drafter_tau_matches_its_recorded_figure(name):
  with open(FIXTURE) as f:
    want = json.load(f)["drafters"][name]
  res, ar = run(name)
  assert res.tokens == ar, res.stats
  got = figures(res)
  assert got["tau"] == pytest.approx(want["tau"], abs=TAU_TOL), (name, got, want)
  assert got["accepted_per_pass"] == pytest.approx(want["accepted_per_pass"], abs=TAU_TOL), (name, got, want)


def record() -> None:
  """Rewrites the fixture with this checkout's figures (the settings are in DRAFTERS)."""
  import jax

  out = {
      "what": "greedy tau of each bundled drafter, tests/decoding/tree/test_drafter_acceptance.py",
      "prompts": list(TEXTS),
      "max_new_tokens": NEW,
      "jax": jax.__version__,
      "drafters": {},
  }
  for name in DRAFTERS:
    res, ar = run(name)
    assert res.tokens == ar, name
    out["drafters"][name] = dict(figures(res), settings=DRAFTERS[name][1], model=DRAFTERS[name][0])
    print(name, out["drafters"][name], flush=True)
  with open(FIXTURE, "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")


if __name__ == "__main__" and "--record" in sys.argv:
  record()
