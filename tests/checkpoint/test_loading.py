"""Checkpoint I/O: HF directories (config.json + safetensors, single or sharded) of all four families, family
detection and override, every kind of mismatch as a CheckpointError naming it, tokenizers, orbax round trips."""

import functools
import json
import os
import re
import shutil
import tempfile

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from safetensors.numpy import load_file, save_file

import loopspec_jax
from helpers import FIXTURES, tiny_config as _spec_config
from loopspec_jax.checkpoint import hf as hf_checkpoint
from loopspec_jax.models import looped as M
from loopspec_jax.checkpoint.hf import CheckpointError

TINY = {
    "huginn": "huginn:tiny",
    "ouro": "ouro:tiny",
    "raven-llama": "raven_llama:tiny",
    "raven-olmo": "raven_olmo:tiny",
}


def tiny_config(family, **overrides):
  return _spec_config(TINY[family], **overrides)


@functools.lru_cache(maxsize=None)
def numpy_params(cfg):
  """Random float32 numpy parameters of a config (no jax compiles: the loading tests only move bytes)."""
  rng = np.random.default_rng(abs(hash(cfg.family)) % 2**32)
  return jax.tree_util.tree_map(
      lambda s: rng.standard_normal(s).astype(np.float32), M.param_shapes(cfg), is_leaf=M._is_shape
  )


def write_checkpoint(path, family, shards=1, **overrides):
  cfg = tiny_config(family, **overrides)
  params = numpy_params(cfg)
  hf_checkpoint.write_hf(str(path), cfg, params, shards=shards)
  return cfg, params


def rewrite_tensors(path, edit):
  """Applies edit(dict of tensors) to the single model.safetensors of `path`."""
  fn = os.path.join(str(path), "model.safetensors")
  tensors = dict(load_file(fn))
  edit(tensors)
  save_file(tensors, fn)


def edit_config(path, edit):
  fn = os.path.join(str(path), "config.json")
  with open(fn) as f:
    cfg = json.load(f)
  edit(cfg)
  with open(fn, "w") as f:
    json.dump(cfg, f)


def tiny_tokenizer(vocab_size):
  """A WordLevel tokenizer over the words w0 .. w{V-2} plus [UNK], split on whitespace."""
  from tokenizers import Tokenizer, models, pre_tokenizers

  vocab = {f"w{i}": i for i in range(vocab_size - 1)}
  vocab["[UNK]"] = vocab_size - 1
  tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  return tok


class TmpDirTestCase(chex.TestCase):
  """chex.TestCase with a temporary directory helper that works under plain pytest (absl's create_tempdir
  needs parsed absl flags)."""

  def tmpdir(self):
    path = tempfile.mkdtemp(prefix="loopspec_test_")
    self.addCleanup(shutil.rmtree, path, ignore_errors=True)
    return path


class HFRoundTripTest(TmpDirTestCase):

  @parameterized.parameters(
      ("huginn", 1), ("ouro", 1), ("raven-llama", 1), ("raven-olmo", 1), ("huginn", 3), ("raven-llama", 3)
  )
  def test_write_then_load(self, family, shards):
    path = self.tmpdir()
    cfg, params = write_checkpoint(path, family, shards=shards)
    with open(os.path.join(path, "config.json")) as f:
      model_type = json.load(f)["model_type"]
    # The three Raven variants all say huginn_raven: the block style is detected from the tensor names.
    self.assertEqual(model_type, "ouro" if family == "ouro" else "huginn_raven")
    if shards > 1:
      with open(os.path.join(path, "model.safetensors.index.json")) as f:
        index = json.load(f)
      self.assertLen(set(index["weight_map"].values()), shards)
      self.assertFalse(os.path.exists(os.path.join(path, "model.safetensors")))
    model = loopspec_jax.load(path)
    self.assertEqual(model.family, family)
    self.assertEqual(model.config, cfg)
    self.assertIsNone(model.tokenizer)
    chex.assert_trees_all_equal(jax.device_get(model.params), params)

  def test_fixture_families_detected(self):
    self.assertEqual(loopspec_jax.load(os.path.join(FIXTURES, "huginn_tiny")).family, "huginn")
    self.assertEqual(loopspec_jax.load(os.path.join(FIXTURES, "ouro_tiny")).family, "ouro")

  def test_ouro_with_exit_gate_round_trips(self):
    path = self.tmpdir()
    cfg, params = write_checkpoint(path, "ouro", has_exit_gate=True)
    model = loopspec_jax.load(path)
    self.assertTrue(model.config.has_exit_gate)
    chex.assert_trees_all_equal(jax.device_get(model.params), params)

  def test_load_as_bfloat16(self):
    path = self.tmpdir()
    _, params = write_checkpoint(path, "raven-llama")
    model = loopspec_jax.load(path, dtype="bfloat16")
    self.assertEqual(model.config.dtype, "bfloat16")
    self.assertTrue(all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(model.params)))
    chex.assert_trees_all_close(
        jax.device_get(model.params["embed"]).astype(np.float32), params["embed"], rtol=1e-2, atol=1e-2
    )


