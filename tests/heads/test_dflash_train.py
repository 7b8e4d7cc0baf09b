"""DFlash drafter training and the bundled drafters: `loopspec-train` knows the dflash configs; a run stopped
after N steps and restarted from its orbax checkpoint ends with the same parameters and per-step losses as one
uninterrupted run (a random tiny target, a small synthetic corpus); the bundled tiny-ouro-dflash and
tiny-raven-dflash load by name, are refused for the other target before compiling, reproduce their cards'
held-out check figures (slow) and decode equal to AR (slow)."""

import json
import os

import chex
import jax
import numpy as np
import pytest

import helpers
import loopspec_jax as lj
from loopspec_configs.train import tiny_ouro_dflash
from loopspec_configs.train import tiny_raven_dflash
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import dflash as dflash_decoder
from loopspec_experiments import train as train_cli
from loopspec_jax.heads import artefact
from loopspec_jax.heads import dflash_train
from loopspec_jax.heads import head_train
from loopspec_jax.train import data as D

STEPS, STOP = 4, 2
BUNDLED = {"tiny-ouro-dflash": "tiny-ouro", "tiny-raven-dflash": "tiny-raven"}


def _config(workdir):
  c = tiny_ouro_dflash.get_config()
  c.update(dict(steps=10, batch_size=2, seq_len=16, save_every=1, log_every=100, warmup_steps=2, workdir=str(workdir)))
  c.update(dict(gamma=3, anchors=2, layers=1, export_dir=None))
  return c


def test_configs_name_their_trainer():
  for module, target in ((tiny_ouro_dflash, "tiny-ouro"), (tiny_raven_dflash, "tiny-raven")):
    c = module.get_config()
    assert c.heads_kind == "dflash" and "dflash" in train_cli.HEAD_TRAINERS and c.target == target
    assert c.export_dir == f"loopspec_jax/assets/heads/{target}-dflash"


@pytest.mark.slow  # ~14 s; resuming is the shared trainer's (test_heads_train checks it by default)
def test_training_resumes_to_the_uninterrupted_result(tmp_path):
  model = helpers.tokenized_model("ouro:tiny", 0.5)
  rng = np.random.default_rng(0)
  corpus = D.Corpus({s: rng.integers(1, 2048, 3000).astype(np.int32) for s in D.SOURCES}, model.tokenizer, "synthetic")
  make = lambda d: dflash_train.DFlashTrainer(_config(tmp_path / d), model=model, corpus=corpus)
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
  assert one.history[STOP:] == second.history  # same batches, same anchors, same losses
  assert one.history[0][1] != one.history[-1][1]
  chex.assert_trees_all_close(full["params"], resumed["params"], rtol=1e-6, atol=1e-7)
  assert int(resumed["step"]) == STEPS


def _bundled(name):
  if not os.path.exists(os.path.join(artefact.ASSETS, name, artefact.HEADS_CONFIG)):
    pytest.skip(f"no bundled {name} drafter")
  return lj.load(BUNDLED[name]), lj.load_heads(name)


def test_bundled_drafters_load_by_name_and_refuse_the_other_target():
  for name, target in BUNDLED.items():
    if name not in lj.bundled_heads():
      pytest.skip(f"no bundled {name} drafter")
    heads = lj.load_heads(name)
    assert heads.kind == "dflash" and heads.target["family"] == lj.load(target).config.family
  other = lj.load("tiny-raven")
  args = dict(prompts=[[1, 2, 3]], max_new_tokens=4, method="dflash", heads="tiny-ouro-dflash")
  entry = [(common, "prefill_state"), (dflash_decoder, "decode_loop")]
  helpers.assert_rejected_before_compiling(other, args, "trained for another target", entry)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BUNDLED))
def test_bundled_card_check_figures_are_reproduced(name):
  model, heads = _bundled(name)
  with open(os.path.join(artefact.ASSETS, name, "eval.json")) as f:
    ev = json.load(f)
  tr = dflash_train.DFlashTrainer.__new__(dflash_train.DFlashTrainer)
  tr.model, tr.cfg = model, model.config
  windows = head_train.heldout_windows(model, ev["seq_len"], ev["check"]["windows"])
  got = tr.block_accuracy(heads, windows)
  np.testing.assert_allclose(got["accepted"], ev["check"]["accepted"], atol=2e-3)
  with open(os.path.join(artefact.ASSETS, name, "MODEL_CARD.md")) as f:
    assert f"{ev['accepted']:.3f}" in f.read()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BUNDLED))
@pytest.mark.parametrize("kw", [dict(), dict(temperature=1.0, top_p=0.7, seed=5)], ids=["greedy", "sampled"])
def test_bundled_drafter_decodes(name, kw):
  model, heads = _bundled(name)
  prompts = [model.encode("Question: Tom has 3 apples"), model.encode("ROMEO:\nO, speak")]
  got = lj.generate(model, prompts, max_new_tokens=24, method="dflash", heads=heads, **kw)
  if not kw:
    assert got.tokens == lj.generate(model, prompts, max_new_tokens=24, method="ar").tokens
    assert got.stats["tau"] > 1.2, got.stats
  assert all(len(t) == 24 for t in got.tokens)
