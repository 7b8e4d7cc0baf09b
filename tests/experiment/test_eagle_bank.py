"""loopspec_jax/experiment/eagle_bank.py (train_eagle's recipe) on the fixture family huginn:tiny: the feature
bank's shapes, a two-step training run's artefact and figures, and held-out accuracy per level."""

import json
import types

import numpy as np
import pytest

import helpers
from loopspec_jax.experiment import eagle_bank
from loopspec_jax.heads import artefact
from loopspec_jax.heads import eagle as E


@pytest.mark.slow  # 53 s on the loaded 2-core host (the feature pass, the loss and the accuracy compile)
def test_record_train_and_heldout_accuracy(tmp_path):
  model = helpers.tiny_model("huginn:tiny", 0.05)
  cfg = model.config
  rng = np.random.default_rng(0)
  windows = rng.integers(0, cfg.vocab_size, (3, 12)).astype(np.int32)
  depths = E.head_config(cfg, "fused")["depths"]
  hidden, states = eagle_bank.record(model, windows, depths, chunk=2)
  assert hidden.shape == (3, 12, cfg.hidden_size) and states.shape == (3, 12, 3 * cfg.hidden_size)
  bank = (windows, hidden, states)
  args = types.SimpleNamespace(
      out=str(tmp_path), steps=2, batch=2, crop=8, lr=1e-3, unroll=2, levels=2, seed=0, data_seed=27
  )
  fig = eagle_bank.train_one(model, "final", bank, bank, args)
  assert fig["steps"] == 2 and fig["crop"] == 8 and fig["train_windows"] == 3 and len(fig["heldout_top1"]) == 2
  assert all(0.0 <= a <= 1.0 for a in fig["heldout_top1"])
  assert json.loads((tmp_path / "final" / "train.json").read_text()) == fig
  heads = artefact.load(str(tmp_path / "final"))
  again = eagle_bank.heldout_accuracy(model, heads.params, heads.config, bank, levels=2)
  np.testing.assert_allclose(again, fig["heldout_top1"])
