"""Medusa-1 heads (`loopspec_jax/heads/medusa.py`) and method='medusa' on the tree verifier: the static
pool and tree, lossless output (greedy and sampled, fixture families with randomly initialised heads and the
bundled tiny-raven-medusa), one compile per configuration, wrong targets refused before compiling, the
artefact round trip and the model card's accuracy figures."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from helpers import MAX_NEW, PROMPTS, tiny_model
import loopspec_jax as lj
from loopspec_jax import methods
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import medusa as dm
from loopspec_jax.heads import artefact
from loopspec_jax.heads import medusa as hm
from loopspec_jax.heads import medusa_train

LOOPS = [(common, "prefill_state"), (dm, "decode_loop")]


def random_heads(model, k=3, seed=1):
  return hm.make_heads(model, k, jax.random.PRNGKey(seed), scale=1.0)


def test_pool_is_the_cartesian_product_tree():
  ranks, parent, depth = dm.pool_layout(2, 3)
  assert [r.tolist() for r in ranks][0] == [[0], [1], [2]]
  assert parent.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
  assert depth.tolist() == [0, 1, 1, 1] + [2] * 9
  assert dm.pool_size(4, 4) == 340


@pytest.mark.slow  # 13 s of compiling on a quiet host
def test_tree_takes_each_heads_top_tokens_and_is_closed_under_ancestors():
  model = tiny_model("huginn:tiny", 0.05)
  heads = random_heads(model, k=3)
  feat = jax.random.normal(jax.random.PRNGKey(0), (2, model.config.hidden_size))
  build = jax.jit(dm.build_tree, static_argnames=("branch", "tree_nodes"))
  tree = build(heads.params, feat, jnp.asarray([5, 6]), branch=3, tree_nodes=10)
  top = np.asarray(jax.lax.top_k(hm.head_logits(heads.params, feat), 3)[1])  # [B, k, 3]
  assert tree.tokens.shape == (2, 11) and tree.tokens[:, 0].tolist() == [5, 6]
  for b in range(2):
    par, dep, tok = (np.asarray(x[b]) for x in (tree.parent, tree.depth, tree.tokens))
    for i in range(1, 11):
      assert par[i] < i and dep[i] == dep[par[i]] + 1
      assert tok[i] in top[b, dep[i] - 1].tolist()


@pytest.mark.parametrize(
    "spec,contraction",
    [  # the default contraction's case is slow: test_drafter_acceptance decodes greedy Medusa against AR by default
        pytest.param("huginn:tiny", None, marks=pytest.mark.slow),
        ("huginn:tiny", 0.05),
        pytest.param("ouro:tiny", None, marks=pytest.mark.slow),
    ],
)
def test_greedy_equals_ar_with_random_heads(spec, contraction):
  """Prompts of lengths 3, 7, 5 and a one-token prompt in one batch."""
  model = tiny_model(spec, contraction)
  prompts = [list(p) for p in PROMPTS] + [[9]]
  want = helpers.ar_tokens(model, prompts, MAX_NEW)
  got = lj.generate(model, prompts, max_new_tokens=MAX_NEW, method="medusa", heads=random_heads(model), tree_nodes=8)
  assert got.tokens == want, got.stats
  assert got.stats["rounds"] < sum(len(t) for t in want) and got.stats["tau"] >= 1.0


@pytest.mark.parametrize(
    "kw", [dict(temperature=1.0, top_k=20), pytest.param(dict(temperature=0.8, top_p=0.9), marks=pytest.mark.slow)]
)
def test_sampled_equals_ar_and_compiles_once(kw):
  """Four seeded calls (other prompts, lengths, request ids, seeds) compile the loop once; tokens are AR's."""
  model = tiny_model("huginn:tiny", 0.05)
  runs = helpers.sampling_runs(model, "medusa", dict(heads=random_heads(model), tree_nodes=8, **kw), LOOPS)
  assert runs["cache_sizes"] == (1, 1)
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)
  assert runs["a"].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, seed=0, **kw)
  assert runs["seed1"].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, seed=1, **kw)


