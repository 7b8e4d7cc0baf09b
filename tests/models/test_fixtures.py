"""The port against the reference implementations: tiny real-format checkpoints and their float64 oracles.

tests/fixtures/{huginn_tiny,ouro_tiny} hold model.safetensors + config.json (real key and tensor names) and
oracle.npz computed by the public reference code (see tests/fixtures/PROVENANCE.md).
"""

import chex
import numpy as np
from absl.testing import parameterized

import loopspec_jax
from helpers import fixture

ATOL = 1e-4  # float32 vs the float64 oracle, on logits


class FixtureTest(chex.TestCase):

  @parameterized.parameters(("huginn_tiny", "huginn", 8), ("ouro_tiny", "ouro", 4))
  def test_loads_with_family_and_depth(self, name, family, depth):
    model, oracle = fixture(name)
    self.assertEqual(model.family, family)
    self.assertEqual(model.recurrence, depth)
    self.assertEqual(int(oracle["num_steps"]), depth)

  @parameterized.parameters("huginn_tiny", "ouro_tiny")
  def test_readouts_match_oracle_at_every_depth(self, name):
    model, oracle = fixture(name)
    got = loopspec_jax.readouts(model, oracle["input_ids"])
    want = oracle["readout_logits"]
    self.assertEqual(got.shape, want.shape)
    for r in range(want.shape[0]):  # one assertion per depth, so a failure names the depth
      chex.assert_trees_all_close(got[r], want[r], atol=ATOL, rtol=0, custom_message=f"{name} depth {r + 1}")

  def test_readouts_subset_of_depths(self):
    model, oracle = fixture("huginn_tiny")
    got = loopspec_jax.readouts(model, oracle["input_ids"], depths=(2, 8))
    chex.assert_trees_all_close(got, oracle["readout_logits"][[1, 7]], atol=ATOL, rtol=0)

  def test_huginn_random_init_state(self):
    model, oracle = fixture("huginn_tiny")
    got = loopspec_jax.readouts(model, oracle["input_ids"], init_state=oracle["init_state_random"])
    want = oracle["readout_logits_random_init"]
    for r in range(want.shape[0]):
      chex.assert_trees_all_close(got[r], want[r], atol=ATOL, rtol=0, custom_message=f"random s0, depth {r + 1}")
    # The random start really changes the shallow readouts (the test is not vacuous).
    self.assertGreater(np.abs(want[0] - oracle["readout_logits"][0]).max(), 10 * ATOL)

  @parameterized.parameters("huginn_tiny", "ouro_tiny")
  def test_greedy_generation_matches_oracle(self, name):
    model, oracle = fixture(name)
    want = oracle["greedy_tokens"].tolist()
    res = loopspec_jax.generate(model, [oracle["input_ids"].tolist()], max_new_tokens=len(want))
    self.assertEqual(res.tokens, [want])
    self.assertEqual(res.stats["tokens_generated"], len(want))

  @parameterized.parameters("huginn_tiny", "ouro_tiny")
  def test_greedy_generation_in_a_mixed_length_batch(self, name):
    model, oracle = fixture(name)
    prompt = oracle["input_ids"].tolist()
    want = oracle["greedy_tokens"].tolist()
    # 15 and 5 tokens: other lengths, same 16-token prompt bucket (one compiled program for both batches).
    other_long = [int(t) for t in (np.arange(15) * 7 + 3) % model.config.vocab_size]
    other_short = prompt[:5]
    for batch, at in (([other_long, prompt], 1), ([prompt, other_short], 0)):
      res = loopspec_jax.generate(model, batch, max_new_tokens=len(want))
      self.assertEqual(
          res.tokens[at], want, msg=f"{name}: prompt at index {at} of a batch of lengths " f"{[len(p) for p in batch]}"
      )
      self.assertLen(res.tokens[1 - at], len(want))
