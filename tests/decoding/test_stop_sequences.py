"""Stop token sequences inside the decode loop (`generate(stop=...)`, decoding/stops.py).

A speculative commit appends several tokens at once; a stop sequence that completes inside it must end the
output at the same token as AR with the same stop, and one that straddles two commits must be found too. The
stops are taken from AR's own output, so they surely occur; the chain's per-request counts show where its
commits ended. Every run has the same stop-table shape (K = 1, L = 2) and length bucket, so each method
compiles once for the module.
"""

import jax
import numpy as np
import pytest

import helpers
import loopspec_jax
from test_planner import quick_planner  # noqa: F401  (a fixture)
from loopspec_jax.decoding import common
from loopspec_jax.decoding import stops

SPEC, CONTRACTION = "huginn:tiny", 0.05  # drafts mostly accepted: multi-token commits
PROMPTS = [list(p) for p in helpers.PROMPTS]
MAX_NEW = 24  # prompts of <= 7 tokens + 24: the (16, 32) bucket for every budget below
CHAIN = dict(method="chain", d1=1, gamma=4)
LOOPSPEC = dict(method="loopspec", d1=2)  # one proposal: half the compile time of two (both: the slow test)


@pytest.fixture(scope="module")
def model():
  return helpers.tiny_model(SPEC, CONTRACTION)


def run(model, stop, max_new=MAX_NEW, **kw):
  return loopspec_jax.generate(model, PROMPTS, max_new_tokens=max_new, stop=[list(stop)], **kw)


@pytest.fixture(scope="module")
def free(model):
  """AR's continuations with a stop that never occurs (the same compiled program as every stop run)."""
  never = [model.config.vocab_size - 1] * 2
  out = run(model, never).tokens
  assert all(stops.cut_tokens(t, [never]) == t for t in out) and all(len(t) == MAX_NEW for t in out)
  return out


def candidates(toks: list, start: int = 2):
  """(end, stop): the 2-token stops toks[end - 2:end] whose first occurrence in toks ends at `end`."""
  for end in range(start, len(toks)):
    stop = toks[end - 2 : end]
    if stops.cut_tokens(toks, [stop]) == toks[:end]:
      yield end, stop


def chain_commits(res, r: int) -> tuple:
  pr = res.stats["per_request"]
  return pr["tokens"][r], pr["accepted"][r], pr["rounds"][r]


def test_stop_inside_a_speculative_commit_ends_where_ar_ends(model, free):
  """A stop completing within a chain round's accepted drafts: the round is cut there (its remaining drafts and
  the verifier's token dropped: tokens - accepted == rounds - 1), the output is AR's with the same stop, and
  LoopSpec ends at the same token too."""
  r = 0
  for end, stop in candidates(free[r]):
    got = run(model, stop, **CHAIN)
    n, acc, rounds = chain_commits(got, r)
    if n == end and n - acc == rounds - 1:
      break
  else:
    pytest.fail(f"no stop of {free[r]} completes inside a chain commit")
  print(f"stop {stop} ends at token {end}: chain {rounds} rounds, {acc} accepted drafts, {n} tokens")
  ar = run(model, stop)
  assert got.tokens == ar.tokens
  assert ar.tokens[r] == free[r][:end] and ar.tokens[r][-2:] == stop
  assert ar.stats["per_request"]["tokens"][r] == end < MAX_NEW
  assert run(model, stop, **LOOPSPEC).tokens == ar.tokens


def test_stop_straddling_two_commits(model, free):
  """A stop whose first token ends one chain round and whose last token starts the next: found through the
  look-back into the committed output; the outputs equal AR's (and LoopSpec's, one commit per tick)."""
  r = 0
  for end, stop in candidates(free[r], start=3):
    before, at = run(model, stop, max_new=end - 2, **CHAIN), run(model, stop, max_new=end - 1, **CHAIN)
    if chain_commits(at, r)[2] > chain_commits(before, r)[2]:  # a round ends after token end - 1
      break
  else:
    pytest.fail(f"no stop of {free[r]} straddles two chain commits")
  got = run(model, stop, **CHAIN)
  print(f"stop {stop} ends at token {end}: a new chain round starts at token {end}, {chain_commits(got, r)}")
  ar = run(model, stop)
  assert got.tokens == ar.tokens and ar.tokens[r] == free[r][:end]
  assert run(model, stop, **LOOPSPEC).tokens == ar.tokens


def test_stop_never_matches_the_prompt(model, free):
  """The prompt's last token followed by the first new token is no stop: stops apply to the output only."""
  stop = [PROMPTS[0][-1], free[0][0]]
  want = stops.cut_tokens(free[0][1:], [stop])
  assert run(model, stop).tokens[0] == free[0][:1] + want


def test_stop_hits_straddle_and_skip_the_prompt():
  """`stop_hits` directly: a 3-token stop found at each position of a commit, across the previous commit, and
  not where a prompt token would complete it."""
  table = stops.stop_table([[7, 8, 9]])
  assert table.shape == (1, 4) and table.tolist() == [[-1, 7, 8, 9]]
  tokens = np.zeros((3, 16), np.int32)
  tokens[:, :6] = [1, 2, 3, 4, 7, 8]  # request 0, 1: output 7 8 (n_new 2); request 2: prompt ends 7 8
  y = np.array([[9, 7, 8], [5, 6, 7], [9, 9, 9]], np.int32)
  hits = jax.jit(stops.stop_hits)(tokens, np.array([6, 6, 6]), np.array([2, 2, 0]), y, table)
  assert np.asarray(hits).tolist() == [[True, False, False], [False, False, False], [False, False, False]]
  y2 = np.array([[1, 7, 8, 9]], np.int32)  # a stop completing at the last position of one commit
  hits = jax.jit(stops.stop_hits)(tokens[:1], np.array([6]), np.array([2]), y2, table)
  assert np.asarray(hits).tolist() == [[False, False, False, True]]


