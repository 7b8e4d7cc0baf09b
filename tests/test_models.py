"""The four families on random tiny configs: the per-(step, layer) KV cache against the cache-free forward,
bfloat16 parameters, and parameter counts of the real configs."""
import functools
import importlib
import os
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

# Let `.venv/bin/pytest` import the package (and configs/) from a bare checkout (no install / conftest needed).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from loopspec_jax import api  # noqa: E402
from loopspec_jax import autoregressive as ar  # noqa: E402
from loopspec_jax import config as config_lib  # noqa: E402
from loopspec_jax import model as M  # noqa: E402

# tiny_ouro: GQA 4/2; tiny_raven_llama: GQA 4/2 + llama3 RoPE scaling; tiny_raven_olmo: q/k norm;
# tiny_huginn: interleaved RoPE, qk_bias, tied head, ln_f before the coda.
TINY = ("tiny_huginn", "tiny_ouro", "tiny_raven_llama", "tiny_raven_olmo")
REAL = ("ouro_1p4b", "ouro_2p6b", "huginn_0125", "raven_llama_3p2_1b", "raven_olmo_2_1b", "raven_tinyllama")
# incremental_readouts unrolls (T - split) positions x R depths, and its compile time grows with the product;
# three recurrence steps still exercise step-distinct core slots and one coda cache per readout depth, while
# the fixture tests cover the full depths of real-format checkpoints.
TEST_RECURRENCE = 3
SEQ_LEN, SPLIT = 7, 5  # prefill 5 positions, then decode 2 (the second attends to the first's decoded entries)


def load_config(name, **overrides):
  module = importlib.import_module(f"configs.models.{name}")
  cfg = config_lib.from_config_dict(module.get_config())
  return cfg.replace(**overrides) if overrides else cfg


@functools.lru_cache(maxsize=None)
def tiny_model(name):
  cfg = load_config(name, recurrence=TEST_RECURRENCE)
  return api.from_config(cfg, seed=0)


def tokens_for(cfg, batch=2, length=SEQ_LEN, seed=1):
  return jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 0, cfg.vocab_size, dtype=jnp.int32)


_forward_depths = jax.jit(M.forward_depths, static_argnames=("depths", "cfg"))


def all_depths(params, tokens, cfg):
  b, t = tokens.shape
  return _forward_depths(params, tokens, jnp.full((b,), t, jnp.int32), tuple(range(1, cfg.recurrence + 1)), cfg)


class ConfigTest(chex.TestCase):

  @parameterized.parameters(*TINY)
  def test_tiny_configs_have_the_advertised_features(self, name):
    cfg = load_config(name)
    self.assertEqual(cfg.family, name[len("tiny_"):].replace("_", "-"))
    if name in ("tiny_ouro", "tiny_raven_llama"):
      self.assertLess(cfg.num_kv_heads, cfg.num_heads)  # GQA
    if name == "tiny_raven_llama":
      self.assertIsNotNone(cfg.rope_llama3)
    if name == "tiny_raven_olmo":
      self.assertTrue(cfg.qk_norm)
    shapes = jax.tree_util.tree_map(lambda x: x.shape, tiny_model(name).params)
    want = M.param_shapes(tiny_model(name).config)
    self.assertEqual(shapes, want)


class CacheTest(chex.TestCase):

  @parameterized.parameters(*TINY)
  def test_incremental_readouts_match_full_forward(self, name):
    model = tiny_model(name)
    cfg = model.config
    tokens = tokens_for(cfg)
    self.assertFalse(bool(jnp.all(tokens[0] == tokens[1])))  # two different sequences
    inc = ar.incremental_readouts(model.params, tokens, cfg=cfg, split=SPLIT)
    ref = all_depths(model.params, tokens, cfg)
    chex.assert_shape(inc, (cfg.recurrence, 2, SEQ_LEN - SPLIT, cfg.vocab_size))
    chex.assert_trees_all_close(inc, ref[:, :, SPLIT:], atol=1e-4, rtol=0)
    # Depths really differ, so matching every depth is a real check of the per-step slots.
    self.assertGreater(float(jnp.abs(ref[0] - ref[-1]).max()), 1e-2)

  def test_forward_ignores_padding_after_length(self):
    model = tiny_model("tiny_raven_llama")
    cfg = model.config
    tokens = tokens_for(cfg)
    lengths = jnp.array([SEQ_LEN, 4], jnp.int32)
    depths = (1, cfg.recurrence)
    padded = tokens.at[1, 4:].set(0)
    a = _forward_depths(model.params, tokens, lengths, depths, cfg)
    b = _forward_depths(model.params, padded, lengths, depths, cfg)
    chex.assert_trees_all_close(a[:, 1, :4], b[:, 1, :4], atol=1e-5, rtol=0)
    chex.assert_trees_all_close(a[:, 0], b[:, 0], atol=1e-5, rtol=0)


class BFloat16Test(chex.TestCase):

  @parameterized.parameters(*TINY)
  def test_bfloat16_params_close_to_float32(self, name):
    model = tiny_model(name)
    cfg = model.config
    cfg16 = cfg.replace(dtype="bfloat16")
    params16 = M.cast_params(model.params, jnp.bfloat16)
    self.assertTrue(all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(params16)))
    tokens = tokens_for(cfg)
    ref = np.asarray(all_depths(model.params, tokens, cfg))
    got = all_depths(params16, tokens, cfg16)
    self.assertEqual(got.dtype, jnp.float32)  # logits are computed in float32 whatever the params
    got = np.asarray(got)
    chex.assert_tree_all_finite(got)
    # Loose: bfloat16 has 8 mantissa bits; the looped state accumulates rounding over R steps.
    scale = np.abs(ref).max()
    self.assertLess(np.abs(got - ref).max(), 0.15 * scale)
    self.assertLess(np.abs(got - ref).mean(), 0.05 * np.abs(ref).mean())
    self.assertGreater((got.argmax(-1) == ref.argmax(-1)).mean(), 0.8)


class ParamCountTest(chex.TestCase):

  @parameterized.parameters(("ouro_1p4b", 1.435e9), ("huginn_0125", 3.56e9))
  def test_published_sizes(self, name, published):
    n = M.count_params(load_config(name))
    print(f"{name}: {n:,} parameters ({n / 1e9:.4f}e9; published {published / 1e9:.3f}e9)")
    self.assertLess(abs(n - published) / published, 0.005)

  def test_count_all_real_configs_without_allocating(self):
    counts = {}
    for name in REAL:
      cfg = load_config(name)
      abstract = M.abstract_params(cfg)
      self.assertTrue(all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(abstract)))
      counts[name] = M.count_params(cfg)
      print(f"{name}: {counts[name]:,} parameters ({counts[name] / 1e9:.3f}e9)")
    # Ouro-2.6B is Ouro-1.4B with twice the layers.
    per_layer = (counts["ouro_2p6b"] - counts["ouro_1p4b"]) / 24
    cfg = load_config("ouro_1p4b")
    e, i = cfg.hidden_size, cfg.intermediate_size
    self.assertEqual(per_layer, 4 * e * e + 3 * e * i + 4 * e)

  def test_tied_head_counted_once(self):
    cfg = load_config("tiny_huginn")
    untied = cfg.replace(tie_embeddings=False)
    self.assertEqual(M.count_params(untied) - M.count_params(cfg), cfg.vocab_size * cfg.hidden_size)