class FamilyOverrideTest(TmpDirTestCase):

  def test_forcing_the_right_family(self):
    path = self.tmpdir()
    cfg, params = write_checkpoint(path, "raven-llama")
    model = loopspec_jax.load(path, family="raven-llama")
    self.assertEqual(model.config, cfg)
    chex.assert_trees_all_equal(jax.device_get(model.params), params)

  @parameterized.parameters(
      ("raven-llama", "huginn", r"missing tensor 'transformer\.[^']*(norm_3\.weight|qk_bias)'"),
      ("raven-llama", "raven-olmo", r"missing tensor 'transformer\.[^']*attn\.[qk]_norm\.weight'"),
      ("raven-olmo", "raven-llama", r"unexpected tensor 'transformer\.[^']*attn\.[qk]_norm\.weight'"),
      ("huginn", "raven-llama", r"unexpected tensor 'transformer\.[^']*(norm_[34]\.weight|qk_bias)'"),
  )
  def test_forcing_a_wrong_family_names_a_tensor(self, written, forced, match):
    path = self.tmpdir()
    write_checkpoint(path, written)
    with pytest.raises(CheckpointError, match=match):
      loopspec_jax.load(path, family=forced)

  def test_forcing_an_unknown_family(self):
    path = self.tmpdir()
    write_checkpoint(path, "huginn")
    with pytest.raises(CheckpointError, match="unknown family 'gpt2'"):
      loopspec_jax.load(path, family="gpt2")


