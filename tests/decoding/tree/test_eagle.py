"""EAGLE (`generate(..., method='eagle', heads=..., gamma=, branch=, tree_nodes=)`): greedy and sampled output
equal full-depth AR token for token (deterministic head drafts, the one tree verifier), one trace per
configuration, a head for another target (or no head) refused before compiling, the artefact round trip, and
the bundled head's model-card accuracy reproduced on a few held-out windows.

The fixture family is huginn:tiny with a randomly initialised head (both feature choices); the bundled
tiny-raven head runs in the slow tests.
"""

import json
import os

import jax
import numpy as np
import pytest

import helpers
import loopspec_jax as lj
from helpers import MAX_NEW, PROMPTS
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import eagle as eagle_decoder
from loopspec_jax.heads import artefact
from loopspec_jax.heads import eagle as E

FIXTURE = ("huginn:tiny", 0.05)
ENV = dict(gamma=3, branch=2, tree_nodes=6)
ENTRY_POINTS = [(common, "prefill_state"), (eagle_decoder, "decode_loop")]


def random_heads(model, feature: str, seed: int = 1):
  config = E.head_config(model.config, feature)
  params = E.init_params(config, jax.random.PRNGKey(seed))
  return artefact.Heads(E.KIND, params, config, artefact.target_signature(model))


def _generate(model, heads, **kw):
  prompts = [list(p) for p in PROMPTS]
  return lj.generate(model, prompts, max_new_tokens=MAX_NEW, method="eagle", heads=heads, **ENV, **kw)


@pytest.mark.parametrize("feature", ["final", pytest.param("fused", marks=pytest.mark.slow)])
def test_greedy_matches_ar_with_a_random_head(feature):
  model = helpers.tiny_model(*FIXTURE)
  want = helpers.ar_tokens(model, PROMPTS, MAX_NEW)
  got = _generate(model, random_heads(model, feature))
  assert got.tokens == want, got.stats
  pr = got.stats["per_request"]
  assert all(n == ENV["tree_nodes"] * r for n, r in zip(pr["nodes"], pr["rounds"])), pr
  assert got.stats["tau"] >= 1.0 and 0.0 < got.stats["draft_cost_share"] < 0.2, got.stats


@pytest.mark.parametrize("feature", ["final", pytest.param("fused", marks=pytest.mark.slow)])
def test_sampled_equals_ar_token_for_token_and_traces_once(feature):
  model = helpers.tiny_model(*FIXTURE)
  heads = random_heads(model, feature)
  kw = dict(temperature=1.0, top_k=20)
  runs = helpers.sampling_runs(model, "eagle", dict(ENV, heads=heads, **kw), ENTRY_POINTS)
  assert runs["cache_sizes"] == (1, 1)
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)
  for name, seed in (("a", 0), ("seed1", 1)):
    assert runs[name].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, seed=seed, **kw), name


def test_head_for_another_target_is_refused_before_compiling():
  huginn = helpers.tiny_model(*FIXTURE)
  other = helpers.tiny_model("raven_llama:tiny", 0.05)
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=4, method="eagle", heads=random_heads(huginn, "final"))
  helpers.assert_rejected_before_compiling(other, args, "trained for another target.*family", ENTRY_POINTS)
  resized = helpers.tiny_model("huginn:tiny", 0.05, recurrence=6)
  helpers.assert_rejected_before_compiling(resized, args, "recurrence: head 8, model 6", ENTRY_POINTS)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(), "needs heads="),
        (dict(heads="not-a-head"), "no head directory"),
        (dict(gamma=0), "1 <= gamma"),
        (dict(branch=2, gamma=2, tree_nodes=99), "tree_nodes <= 6"),
    ],
)
def test_bad_arguments_are_refused_before_compiling(kw, match):
  model = helpers.tiny_model(*FIXTURE)
  if "heads" not in kw and kw:
    kw = dict(kw, heads=random_heads(model, "final"))
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=4, method="eagle", **kw)
  if kw.get("heads") == "not-a-head":
    with pytest.raises(FileNotFoundError, match=match):
      lj.generate(model, **args)
    return
  helpers.assert_rejected_before_compiling(model, args, match, ENTRY_POINTS)


def test_artefact_round_trip(tmp_path):
  model = helpers.tiny_model(*FIXTURE)
  heads = random_heads(model, "fused")
  artefact.save(str(tmp_path / "h"), heads, card="# card\n")
  back = lj.load_heads(str(tmp_path / "h"))
  assert back.kind == "eagle" and back.config == heads.config
  for a, b in zip(jax.tree_util.tree_leaves(heads.params), jax.tree_util.tree_leaves(back.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---------------------------------------------------------------------------------------------------
# The bundled head on tiny-raven
# ---------------------------------------------------------------------------------------------------


def _bundled(name: str = "tiny-raven-eagle"):
  if not os.path.exists(os.path.join(artefact.ASSETS, name, artefact.HEADS_CONFIG)):
    pytest.skip(f"no bundled {name} head")
  return lj.load("tiny-raven"), lj.load_heads(name)


@pytest.mark.slow  # about 3 minutes on the loaded 2-core host (a 32-step forward of two windows, eager head)
@pytest.mark.parametrize("name", ["tiny-raven-eagle", "tiny-raven-eagle-final"])
def test_bundled_card_accuracy_is_reproduced_on_heldout_windows(name):
  """The card's per-level held-out top-1 accuracy on its first few held-out windows (eval.json "check")."""
  from loopspec_jax.train import data as D

  model, heads = _bundled(name)
  with open(os.path.join(artefact.ASSETS, name, "eval.json")) as f:
    check = json.load(f)["check"]
  windows = D.eval_windows(D.load_corpus(), check["seq_len"], check["windows"])
  cfg, hc = model.config, heads.config
  tok = jax.numpy.asarray(windows)
  n = jax.numpy.full((tok.shape[0],), tok.shape[1], jax.numpy.int32)
  hidden, states = E.target_features(model.params, tok, n, cfg, tuple(hc["depths"]))
  raw = E.raw_feature(hc, hidden, states)
  hits, counts = E.level_accuracy(heads.params, model.params, hc, tok, raw, hidden, n, len(check["top1"]), cfg)
  got = (np.asarray(hits) / np.asarray(counts)).tolist()
  np.testing.assert_allclose(got, check["top1"], atol=2e-3)
  with open(os.path.join(artefact.ASSETS, name, "MODEL_CARD.md")) as f:
    card = f.read()
  assert all(f"{100 * a:.1f}%" in card for a in check["top1"]), card


@pytest.mark.slow
@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.8, top_k=50, seed=5)], ids=["greedy", "sampled"])
def test_bundled_head_on_tiny_raven_equals_ar(kw):
  model, heads = _bundled()
  prompts = [model.encode("Question: Tom has 3 apples"), model.encode("ROMEO:\nO, speak")]
  want = lj.generate(model, prompts, max_new_tokens=24, method="ar", **kw).tokens
  got = lj.generate(model, prompts, max_new_tokens=24, method="eagle", heads=heads, **kw)
  assert got.tokens == want, got.stats
  if not kw:
    assert got.stats["tau"] > 1.5, got.stats
