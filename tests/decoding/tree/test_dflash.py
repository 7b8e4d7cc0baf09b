"""DFlash (`generate(..., method='dflash', heads=..., gamma=)`, a block drafter in `heads/dflash.py`): greedy
output equals full-depth AR token for token, sampled output is exact (the drafter's own q_i verified by the
chain rule; chi-square against exact enumeration at a sample size with power >= 0.99 against any alternative
at TV 0.05), one trace per configuration, seeded and batch-independent, a drafter for another target (or of
another kind, or a bad gamma) refused before compiling, and the artefact round trip.

Fixtures: huginn:tiny / ouro:tiny with a randomly initialised drafter; an 8-token raven_llama:tiny for the
chi-square test (so a random drafter is accepted often enough, and rejected often enough).
"""

import jax
import numpy as np
import pytest

import helpers
import loopspec_jax as lj
from helpers import MAX_NEW, PROMPTS
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import dflash as dflash_decoder
from loopspec_jax.heads import artefact
from loopspec_jax.heads import dflash as F
from loopspec_jax.heads import eagle as E

FIXTURE = ("huginn:tiny", 0.05)
ENTRY_POINTS = [(common, "prefill_state"), (dflash_decoder, "decode_loop")]
VOCAB, PROMPT, N, ALPHA = 8, [1, 2, 3, 4, 5], 10_000, 1e-3  # N: power >= 0.99 at TV 0.05 over 64 cells


def random_heads(model, seed: int = 1, **kw):
  config = F.head_config(model.config, **kw)
  return artefact.Heads(
      F.KIND, F.init_params(config, jax.random.PRNGKey(seed)), config, artefact.target_signature(model)
  )


def _generate(model, heads, gamma=3, **kw):
  prompts = [list(p) for p in PROMPTS]
  return lj.generate(model, prompts, max_new_tokens=MAX_NEW, method="dflash", heads=heads, gamma=gamma, **kw)


@pytest.mark.parametrize("spec", ["huginn:tiny", pytest.param("ouro:tiny", marks=pytest.mark.slow)])
def test_greedy_matches_ar_with_a_random_drafter(spec):
  model = helpers.tiny_model(spec, 0.05)
  got = _generate(model, random_heads(model))
  assert got.tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW), got.stats
  st = got.stats
  assert st["tau"] >= 1.0 and 0.0 < st["draft_cost_share"] < 0.5 and len(st["level_acceptance"]) == 3, st


@pytest.mark.slow
def test_sampled_is_seeded_batch_independent_and_traces_once():
  model = helpers.tiny_model(*FIXTURE)
  kw = dict(temperature=1.0, top_k=20, gamma=3, heads=random_heads(model))
  runs = helpers.sampling_runs(model, "dflash", kw, ENTRY_POINTS)
  assert runs["cache_sizes"] == (1, 1)
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)


def small_target():
  return helpers.tiny_model("raven_llama:tiny", 0.05, seed=0, vocab_size=VOCAB)


@pytest.mark.slow  # ~40 s; DFlash verifies with the chain rule, which test_lossless_sampling checks by default
def test_sampled_distribution_is_exact():
  """Two tokens of N identical requests (one draft offered: acceptances with bonus draws and rejections with
  residual draws both occur) against the exact distribution of the target's processed full-depth readouts; greedy on
  the same target equals AR."""
  target = small_target()
  heads = random_heads(target, seed=3, gamma=2)
  res = lj.generate(
      target, [PROMPT] * N, max_new_tokens=2, method="dflash", heads=heads, gamma=2, temperature=1.0, seed=41
  )
  toks = np.asarray(res.tokens, np.int64)
  counts = np.zeros((VOCAB,) * 2, np.int64)
  np.add.at(counts, tuple(toks.T), 1)
  exact = helpers.exact_sequence_distribution(target, PROMPT, 2, 1.0)
  p = helpers.chi2_pvalue(counts, exact)
  print(f"  dflash sampled: p={p:.4g} alpha={res.stats['alpha']:.3f} tau={res.stats['tau']:.3f}")
  assert helpers.chi2_power(N, exact, tv=0.05, alpha=ALPHA) >= 0.99
  assert p > ALPHA, (p, res.stats)
  assert 0.1 < res.stats["alpha"] < 0.9, res.stats  # the drafter's q is accepted and rejected often
  greedy = lj.generate(target, [PROMPT, [3, 1, 4]], max_new_tokens=8, method="dflash", heads=heads, gamma=2)
  assert greedy.tokens == helpers.ar_tokens(target, [PROMPT, [3, 1, 4]], 8)


def test_drafter_for_another_target_or_kind_is_refused_before_compiling():
  huginn = helpers.tiny_model(*FIXTURE)
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=4, method="dflash", heads=random_heads(huginn))
  other = helpers.tiny_model("ouro:tiny", 0.05)
  helpers.assert_rejected_before_compiling(other, args, "trained for another target.*family", ENTRY_POINTS)
  resized = helpers.tiny_model("huginn:tiny", 0.05, recurrence=6)
  helpers.assert_rejected_before_compiling(resized, args, "recurrence: head 8, model 6", ENTRY_POINTS)
  config = E.head_config(huginn.config, "final")
  eagle = artefact.Heads(
      E.KIND, E.init_params(config, jax.random.PRNGKey(0)), config, artefact.target_signature(huginn)
  )
  helpers.assert_rejected_before_compiling(huginn, dict(args, heads=eagle), "needs an 'dflash' head", ENTRY_POINTS)
  helpers.assert_rejected_before_compiling(huginn, dict(args, gamma=0), "1 <= gamma", ENTRY_POINTS)
  helpers.assert_rejected_before_compiling(huginn, dict(args, heads=None), "needs heads=", ENTRY_POINTS)


def test_bad_drafter_configs_are_refused():
  cfg = helpers.tiny_config("huginn:tiny")
  with pytest.raises(ValueError, match="depths in"):
    F.head_config(cfg, depths=(0, 4))
  with pytest.raises(ValueError, match="1 to 4 layers"):
    F.head_config(cfg, n_layers=0)


def test_artefact_round_trip_and_spec(tmp_path):
  model = helpers.tiny_model(*FIXTURE)
  heads = random_heads(model, n_layers=1)
  artefact.save(str(tmp_path / "h"), heads, card="# card\n")
  back = lj.load_heads(str(tmp_path / "h"))
  assert back.kind == "dflash" and back.config == heads.config
  for a, b in zip(jax.tree_util.tree_leaves(heads.params), jax.tree_util.tree_leaves(back.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  m = lj.DFlash(heads=back, gamma=4)
  assert m.label == "dflash(gamma=4)" and m.spec == f"dflash:heads={tmp_path / 'h'},gamma=4"
