"""Training: the loss goes down, kill-and-resume is bit-exact (params and data order), export loads back."""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import loopspec_jax
from loopspec_configs import models as model_configs
from loopspec_configs.train import smoke
from loopspec_jax.models import looped as M
from loopspec_jax.train import data as D
from loopspec_jax.train import trainer as T


@pytest.fixture(scope="module")
def corpus():
  c = smoke.get_config()
  return D.load_corpus(c.data.cache_dir, c.data.vocab_size, c.data.stdlib_max_bytes)


def _config(workdir, **kw):
  c = smoke.get_config()
  c.workdir = str(workdir)
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def test_corpus_excludes_heldout_and_eval_sets(corpus):
  held = D.heldout_shakespeare()
  train = D.train_shakespeare()
  assert len(held) > 10_000 and train + held == open(os.path.join(D.DATA_DIR, "tinyshakespeare", "input.txt")).read()
  assert corpus.tokenizer.token_to_id(D.EOT) == corpus.eot_id == 0
  text = "To be, or not to be: that is the question.\ndef f(x):\n    return x + 1\n"
  assert corpus.tokenizer.decode(corpus.encode(text).tolist()) == text
  assert corpus.tokenizer.get_vocab_size() == 2048


def test_batches_depend_only_on_seed_and_step(corpus, tmp_path):
  a = T.Trainer(_config(tmp_path / "a"), corpus=corpus)
  b = T.Trainer(_config(tmp_path / "b"), corpus=corpus)
  np.testing.assert_array_equal(a.batch(7), b.batch(7))
  assert a.batch(7).shape == (4, 33)
  assert not np.array_equal(a.batch(7), a.batch(8))
  c = T.Trainer(_config(tmp_path / "c", seed=1), corpus=corpus)
  assert not np.array_equal(a.batch(7), c.batch(7))


def test_sample_depth_distribution():
  obj = T.Objective(mean_recurrence=8.0, sigma=0.5, max_recurrence=32)
  r = jax.jit(jax.vmap(lambda k: T.sample_depth(k, obj)))(jax.random.split(jax.random.PRNGKey(0), 4000))
  r = np.asarray(r)
  assert r.min() >= 1 and r.max() <= 32
  assert 7.0 < r.mean() < 9.0


def test_ouro_loss_is_mean_over_depths():
  cfg = model_configs.model_config("ouro:tiny")
  params = M.init_params(cfg, jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 9), 0, cfg.vocab_size)
  loss, _ = jax.jit(T.ouro_loss, static_argnums=(3, 4))(params, tokens, None, cfg, T.Objective(kind="ouro"))
  logits = T._forward(params, tokens[:, :-1], jnp.array([8, 8]), tuple(range(1, 5)), cfg)
  want = np.mean([T._xent(lg, tokens[:, 1:]) for lg in logits])
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)


def test_train_decreases_loss_and_exports(corpus, tmp_path):
  tr = T.Trainer(_config(tmp_path / "run", steps=30, save_every=100), corpus=corpus)
  before = T.evaluate(tr.init_state()["params"], tr.eval_windows(2), tr.config.card_depths, tr.cfg)
  state = tr.train(progress=False)
  tr.close()
  losses = [m["loss"] for _, m in tr.history]
  assert len(losses) == 30 and all(np.isfinite(losses))
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
  out = tmp_path / "export"
  ev = tr.export(state, str(out), command="pytest")
  assert ev["loss"][-1] < before["loss"][-1] - 0.5
  assert os.path.exists(out / "MODEL_CARD.md") and os.path.exists(out / "tokenizer.json")
  model = loopspec_jax.load(str(out))
  assert model.config == tr.cfg
  chex.assert_trees_all_equal(jax.device_get(model.params), jax.device_get(state["params"]))
  text = "ROMEO: What light"
  ids = model.encode(text)
  assert model.decode(ids) == text and max(ids) < model.config.vocab_size


def test_kill_and_resume_is_exact(corpus, tmp_path):
  n, k = 6, 3  # steps=30 (the schedule) as in the test above, so the compiled step is reused
  one = T.Trainer(_config(tmp_path / "one", steps=30, save_every=2), corpus=corpus)
  full = one.train(stop_at=n, progress=False)
  one.close()
  first = T.Trainer(_config(tmp_path / "two", steps=30, save_every=2), corpus=corpus)
  first.train(stop_at=k, progress=False)  # saves at step k, then the "process" goes away
  first.close()
  del first
  second = T.Trainer(_config(tmp_path / "two", steps=30, save_every=2), corpus=corpus)
  assert second.manager.latest_step() == k
  resumed = second.train(stop_at=n, progress=False)
  second.close()
  assert [s for s, _ in second.history] == list(range(k, n))
  for (s1, m1), (s2, m2) in zip(one.history[k:], second.history):  # same batches, same depths, same losses
    assert s1 == s2 and m1["depth"] == m2["depth"] and m1["loss"] == m2["loss"]
  assert int(resumed["step"]) == n
  chex.assert_trees_all_equal(jax.device_get(full["params"]), jax.device_get(resumed["params"]))
  chex.assert_trees_all_equal(jax.device_get(full["opt_state"]), jax.device_get(resumed["opt_state"]))
