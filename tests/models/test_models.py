"""The four families on random tiny configs: the per-(step, layer) KV cache against the cache-free forward,
bfloat16 parameters, and parameter counts of the real configs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

import helpers
from loopspec_jax.decoding import autoregressive as ar
from loopspec_jax.models import layers
from loopspec_jax.models import looped as M

# tiny_ouro: GQA 4/2; tiny_raven_llama: GQA 4/2 + llama3 RoPE scaling; tiny_raven_olmo: q/k norm;
# tiny_huginn: interleaved RoPE, qk_bias, tied head, ln_f before the coda.
TINY = ("huginn:tiny", "ouro:tiny", "raven_llama:tiny", "raven_olmo:tiny")
REAL = ("ouro:1p4b", "ouro:2p6b", "huginn:0125", "raven_llama:3p2_1b", "raven_olmo:2_1b", "raven_llama:tinyllama")
# incremental_readouts unrolls (T - split) positions x R depths, and its compile time grows with the product;
# three recurrence steps still exercise step-distinct core slots and one coda cache per readout depth, while
# the fixture tests cover the full depths of real-format checkpoints.
TEST_RECURRENCE = 3
SEQ_LEN, SPLIT = 7, 5  # prefill 5 positions, then decode 2 (the second attends to the first's decoded entries)


load_config = helpers.tiny_config


def tiny_model(name):
  return helpers.tiny_model(name, recurrence=TEST_RECURRENCE)


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
    self.assertEqual(cfg.family, name.split(":")[0].replace("_", "-"))
    if name in ("ouro:tiny", "raven_llama:tiny"):
      self.assertLess(cfg.num_kv_heads, cfg.num_heads)  # GQA
    if name == "raven_llama:tiny":
      self.assertIsNotNone(cfg.rope_llama3)
    if name == "raven_olmo:tiny":
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
    model = tiny_model("raven_llama:tiny")
    cfg = model.config
    tokens = tokens_for(cfg)
    lengths = jnp.array([SEQ_LEN, 4], jnp.int32)
    depths = (1, cfg.recurrence)
    padded = tokens.at[1, 4:].set(0)
    a = _forward_depths(model.params, tokens, lengths, depths, cfg)
    b = _forward_depths(model.params, padded, lengths, depths, cfg)
    chex.assert_trees_all_close(a[:, 1, :4], b[:, 1, :4], atol=1e-5, rtol=0)
    chex.assert_trees_all_close(a[:, 0], b[:, 0], atol=1e-5, rtol=0)


class RopeTest(chex.TestCase):

  @parameterized.parameters(*TINY)
  def test_rope_rotates_by_absolute_position(self, name):
    """apply_rope against a numpy rotation by pos * theta^(-2i/D): identity at position 0, so a uniform
    position shift (invisible to every relative-position check above) fails here."""
    cfg = load_config(name)
    d = cfg.head_dim
    x = np.random.default_rng(0).normal(size=(2, 5, 3, d)).astype(np.float32)  # [B, S, heads, D]
    pos = np.array([[0, 1, 2, 7, 30], [0, 5, 9, 11, 63]], np.int32)
    got = np.asarray(layers.apply_rope(jnp.asarray(x), jnp.asarray(pos), cfg))
    np.testing.assert_allclose(got[:, 0], x[:, 0], atol=1e-6)
    inv = np.asarray(layers.rope_inv_freq(cfg), np.float64)
    if cfg.rope_llama3 is None:
      np.testing.assert_allclose(inv, cfg.rope_theta ** (-np.arange(0, d, 2) / d), rtol=1e-5)
    ang = pos[..., None, None].astype(np.float64) * inv  # [B, S, 1, D/2]
    if cfg.rope_interleaved:
      a, b = x[..., 0::2], x[..., 1::2]
      want = np.stack([a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)], -1).reshape(x.shape)
    else:
      a, b = x[..., : d // 2], x[..., d // 2 :]
      want = np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], -1)
    np.testing.assert_allclose(got, want, atol=2e-5)


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

  @parameterized.parameters(("ouro:1p4b", 1.435e9), ("huginn:0125", 3.56e9))
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
    per_layer = (counts["ouro:2p6b"] - counts["ouro:1p4b"]) / 24
    cfg = load_config("ouro:1p4b")
    e, i = cfg.hidden_size, cfg.intermediate_size
    self.assertEqual(per_layer, 4 * e * e + 3 * e * i + 4 * e)

  def test_tied_head_counted_once(self):
    cfg = load_config("huginn:tiny")
    untied = cfg.replace(tie_embeddings=False)
    self.assertEqual(M.count_params(untied) - M.count_params(cfg), cfg.vocab_size * cfg.hidden_size)