class CheckpointErrorTest(TmpDirTestCase):

  def test_missing_tensor(self):
    path = self.tmpdir()
    write_checkpoint(path, "raven-olmo")
    name = "transformer.core_block.1.mlp.proj.weight"
    rewrite_tensors(path, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=rf"missing tensor '{name}'"):
      loopspec_jax.load(path)

  def test_missing_tensor_in_a_shard(self):
    path = self.tmpdir()
    write_checkpoint(path, "ouro", shards=3)
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
      index = json.load(f)
    name = "model.layers.1.self_attn.k_proj.weight"
    shard = os.path.join(path, index["weight_map"][name])
    tensors = dict(load_file(shard))
    del tensors[name]
    save_file(tensors, shard)
    del index["weight_map"][name]
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump(index, f)
    with pytest.raises(CheckpointError, match=rf"missing tensor '{name}'"):
      loopspec_jax.load(path)

  def test_unexpected_tensor(self):
    path = self.tmpdir()
    write_checkpoint(path, "ouro")
    rewrite_tensors(path, lambda t: t.update({"model.layers.0.self_attn.q_norm.weight": np.ones(8, np.float32)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.q_norm\.weight'"):
      loopspec_jax.load(path)

  def test_wrong_shape(self):
    path = self.tmpdir()
    cfg, _ = write_checkpoint(path, "huginn")
    name = "transformer.prelude.0.attn.Wqkv.weight"
    rewrite_tensors(path, lambda t: t.update({name: t[name][:-8]}))
    e = cfg.hidden_size
    with pytest.raises(
        CheckpointError, match=rf"tensor '{name}' has shape \({3 * e - 8}, {e}\), " rf"expected \({3 * e}, {e}\)"
    ):
      loopspec_jax.load(path)

  @parameterized.parameters(
      ("huginn", "transformer.prelude.0.attn.Wqkv.weight", lambda x: x.T),  # transposed matrix
      ("ouro", "model.layers.0.mlp.down_proj.weight", lambda x: x.T),
      ("raven-llama", "transformer.core_block.1.mlp.fc.weight", lambda x: x.reshape(x.shape[1], -1)),
      ("huginn", "transformer.coda.0.attn.qk_bias", lambda x: x.reshape(x.shape[0], x.shape[2], -1)),
      ("raven-olmo", "transformer.prelude.0.attn.q_norm.weight", lambda x: x.reshape(2, -1)),
  )
  def test_equal_size_wrong_shape(self, family, name, edit):
    """A tensor of the right element count in the wrong shape (e.g. transposed) is not silently reshaped."""
    path = self.tmpdir()
    write_checkpoint(path, family)
    holder = {}

    def rewrite(t):
      holder["want"], t[name] = t[name].shape, np.ascontiguousarray(edit(t[name]))
      holder["got"] = t[name].shape
      assert t[name].size == int(np.prod(holder["want"])) and holder["got"] != holder["want"]

    rewrite_tensors(path, rewrite)
    with pytest.raises(
        CheckpointError,
        match=rf"tensor '{re.escape(name)}' has shape "
        rf"{re.escape(str(holder['got']))}, expected "
        rf"{re.escape(str(holder['want']))}",
    ):
      loopspec_jax.load(path)

  @parameterized.parameters(
      ("huginn", "n_embd"),
      ("raven-llama", "n_layers_in_recurrent_block"),
      ("ouro", "hidden_size"),
      ("ouro", "total_ut_steps"),
  )
  def test_missing_config_key(self, family, key):
    path = self.tmpdir()
    write_checkpoint(path, family)
    edit_config(path, lambda c: c.pop(key))
    with pytest.raises(CheckpointError, match=rf"missing the key '{key}'"):
      loopspec_jax.load(path)

  def test_unknown_family(self):
    path = self.tmpdir()
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 8}, f)
    save_file(
        {"h.0.attn.c_attn.weight": np.zeros((8, 24), np.float32), "wte.weight": np.zeros((4, 8), np.float32)},
        os.path.join(path, "model.safetensors"),
    )
    with pytest.raises(CheckpointError, match=r"unknown family: model_type='gpt2'"):
      loopspec_jax.load(path)

  def test_no_weights_and_no_config(self):
    path = self.tmpdir()
    with pytest.raises(CheckpointError, match="no config.json"):
      loopspec_jax.load(path)
    write_checkpoint(path, "ouro")
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(CheckpointError, match="neither model.safetensors nor model.safetensors.index.json"):
      loopspec_jax.load(path)

  def test_not_a_directory(self):
    with pytest.raises(FileNotFoundError, match="no checkpoint directory or bundled model"):
      loopspec_jax.load(os.path.join(self.tmpdir(), "nope"))


class TokenizerAndOrbaxTest(TmpDirTestCase):

  def test_tokenizer_present_or_absent(self):
    from tokenizers import Tokenizer

    path = self.tmpdir()
    cfg, _ = write_checkpoint(path, "raven-llama")
    self.assertIsNone(loopspec_jax.load(path).tokenizer)
    tiny_tokenizer(cfg.vocab_size).save(os.path.join(path, "tokenizer.json"))
    model = loopspec_jax.load(path)
    self.assertIsInstance(model.tokenizer, Tokenizer)
    self.assertEqual(model.encode("w1 w5 w2"), [1, 5, 2])
    self.assertEqual(model.decode([1, 5, 2]), "w1 w5 w2")

  def test_no_tokenizer_errors(self):
    model = loopspec_jax.LoopedModel(tiny_config("ouro"), numpy_params(tiny_config("ouro")))
    with pytest.raises(ValueError, match="no tokenizer"):
      model.encode("hello")

  def test_orbax_round_trip_is_bit_exact_and_keeps_the_tokenizer(self):
    src = self.tmpdir()
    cfg, _ = write_checkpoint(src, "huginn")
    tiny_tokenizer(cfg.vocab_size).save(os.path.join(src, "tokenizer.json"))
    model = loopspec_jax.load(src)
    dst = os.path.join(self.tmpdir(), "own")
    loopspec_jax.save(model, dst)
    back = loopspec_jax.load(dst)
    self.assertEqual(back.config, model.config)
    chex.assert_trees_all_equal(back.params, model.params)
    chex.assert_trees_all_equal_dtypes(back.params, model.params)
    self.assertIsNotNone(back.tokenizer)
    self.assertEqual(back.tokenizer.encode("w3 w4").ids, [3, 4])
    # Saving again over the same directory replaces the parameters.
    loopspec_jax.save(back, dst)
    chex.assert_trees_all_equal(loopspec_jax.load(dst).params, model.params)
    with pytest.raises(ValueError, match="holds a 'huginn' model, not 'ouro'"):
      loopspec_jax.load(dst, family="ouro")