def test_stop_strings_and_bad_stops_rejected_before_compiling(model):
  """Strings need a tokenizer; an empty, over-long, out-of-vocabulary or non-integer stop is a ValueError
  raised before anything compiles."""
  entry = [(common, "prefill_state")]
  v = model.config.vocab_size
  for stop, match in [
      ([[]], "stop sequence 0 is empty"),
      ([list(range(stops.MAX_STOP_TOKENS + 1))], "at most 32 fit"),
      ([[1, v]], "outside the vocabulary"),
      ([[1.5]], "not a non-negative integer"),
      (["\n"], "needs the model's tokenizer"),
      (7, "stop must be a string or a list"),
  ]:
    args = dict(prompts=PROMPTS, max_new_tokens=4, stop=stop)
    helpers.assert_rejected_before_compiling(model, args, match, entry)
  tok = helpers.tokenized_model()
  with pytest.raises(ValueError, match="stop string is empty"):
    loopspec_jax.generate(tok, [[1, 2]], max_new_tokens=4, stop=[""])


def test_text_stops_spell_the_string():
  """Each stop string gives its own encoding and the one after a space, only variants whose text holds it."""
  tok = helpers.tokenized_model()
  seqs = stops.text_stops(["Q:", "\n\n", ""], tok.encode, tok.decode)
  assert tuple(tok.encode("Q:")) in seqs and tuple(tok.encode(" Q:")) in seqs
  assert tuple(tok.encode("\n\n")) in seqs and len(seqs) == 3
  assert all(any(s in tok.decode(list(q)) for s in ("Q:", "\n\n")) for q in seqs)


def _method_kwargs(name: str, model) -> dict:
  """generate's keyword arguments of each method (small envelopes; heads and drafters random or shallow)."""
  import dataclasses

  import head_helpers
  from loopspec_jax.heads import artefact
  from loopspec_jax.heads import dflash

  if name in head_helpers.KINDS:
    return head_helpers.spec_kwargs(name, model)
  if name == "dflash":
    config = dflash.head_config(model.config)
    params = dflash.init_params(config, jax.random.PRNGKey(1))
    heads = artefact.Heads(dflash.KIND, params, config, artefact.target_signature(model))
    return dict(method="dflash", heads=heads, gamma=3)
  if name == "draft":
    drafter = dataclasses.replace(model, config=model.config.replace(recurrence=1), source="shallow1")
    return dict(method="draft", draft_model=drafter, gamma=3)
  return {
      "tree": dict(method="chain", d1=1, gamma=3, branch=2, tree_nodes=6),
      "lookup": dict(method="lookup", gamma=3),
      "lookahead": dict(method="lookahead:3,3,3"),
      "loopspec-two": dict(method="loopspec", d1=2, d2=4),
  }[name]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["tree", "draft", "lookup", "lookahead", "medusa", "eagle", "mtp", "dflash", "loopspec-two"]
)
def test_every_method_stops_where_ar_stops(model, free, name):
  """Every method commits through `common.commit_tokens`: with a stop from AR's output (a different end per
  request) its greedy tokens equal AR's."""
  stop = free[1][9:11]
  ar = run(model, stop)
  assert len(ar.tokens[1]) <= 11 and len({len(t) for t in ar.tokens}) > 1, ar.tokens
  assert run(model, stop, **_method_kwargs(name, model)).tokens == ar.tokens


@pytest.mark.slow
@pytest.mark.parametrize("position", [2, 3, 4])
def test_auto_stops_on_either_side_of_the_replan_boundary(position, quick_planner, monkeypatch):
  """method="auto" re-plans after N = 3 tokens and continues on prompt + prefix, whose loop cannot look back
  past the join: a stop ending at token N - 1, N (the continuation must not run on) or N + 1 (straddling the
  join) still ends the output where AR's does (`generate` cuts the joined tokens at the first stop)."""
  from loopspec_jax import planner
  from test_planner import forced_measure

  model = helpers.tiny_model("huginn:tiny")
  auto = planner.Auto(probe_tokens=0, measure=2, rounds=1, replan=3)
  prompts = [list(p) for p in helpers.EOS_PROMPTS]
  gen = lambda **kw: loopspec_jax.generate(model, prompts, max_new_tokens=helpers.MAX_NEW, **kw)
  free = gen(stop=[[model.config.vocab_size - 1] * 2]).tokens
  r = next(i for i, t in enumerate(free) if stops.cut_tokens(t, [t[position - 2 : position]]) == t[:position])
  stop = free[r][position - 2 : position]
  want = gen(stop=[stop])
  assert want.tokens[r] == free[r][:position]
  monkeypatch.setattr(planner, "measure", forced_measure([loopspec_jax.Chain(d1=1, gamma=2), loopspec_jax.AR()]))
  got = gen(method=auto, stop=[stop])
  assert got.tokens == want.tokens, (position, got.stats["plan"])
