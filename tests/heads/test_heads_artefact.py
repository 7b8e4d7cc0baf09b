"""Head artefacts (`loopspec_jax/heads/artefact.py`): save / load round trip, and a head for another target
refused with an error naming the mismatch."""

import dataclasses

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import loopspec_jax as lj
from loopspec_jax.heads import artefact


def _abstract(config):
  return {"w": jax.ShapeDtypeStruct((config["hidden"], 3), jnp.float32)}


artefact.register("toy", _abstract)


def _toy_heads(model):
  hidden = model.config.hidden_size
  params = {"w": jnp.arange(hidden * 3, dtype=jnp.float32).reshape(hidden, 3)}
  return artefact.Heads("toy", params, {"hidden": hidden}, artefact.target_signature(model))


def test_save_load_round_trip(tmp_path):
  model = helpers.tokenized_model()
  heads = _toy_heads(model)
  artefact.save(str(tmp_path / "toy"), heads, card="# toy\n")
  back = lj.load_heads(str(tmp_path / "toy"))
  assert back.kind == "toy" and back.config == heads.config and back.target == heads.target
  np.testing.assert_array_equal(np.asarray(back.params["w"]), np.asarray(heads.params["w"]))
  assert (tmp_path / "toy" / "MODEL_CARD.md").read_text() == "# toy\n"
  artefact.check_target(back, model)


@pytest.mark.parametrize("field", ["family", "hidden_size", "vocab_size", "recurrence", "tokenizer_sha256"])
def test_head_for_another_target_is_refused_naming_the_field(field):
  model = helpers.tokenized_model()
  heads = _toy_heads(model)
  other = dataclasses.replace(heads, target={**heads.target, field: "other"})
  with pytest.raises(ValueError, match=field):
    artefact.check_target(other, model)


def test_unknown_head_directory_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="no head directory"):
    lj.load_heads(str(tmp_path / "missing"))