def test_heads_for_another_target_are_refused_before_compiling():
  model = tiny_model("huginn:tiny", 0.05)
  args = lambda heads, **kw: dict(prompts=[[1, 2, 3]], max_new_tokens=4, method="medusa", heads=heads, **kw)
  other = tiny_model("huginn:tiny", 0.05, hidden_size=model.config.hidden_size * 2)
  helpers.assert_rejected_before_compiling(model, args(random_heads(other)), "hidden_size", LOOPS)
  same_shape = random_heads(model)
  wrong = artefact.Heads("medusa", same_shape.params, same_shape.config, dict(same_shape.target, recurrence=99))
  helpers.assert_rejected_before_compiling(model, args(wrong), r"another target \(recurrence: head 99", LOOPS)
  helpers.assert_rejected_before_compiling(model, args(None), "needs heads=", LOOPS)
  helpers.assert_rejected_before_compiling(model, args(same_shape, tree_nodes=0), "1 <= tree_nodes", LOOPS)
  helpers.assert_rejected_before_compiling(model, args(same_shape, branch=2.5), "integer branch", LOOPS)
  with pytest.raises(ValueError, match="takes no gamma"):
    lj.generate(model, [[1, 2]], max_new_tokens=4, method="medusa", heads=same_shape, gamma=3)


def test_artefact_round_trip(tmp_path):
  model = tiny_model("huginn:tiny", 0.05)
  heads = random_heads(model, k=2)
  artefact.save(str(tmp_path / "h"), heads, card="# card\n")
  back = lj.load_heads(str(tmp_path / "h"))
  assert back.kind == "medusa" and back.config == heads.config and back.target == heads.target
  for a, b in zip(jax.tree_util.tree_leaves(heads.params), jax.tree_util.tree_leaves(back.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  artefact.check_target(back, model)
  assert lj.Medusa(heads=back, tree_nodes=4).label == "medusa(tree_nodes=4)"


# ---------------------------------------------------------------------------------------------------
# The bundled tiny-raven-medusa
# ---------------------------------------------------------------------------------------------------
NAME = "tiny-raven-medusa"
bundled = pytest.mark.skipif(NAME not in lj.bundled_heads(), reason="tiny-raven-medusa not bundled")


@bundled
def test_spec_names_the_bundled_head_and_round_trips():
  m = methods.parse(f"medusa:heads={NAME},tree_nodes=16")
  assert m.spec == f"medusa:heads={NAME},tree_nodes=16" and m.label == "medusa(tree_nodes=16)"
  assert m.heads.kind == "medusa" and methods.parse(m.spec).heads.source == m.heads.source
  assert methods.parse(f"medusa:{NAME},8,2").tree_nodes == 8


@bundled
def test_bundled_card_accuracy_is_reproduced_on_held_out_windows():
  heads, model = lj.load_heads(NAME), lj.load("tiny-raven")
  with open(os.path.join(artefact.ASSETS, NAME, "eval.json")) as f:
    ev = json.load(f)
  w = medusa_train.heldout_windows(model, ev["seq_len"], ev["test_windows"])
  acc = hm.heldout_accuracy(heads, model, w)
  np.testing.assert_allclose(acc, ev["test_accuracy"], atol=1e-6)
  card = open(os.path.join(artefact.ASSETS, NAME, "MODEL_CARD.md")).read()
  assert ", ".join(f"{a:.4%}" for a in ev["test_accuracy"]) in card
  assert acc[1] > 0.1  # head 0 (the token after next) learnt something


@bundled
@pytest.mark.slow
def test_bundled_greedy_equals_ar_on_tiny_raven():
  model = lj.load("tiny-raven")
  prompts = [model.encode("ROMEO:\nWhat light"), model.encode("Question: Tom has 3 apples")]
  want = helpers.ar_tokens(model, prompts, 24)
  got = lj.generate(model, prompts, max_new_tokens=24, method="medusa", heads=lj.load_heads(NAME), tree_nodes=16)
  assert got.tokens == want, got.stats
  assert got.stats["tau"] > 1.3, got.stats
  with pytest.raises(ValueError, match="hidden_size|another target"):
    lj.generate(tiny_model("huginn:tiny"), [[1, 2]], max_new_tokens=4, method="medusa", heads=NAME)
