"""Tree self-speculation (`generate(..., method='tree:d1=,gamma=,branch=,tree_nodes=')`): greedy and sampled
output equal full-depth AR token for token (the verifier emits AR's own draws), one trace per configuration,
branch=1 drafts chain's greedy drafts, the compiled loop copies no cache buffer, bad envelopes are refused
before compiling.

Every batch is the shared 3-request batch of different lengths (helpers.PROMPTS); envelopes are small so the
unrolled drafting levels compile fast. Only Huginn runs by default (a compile costs about a minute on a loaded
2-core machine); the other families, top-p, branch=1 against chain, the HLO check, the HF fixtures and the
bundled tiny-raven are marked slow.
"""

import re

import jax
import pytest

import helpers
import loopspec_jax
from helpers import MAX_NEW, PROMPTS, tiny_model
from loopspec_jax.analysis import cost
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import self_spec

# Per family: a small envelope (d1, gamma, branch, tree_nodes) and a contraction that makes drafts accepted.
FAMILIES = {
    "ouro:tiny": dict(tree=(1, 3, 2, 6), contraction=0.02),  # R = 4
    "huginn:tiny": dict(tree=(1, 3, 2, 6), contraction=0.05),  # R = 8
    "raven_llama:tiny": dict(tree=(2, 2, 3, 6), contraction=0.05),  # R = 8
    "raven_olmo:tiny": dict(tree=(1, 3, 2, 5), contraction=0.05),  # R = 8
}
run = helpers.generate_cached


def spec(d1, gamma, branch, nodes) -> str:
  return f"tree:d1={d1},gamma={gamma},branch={branch},tree_nodes={nodes}"


def assert_accounting(res, gamma, nodes):
  """Each round commits its accepted drafts plus one target token (a last round may be cut after an accepted
  draft); every round verifies `nodes` draft nodes."""
  pr = res.stats["per_request"]
  for i, toks in enumerate(res.tokens):
    n, acc, rounds = len(toks), pr["accepted"][i], pr["rounds"][i]
    assert 0 <= acc <= gamma * rounds and n - acc in (rounds, rounds - 1), (i, pr)
    assert pr["nodes"][i] == nodes * rounds, (i, pr)
  assert res.stats["tau"] == pytest.approx(res.stats["tokens_generated"] / sum(pr["rounds"]))


@pytest.mark.parametrize(
    "name", [n if n == "huginn:tiny" else pytest.param(n, marks=pytest.mark.slow) for n in FAMILIES]
)
def test_greedy_matches_ar_in_both_regimes(name):
  env = FAMILIES[name]["tree"]
  for contraction in (None, FAMILIES[name]["contraction"]):
    want = run(name, contraction, "ar")
    got = run(name, contraction, spec(*env))
    assert got.tokens == want.tokens, (name, contraction, got.stats)
    assert_accounting(got, env[1], env[3])
  assert got.stats["tau"] > 1.5, got.stats  # converging depths: several tokens per verify pass


@pytest.mark.parametrize(
    "kw",
    [dict(temperature=1.0, top_k=20), pytest.param(dict(temperature=0.8, top_p=0.9), marks=pytest.mark.slow)],
    ids=["T1-topk", "topp"],
)
def test_sampled_equals_ar_token_for_token_and_traces_once(kw):
  """The tree emits AR's own per-position draws: the same tokens as AR for the same seed and request ids,
  whatever the batch layout. Four calls of one configuration compile prefill and loop once each."""
  name, env = "huginn:tiny", FAMILIES["huginn:tiny"]["tree"]
  model = tiny_model(name, FAMILIES[name]["contraction"])
  runs = helpers.sampling_runs(model, spec(*env), kw, [(common, "prefill_state"), (self_spec, "decode_loop")])
  assert runs["cache_sizes"] == (1, 1)
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)
  other = ((9, 8, 7, 6, 5, 4), (30, 31))
  calls = {
      "a": (PROMPTS, dict(seed=0)),
      "moved": ((other[0], PROMPTS[0], other[1]), dict(seed=0, request_ids=[7, 0, 9])),
      "seed1": (PROMPTS, dict(seed=1)),
  }
  for key, (prompts, extra) in calls.items():
    want = helpers.ar_tokens(model, prompts, MAX_NEW, **kw, **extra)
    assert runs[key].tokens == want, (key, runs[key].stats)
    assert_accounting(runs[key], env[1], env[3])
  acc = [runs[k].stats["acceptance"] for k in ("a", "moved", "seed1")]
  assert 0 < min(acc) and max(acc) < 1, acc  # both accepted and rejected nodes occur


def test_eos_stops_requests_at_different_rounds():
  env = FAMILIES["huginn:tiny"]["tree"]
  got = helpers.eos_run("huginn:tiny", FAMILIES["huginn:tiny"]["contraction"], spec(*env))
  assert_accounting(got, env[1], env[3])


