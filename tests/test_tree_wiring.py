"""The tree methods everywhere the other methods are: `method="chain"` with `branch > 1` is tree
self-speculation (and `branch=1` is the chain), and bad envelopes or trees too deep for the context are
refused by `generate` before anything compiles.

The tree configuration is the one tests/test_tree.py runs on huginn:tiny (its compile is shared through
jax's cache when both files run).
"""

import dataclasses

import pytest

import helpers
from helpers import MAX_NEW, tiny_model
from loopspec_jax import methods
from loopspec_jax.configs.models import model_config
from loopspec_jax.decoding import chain
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import lookahead as la
from loopspec_jax.decoding.tree import self_spec

NAME, CONTRACTION = "huginn:tiny", 0.05
ENV = dict(d1=1, gamma=3, branch=2, tree_nodes=6)
NEVER = [(common, "prefill_state"), (self_spec, "decode_loop"), (chain, "decode_loop"), (la, "decode_loop")]


def _same_program(a, b) -> bool:
  """Two `Decoder`s that run one compiled program with one configuration."""
  keys = ("name", "readout_depths", "cache_group", "extra_positions", "init", "loop", "init_kw", "loop_kw")
  return all(getattr(a, k) == getattr(b, k) for k in keys)


@pytest.mark.parametrize("greedy", [True, False])
def test_chain_decoders_are_the_tree_or_the_chain(greedy):
  """branch > 1: method='chain' builds tree self-speculation's decoder with the same envelope (defaults filled
  in the same way); branch=1: chain's own. No compile: the same program and settings are the same run."""
  cfg = model_config(NAME)
  make = lambda m: m.make_decoder(cfg, greedy=greedy, random_init=False)
  assert _same_program(make(methods.Chain(**ENV)), make(methods.TreeSelf(**ENV)))
  assert _same_program(make(methods.Chain(d1=1, branch=4)), make(methods.TreeSelf(d1=1, branch=4)))
  assert make(methods.Chain(**ENV)).loop is self_spec.decode_loop
  for one in (methods.Chain(d1=1, gamma=2, branch=1), methods.Chain(d1=1, gamma=2, branch=1, tree_nodes=2)):
    assert _same_program(make(one), make(methods.Chain(d1=1, gamma=2)))


@pytest.mark.slow
def test_chain_with_branch_is_tree_self_speculation():
  """generate(method='chain', d1=, gamma=, branch=, tree_nodes=) runs method='tree' with those arguments: the
  same tokens (AR's), verify passes and accepted drafts; its stats are the tree's."""
  tree = helpers.generate_cached(NAME, CONTRACTION, "tree", **ENV)
  got = helpers.generate_cached(NAME, CONTRACTION, "chain", **ENV)
  assert got.tokens == tree.tokens == helpers.generate_cached(NAME, CONTRACTION, "ar").tokens
  assert got.stats["method"] == "tree" and got.stats["tau"] == tree.stats["tau"] > 1.5, got.stats
  for key in ("rounds", "accepted", "nodes"):
    assert got.stats["per_request"][key] == tree.stats["per_request"][key], key
  spec = methods.parse("chain:d1=1,gamma=3,branch=2,tree_nodes=6")
  assert spec.as_tree() == methods.TreeSelf(**ENV) and methods.parse(spec.spec) == spec


@pytest.mark.slow
def test_chain_with_branch_one_is_the_chain():
  want = helpers.generate_cached(NAME, CONTRACTION, "chain", d1=1, gamma=2)
  got = helpers.generate_cached(NAME, CONTRACTION, "chain", d1=1, gamma=2, branch=1)
  assert got.tokens == want.tokens and got.stats["method"] == "chain"
  assert got.stats["per_request"] == want.stats["per_request"]
  assert methods.Chain(d1=1, gamma=2, branch=1, tree_nodes=2).as_tree() is None


@pytest.mark.parametrize(
    "method,match",
    [
        ("chain:d1=1,gamma=3,branch=0", r"integer branch >= 1, got 0"),
        ("chain:d1=1,gamma=3,branch=2.5", r"integer branch >= 1, got 2.5"),
        ("chain:d1=1,gamma=3,tree_nodes=6", r"tree_nodes=6 needs branch > 1"),
        ("chain:d1=1,gamma=auto,branch=2", r"needs an integer gamma, not 'auto'"),
        ("chain:d1=1,gamma=2,branch=2,tree_nodes=7", r"1 <= tree_nodes <= 6 .*got 7"),
        ("chain:d1=8,gamma=3,branch=2", r"draft depth 1 <= d1 < R=8, got 8"),
        ("chain:d1=1,gamma=0,branch=2", r"tree depth 1 <= gamma"),
    ],
)
def test_bad_chain_trees_rejected_before_compiling(method, match):
  model = tiny_model("raven_llama:tiny")  # R = 8, V = 64
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=MAX_NEW, method=method)
  helpers.assert_rejected_before_compiling(model, args, match, NEVER)


@pytest.mark.parametrize(
    "method,match",
    [
        ("tree:gamma=4,branch=2,tree_nodes=3", r"tree_nodes >= gamma=4 .*got 3"),
        ("chain:d1=1,gamma=4,branch=3,tree_nodes=2", r"tree_nodes >= gamma=4 .*got 2"),
        ("tree:d1=1,gamma=0,branch=2", r"tree depth 1 <= gamma <= 32, got 0"),
        ("lookahead:window=33", r"1 <= window <= 32, got 33"),
        ("lookahead:ngram=17", r"2 <= ngram <= 16, got 17"),
        ("lookahead:guesses=65", r"1 <= guesses <= 64, got 65"),
    ],
)
def test_bad_envelopes_rejected_before_compiling(method, match):
  model = tiny_model("raven_llama:tiny")
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=MAX_NEW, method=method)
  helpers.assert_rejected_before_compiling(model, args, match, NEVER)


@pytest.mark.parametrize(
    "method,match",
    [
        ("lookahead:window=20", r"up to 20 positions ahead, too deep for the model's context of 12"),
        ("lookahead:window=2,ngram=14", r"up to 13 positions ahead, too deep for the model's context of 12"),
        ("tree:d1=1,gamma=12,branch=1,tree_nodes=12", r"tree depth 1 <= gamma <= 11, got 12"),
        ("chain:d1=1,gamma=12,branch=2", r"tree depth 1 <= gamma <= 11, got 12"),
    ],
)
def test_trees_too_deep_for_the_context_rejected_before_compiling(method, match):
  """A 12-position context: a tree (or lookahead window) 12 or more positions deep is refused by generate."""
  model = tiny_model("huginn:tiny")
  small = dataclasses.replace(model, config=model.config.replace(max_len=12))
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=4, method=method)
  helpers.assert_rejected_before_compiling(small, args, match, NEVER)
