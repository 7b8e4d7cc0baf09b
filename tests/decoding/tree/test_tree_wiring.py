"""The tree methods everywhere the other methods are: `method="chain"` with `branch > 1` is tree
self-speculation (and `branch=1` is the chain); bad envelopes or trees too deep for the context are
refused by `generate` before anything compiles; loopspec-bench's presets and table and the sweep's rows take
them by spec (with tau, tokens per verify pass).

The tree configuration is the one tests/decoding/tree/test_tree.py runs on huginn:tiny (its compile is shared through
jax's cache when both files run).
"""

import dataclasses

import pytest

import helpers
from helpers import MAX_NEW, tiny_model
from loopspec_jax import methods
from loopspec_jax.analysis import cost
from loopspec_configs.bench import bundled as bench_configs
from loopspec_configs.cost import default as cost_configs
from loopspec_configs.models import model_config
from loopspec_configs.sweeps import bundled as sweep_configs
from loopspec_jax.decoding import chain
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import lookahead as la
from loopspec_jax.decoding.stats import DecodeStats
from loopspec_jax.decoding.tree import self_spec
from loopspec_experiments import bench
from loopspec_experiments import cost_report
from loopspec_jax.experiment import sweep_grid
from loopspec_jax.experiment import sweep_report
from loopspec_jax.experiment import sweep_stats

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


# ---------------------------------------------------------------------------------------------------
# loopspec-bench rows, the sweep's rows (no decoding: their methods and tables)
# ---------------------------------------------------------------------------------------------------
def _tree_stats(tokens=24, rounds=6, accepted=18, nodes=36) -> DecodeStats:
  settings = dict(recurrence=32, d1=2, gamma=6, branch=4, tree_nodes=32, draft_layer_calls=10, verify_layer_calls=90)
  per_request = {"tokens": [tokens], "rounds": [rounds], "accepted": [accepted], "nodes": [nodes]}
  per_request.update(first=[accepted], restart=[tokens - accepted])
  return DecodeStats("tree", settings, per_request, {"iterations": rounds, "decode_seconds": 0.5})


def test_bench_presets_and_table_have_tree_rows_with_tau():
  c = bench_configs.get_config("baselines")
  specs = {m for ms in c.methods_by_model.values() for m in methods.parse_list(list(ms))}
  assert methods.Chain(d1=2, gamma=6, branch=4, tree_nodes=32) in specs
  assert methods.Lookahead(window=5, ngram=4, guesses=5) in specs and methods.TreeSelf(1, 3, 4, 16) in specs
  quick = bench_configs.get_config("baselines_quick").methods_by_model["tiny-raven"]
  assert {"tree:d1=2,gamma=6,branch=4,tree_nodes=32", "lookahead:window=5,ngram=4,guesses=5"} <= set(quick)
  agg = _tree_stats().summary()
  assert agg["tau"] == agg["tokens_per_pass"] == 4.0 and agg["mean_accepted_length"] == 4.0
  row = dict(agg, model="tiny", task="gsm8k", sampling="greedy", method="tree(d1=2,gamma=6,branch=4,tree_nodes=32)")
  row.update(decode_seconds_median=0.5, tokens_per_second_median=48.0, wall_clock_ratio_median=1.2)
  row.update(prompt_ratio_median=1.2, prompt_ratio_min=1.1, identical_to_ar=True)
  table = bench.baselines_table([row])
  assert "tau (tokens/pass)" in table.splitlines()[0]
  assert "| tree(d1=2,gamma=6,branch=4,tree_nodes=32) | 4.00 | 0.50 |" in table, table


def test_sweep_takes_tree_rows_by_spec():
  cfg = sweep_configs.get_config("tiny_raven_baselines")
  specs = sweep_grid.method_specs(cfg, 32)
  assert specs[-2:] == [methods.TreeSelf(2, 6, 4, 32), methods.Lookahead(window=5, ngram=4, guesses=5)]
  assert sweep_grid.row_label(specs[-2]) == "tree(d1=2,gamma=6,branch=4,tree_nodes=32)"
  ar_stats = DecodeStats("ar", {"recurrence": 32}, {"tokens": [24], "restart": [24]}, {"iterations": 24})
  base = dict(model="tiny-raven", task="gsm8k", sampling="greedy")
  ar = sweep_stats.make_row(base, methods.AR(), "ar", ar_stats.summary(), [1.0], 32, None, [[1, 2]], True)
  m = specs[-2]
  tree = sweep_stats.make_row(base, m, sweep_grid.row_label(m), _tree_stats().summary(), [0.5], 32, ar, [[1, 2]], True)
  assert tree["tau"] == tree["tokens_per_round"] == 4.0 and tree["nodes_per_pass"] == 6.0, tree
  assert tree["identical_to_ar"] and tree["wall_clock_ratio"] == 2.0
  lines = sweep_report.baselines_markdown([ar, tree])
  assert any(l.startswith("| tree(d1=2,gamma=6,branch=4,tree_nodes=32) | 4.00 |") for l in lines), lines


# ---------------------------------------------------------------------------------------------------
# The cost report's projection of the tree methods
# ---------------------------------------------------------------------------------------------------
def test_cost_projection_of_tree_methods():
  """A tree method's iteration is one verify pass: it commits its measured tau; without one, tree
  self-speculation is projected at chain's tokens per round (a lower bound) and lookahead is refused."""
  cfg = model_config("huginn:0125")
  chain_round = cost.tokens_per_iteration("chain", cfg, 14.5, {"d1": 2, "gamma": 6})
  assert cost.tokens_per_iteration("tree", cfg, 14.5, {"d1": 2, "gamma": 6, "branch": 4}) == chain_round
  assert cost.tokens_per_iteration("chain", cfg, 14.5, {"d1": 2, "gamma": 6, "branch": 4}) == chain_round
  assert cost.tokens_per_iteration("lookahead", cfg, 14.5, {}, tau=2.03) == 2.03
  with pytest.raises(ValueError, match="needs a measured tau"):
    cost.tokens_per_iteration("lookahead", cfg, 14.5, {})
  settings = cost_configs.get_config("trees").model_settings["huginn_0125_trees"]
  taus = cost_report.measured_taus(settings)
  tree = methods.parse("tree:d1=2,gamma=6,branch=4,tree_nodes=32")
  tau = cost_report._tau_of(tree, taus)  # pylint: disable=protected-access
  assert tau is not None and tau > 1.0
  assert cost_report._tau_of(methods.Chain(d1=2, gamma=6, branch=4, tree_nodes=32), taus) == tau
  assert cost_report._tau_of(methods.parse("lookahead:window=5,ngram=4,guesses=5"), taus) > 1.0
  assert cost_report._tau_of(methods.parse("loopspec:d1=2,d2=8"), taus) is None