@pytest.mark.slow
def test_branch_one_drafts_chains_greedy_drafts():
  """branch=1, tree_nodes=gamma is a chain: the same tokens, rounds and accepted drafts as method='chain'."""
  name, contraction, d1, gamma = "huginn:tiny", FAMILIES["huginn:tiny"]["contraction"], 1, 2
  chain = run(name, contraction, "chain", d1=d1, gamma=gamma)
  tree = run(name, contraction, spec(d1, gamma, 1, gamma))
  assert tree.tokens == chain.tokens
  for key in ("rounds", "accepted"):
    assert tree.stats["per_request"][key] == chain.stats["per_request"][key], key


@pytest.mark.slow
def test_compiled_loop_copies_no_cache_buffer():
  """The optimised HLO of the tree loop (huginn:tiny shapes): no copy whose shape is a cache buffer's, and no
  loop-carried copy (the cost model's check). The tree's entries live outside the cache until the path write."""
  cfg = tiny_model("huginn:tiny").config
  d1, gamma, branch, nodes = FAMILIES["huginn:tiny"]["tree"]
  compiled = cost.compile_decode_loop(cfg, "tree", d1=d1, gamma=gamma, branch=branch, tree_nodes=nodes)
  step = cost.loop_cost(compiled)
  assert step.loop_carried_copies == 0, step.large_copies
  cache_shapes = {",".join(map(str, d)) for d in compiled.kv_dims}
  copied = set(re.findall(r"= \w+\[([\d,]+)\]\{[^}]*\} copy\(", compiled.hlo))
  assert not copied & cache_shapes, copied & cache_shapes


@pytest.mark.parametrize(
    "method,match",
    [
        ("tree:d1=8", r"draft depth 1 <= d1 < R=8, got 8"),
        ("tree:d1=0", r"draft depth 1 <= d1 < R=8, got 0"),
        ("tree:gamma=0", r"tree depth 1 <= gamma <= 32, got 0"),
        ("tree:branch=0", r"1 <= branch <= 64, got 0"),
        ("tree:branch=2.5", r"integer branch, got 2.5"),
        ("tree:branch=2,gamma=2,tree_nodes=7", r"1 <= tree_nodes <= 6 .*got 7"),
        ("tree:tree_nodes=0", r"1 <= tree_nodes <= 84 .*got 0"),
        ("tree:width=3", r"takes no 'width'"),
    ],
)
def test_bad_envelopes_rejected_before_compiling(method, match):
  model = tiny_model("raven_llama:tiny")  # R = 8, V = 64
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=MAX_NEW, method=method)
  helpers.assert_rejected_before_compiling(model, args, match, [(common, "prefill_state"), (self_spec, "decode_loop")])


# ---------------------------------------------------------------------------------------------------
# Slow: the HF fixtures and the bundled tiny-raven (R = 32)
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name,env", [("huginn_tiny", (2, 3, 3, 8)), ("ouro_tiny", (1, 3, 3, 8))])
def test_hf_fixtures_match_oracle_and_ar(name, env):
  model, prompts, oracle = helpers.fixture_batch(name)
  want = loopspec_jax.generate(model, prompts, max_new_tokens=len(oracle), method="ar")
  assert want.tokens[0] == oracle
  got = loopspec_jax.generate(model, prompts, max_new_tokens=len(oracle), method=spec(*env))
  assert got.tokens == want.tokens, got.stats
  assert_accounting(got, env[1], env[3])


@pytest.mark.slow
def test_bundled_tiny_raven_greedy_and_sampled_equal_ar():
  model = loopspec_jax.load("tiny-raven")
  prompts = [list(range(5, 25)), [3, 9, 27, 81], list(range(100, 112))]
  for kw in (dict(), dict(temperature=1.0, top_k=50, seed=4)):
    want = loopspec_jax.generate(model, prompts, max_new_tokens=24, method="ar", **kw)
    got = loopspec_jax.generate(model, prompts, max_new_tokens=24, method=spec(2, 4, 3, 12), **kw)
    assert got.tokens == want.tokens, (kw, got.stats)
    assert got.stats["tau"] > 2.0, got.stats


@pytest.mark.slow
def test_random_initial_state_matches_ar():
  """Raven 'like-init' noise is keyed by (request, position): every tree node and drafting level gets AR's."""
  name = "huginn:tiny"
  kw = dict(init_state="random")
  want = run(name, FAMILIES[name]["contraction"], "ar", **kw)
  got = run(name, FAMILIES[name]["contraction"], spec(*FAMILIES[name]["tree"]), **kw)
  assert got.tokens == want.tokens, got.stats
