"""`loopspec-train` for the heads: a config per head (configs/train/tiny_raven_{medusa,eagle,mtp}.py) and
resumable training. A run stopped after N steps and restarted from its orbax checkpoint ends with the same
parameters, optimizer state and per-step losses as one uninterrupted run, at a tiny size: Medusa and EAGLE
heads on a random tiny target (tests/helpers.tokenized_model) over a small synthetic corpus, and the MTP model
(the trainer's mtp_weight) on the smoke config (slow: a grad through the loop)."""

import chex
import jax
import numpy as np
import pytest

import helpers
from loopspec_configs.train import smoke
from loopspec_configs.train import tiny_raven_eagle
from loopspec_configs.train import tiny_raven_medusa
from loopspec_configs.train import tiny_raven_mtp
from loopspec_experiments import train as train_cli
from loopspec_jax.heads import artefact
from loopspec_jax.heads import eagle_train
from loopspec_jax.heads import medusa_train
from loopspec_jax.train import data as D
from loopspec_jax.train import trainer as T

STEPS, STOP = 5, 3
HEAD_CONFIGS = {"medusa": tiny_raven_medusa, "eagle": tiny_raven_eagle}
TRAINERS = {"medusa": medusa_train.MedusaTrainer, "eagle": eagle_train.EagleTrainer}


def _target():
  return helpers.tokenized_model("huginn:tiny", 0.05)


def _corpus(model):
  rng = np.random.default_rng(0)
  tokens = {s: rng.integers(1, model.config.vocab_size, 4000).astype(np.int32) for s in D.SOURCES}
  return D.Corpus(tokens, model.tokenizer, "synthetic")


def _config(kind, workdir, **kw):
  c = HEAD_CONFIGS[kind].get_config()
  c.update(dict(steps=10, batch_size=2, seq_len=16, save_every=2, log_every=100, warmup_steps=2, workdir=str(workdir)))
  c.update(kw)
  return c


def test_every_head_has_a_train_config():
  """loopspec-train knows each head config's kind; the MTP model trains with its module (mtp_weight)."""
  for kind, module in HEAD_CONFIGS.items():
    c = module.get_config()
    assert c.heads_kind == kind and kind in train_cli.HEAD_TRAINERS and c.target == "tiny-raven"
  assert tiny_raven_eagle.get_config("fused").feature == "fused"
  with pytest.raises(ValueError, match="unknown preset"):
    tiny_raven_eagle.get_config("middle")
  mtp = tiny_raven_mtp.get_config()
  assert mtp.mtp_weight > 0 and mtp.heads_export_dir.endswith("tiny-raven-mtp") and not mtp.get("heads_kind")
  bad = tiny_raven_medusa.get_config()
  bad.heads_kind = "hydra"
  with pytest.raises(ValueError, match="knows no heads_kind 'hydra'"):
    train_cli.head_trainer(bad)


@pytest.mark.parametrize("kind", ["medusa", pytest.param("eagle", marks=pytest.mark.slow)])  # eagle: 112 s loaded
def test_head_training_resumes_to_the_uninterrupted_result(kind, tmp_path):
  model = _target()
  corpus = _corpus(model)
  make = lambda d: TRAINERS[kind](_config(kind, tmp_path / d), model=model, corpus=corpus)
  one = make("one")
  full = one.train(stop_at=STEPS)
  one.close()
  first = make("two")
  first.train(stop_at=STOP)  # checkpoints at step STOP, then the "process" goes away
  first.close()
  second = make("two")
  assert second.manager.latest_step() == STOP
  resumed = second.train(stop_at=STEPS)
  second.close()
  assert [s for s, _ in second.history] == list(range(STOP, STEPS))
  assert one.history[STOP:] == second.history  # same batches, same noise keys, same losses
  assert one.history[0][1] != one.history[-1][1]
  assert int(resumed["step"]) == STEPS
  chex.assert_trees_all_equal(jax.device_get(full["params"]), jax.device_get(resumed["params"]))
  chex.assert_trees_all_equal(jax.device_get(full["opt_state"]), jax.device_get(resumed["opt_state"]))
  heads = second.heads(resumed)
  assert heads.kind == kind and heads.target == artefact.target_signature(model)


@pytest.mark.slow  # the MTP model: a grad through the looped loss, twice 6 steps
def test_mtp_model_training_resumes_to_the_uninterrupted_result(tmp_path):
  c = smoke.get_config()
  corpus = D.load_corpus(c.data.cache_dir, c.data.vocab_size, c.data.stdlib_max_bytes)

  def make(d):
    cfg = smoke.get_config()
    cfg.update(dict(workdir=str(tmp_path / d), steps=30, save_every=2, mtp_weight=0.3))
    return T.Trainer(cfg, corpus=corpus)

  one = make("one")
  full = one.train(stop_at=6, progress=False)
  one.close()
  first = make("two")
  first.train(stop_at=3, progress=False)
  first.close()
  second = make("two")
  assert second.manager.latest_step() == 3
  resumed = second.train(stop_at=6, progress=False)
  second.close()
  assert "mtp" in full["params"]
  for (s1, m1), (s2, m2) in zip(one.history[3:], second.history):
    assert s1 == s2 and m1["loss"] == m2["loss"] and m1.get("mtp_loss") == m2.get("mtp_loss")
  chex.assert_trees_all_equal(jax.device_get(full["params"]), jax.device_get(resumed["params"]))
  chex.assert_trees_all_equal(jax.device_get(full["opt_state"]), jax.device_get(resumed["opt_state"]))
