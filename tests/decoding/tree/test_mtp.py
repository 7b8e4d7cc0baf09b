"""MTP drafting (`method='mtp'`, a DeepSeek-V3 MTP head on the tree verifier) and the MTP module itself: its
training loss, its artefact round trip, greedy and sampled output equal AR's, wrong heads refused."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
import loopspec_jax as lj
from helpers import MAX_NEW, PROMPTS, tiny_model
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import mtp as dm
from loopspec_jax.heads import artefact
from loopspec_jax.heads import mtp as head
from loopspec_jax.train import trainer as T

NAME = "huginn:tiny"
ENTRY = [(common, "prefill_state"), (dm, "decode_loop")]


def random_heads(model, seed=0):
  return head.make_heads(model, head.init_params(model.config, jax.random.PRNGKey(seed)), 0.3)


@pytest.mark.slow  # a grad through the looped loss: minutes on the loaded host
def test_mtp_loss_trains_the_module_and_the_backbone():
  """raven_loss with mtp_weight adds lambda * the MTP loss; its gradient reaches the module and the embedding."""
  cfg = helpers.tiny_config(NAME)
  params = dict(lj.from_config(cfg, seed=0).params, mtp=head.init_params(cfg, jax.random.PRNGKey(1)))
  tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 17), 0, cfg.vocab_size)
  obj = T.Objective(mean_recurrence=2.0, max_recurrence=2, backprop_depth=1, mtp_weight=0.3)
  (loss, m), grads = jax.value_and_grad(T.raven_loss, has_aux=True)(params, tokens, jax.random.PRNGKey(3), cfg, obj)
  assert np.isclose(float(loss), float(m["main_loss"] + 0.3 * m["mtp_loss"]), rtol=1e-5)
  assert float(jnp.abs(grads["mtp"]["proj"]).sum()) > 0 and float(jnp.abs(grads["embed"]).sum()) > 0


def test_artefact_round_trip_and_drafts_match_the_module(tmp_path):
  model = tiny_model(NAME, 0.05)
  heads = random_heads(model)
  artefact.save(str(tmp_path / "h"), heads, card="# test\n")
  back = lj.load_heads(str(tmp_path / "h"))
  assert back.kind == "mtp" and back.target == artefact.target_signature(model)
  for a, b in zip(jax.tree_util.tree_leaves(heads.params), jax.tree_util.tree_leaves(back.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # draft_tree's level 1 is the module's top-1 for (feature, root)
  cfg = model.config
  f = jax.random.normal(jax.random.PRNGKey(0), (2, cfg.hidden_size))
  root = jnp.asarray([3, 4])
  tree = dm.draft_tree(back.params, model.params, f, jnp.asarray([True, False]), root, cfg=cfg, gamma=2, branch=2)
  want = jnp.argmax(head.logits(back.params, model.params, f[:, None], root[:, None], cfg)[:, 0], -1)
  assert tree.tokens[:, 1].tolist() == want.tolist()
  assert tree.parent[0].tolist() == [0, 0, 0, 1, 1] and tree.depth[0].tolist() == [0, 1, 1, 2, 2]
  assert tree.valid.tolist() == [[True] * 5, [True] + [False] * 4]


@pytest.mark.parametrize("contraction,kw", [(None, {}), (0.05, dict(gamma=2, branch=3))])
def test_greedy_equals_ar(contraction, kw):
  model = tiny_model(NAME, contraction)
  want = helpers.generate_cached(NAME, contraction, "ar")
  prompts = [list(p) for p in PROMPTS]
  got = lj.generate(model, prompts, max_new_tokens=MAX_NEW, method="mtp", heads=random_heads(model), **kw)
  assert got.tokens == want.tokens, got.stats
  assert got.stats["method"] == "mtp"


@pytest.mark.slow  # ~20 s; test_bundled_greedy_and_sampled_equal_ar decodes sampled MTP against AR by default
def test_sampled_equals_ar_and_traces_once():
  model = tiny_model(NAME, 0.05)
  kw = dict(temperature=1.0, top_k=20, heads=random_heads(model), gamma=2, branch=2)
  runs = helpers.sampling_runs(model, "mtp", kw, ENTRY)
  assert runs["cache_sizes"] == (1, 1)
  helpers.assert_seeded_and_batch_independent(runs, model.config.vocab_size)
  kw = dict(temperature=1.0, top_k=20)
  assert runs["a"].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, seed=0, **kw)
  assert runs["seed1"].tokens == helpers.ar_tokens(model, PROMPTS, MAX_NEW, seed=1, **kw)


def test_wrong_heads_rejected_before_compiling():
  model = tiny_model(NAME, 0.05)
  other = tiny_model("raven_llama:tiny")
  heads = random_heads(model)
  args = lambda **kw: dict(prompts=[[1, 2, 3]], max_new_tokens=MAX_NEW, method="mtp", **kw)
  helpers.assert_rejected_before_compiling(model, args(), r"needs heads=", ENTRY)
  helpers.assert_rejected_before_compiling(other, args(heads=heads), r"another target \(family", ENTRY)
  medusa = dataclasses.replace(heads, kind="medusa")
  helpers.assert_rejected_before_compiling(model, args(heads=medusa), r"needs an 'mtp' head", ENTRY)
  helpers.assert_rejected_before_compiling(model, args(heads=heads, gamma=0), r"1 <= gamma", ENTRY)
  helpers.assert_rejected_before_compiling(model, args(heads=heads, branch=2.5), r"integer branch", ENTRY)


# ---------------------------------------------------------------------------------------------------
# The bundled MTP model (tiny-raven-mtp)
# ---------------------------------------------------------------------------------------------------
BUNDLED = "tiny-raven-mtp"
needs_bundled = pytest.mark.skipif(BUNDLED not in artefact.bundled_heads(), reason="no bundled tiny-raven-mtp head")


@pytest.mark.slow
@needs_bundled
def test_bundled_greedy_and_sampled_equal_ar():
  model, heads = lj.load(BUNDLED), lj.load_heads(BUNDLED)
  prompts = [model.tokenizer.encode(t).ids for t in ("ROMEO:\nI will", "Question: Tom has 3 apples and")]
  want = helpers.ar_tokens(model, prompts, 24)
  got = lj.generate(model, prompts, max_new_tokens=24, method="mtp", heads=heads)
  assert got.tokens == want and got.stats["tau"] > 1.2, got.stats
  kw = dict(temperature=1.0, top_p=0.9, seed=3)
  got = lj.generate(model, prompts, max_new_tokens=24, method="mtp", heads=heads, gamma=2, branch=2, **kw)
  assert got.tokens == helpers.ar_tokens(model, prompts, 24, **kw)


@pytest.mark.slow
@needs_bundled
def test_bundled_card_figures_reproduce_on_the_first_windows():
  import json
  import os

  from loopspec_jax.train import data as D

  model, heads = lj.load(BUNDLED), lj.load_heads(BUNDLED)
  with open(os.path.join(heads.source, "eval.json")) as f:
    want = json.load(f)["first_windows"]
  ids = np.asarray(model.tokenizer.encode(D.heldout_shakespeare()).ids, np.int32)
  t = model.config.max_len
  windows = np.stack([ids[i * t : i * t + t + 1] for i in range(want["windows"])])
  got = head.evaluate(model.params, heads.params, windows, model.config)
  for k in ("main_loss", "mtp_loss", "mtp_top1", "mtp_agreement"):
    assert abs(got[k] - want[k]) < 1e-4, (k, got[k], want[k])


@needs_bundled
def test_spec_string_names_the_bundled_head():
  from loopspec_jax import methods

  m = methods.build("mtp:heads=tiny-raven-mtp,branch=2")
  assert m.heads.kind == "mtp" and m.branch == 2 and m.spec.startswith("mtp:heads=")
