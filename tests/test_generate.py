"""Autoregressive `generate`: batching, eos, seeded sampling, the random initial state, argument validation,
trace counts, and the `experiments/generate.py` script.

Prompts stay within one length bucket (<= 16 tokens, max_new_tokens=16: prompt bucket 16, cache 32) and batch
sizes 1 and 2, the shapes tests/models/test_fixtures.py also uses, so a joint pytest run compiles each program once.
"""

import io
import os
from contextlib import redirect_stdout
from unittest import mock

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import loopspec_jax
import helpers
from helpers import FIXTURES, fixture
from loopspec_jax.decoding import common
from loopspec_jax.decoding import autoregressive as ar

N_NEW = 16


def prompts_for(model):
  """Three prompts of different lengths (12, 5, 15 tokens), all in the 16-token bucket."""
  _, oracle = fixture("huginn_tiny" if model.family == "huginn" else "ouro_tiny")
  v = model.config.vocab_size
  return [
      oracle["input_ids"].tolist(),
      [int(t) for t in (np.arange(5) * 31 + 7) % v],
      [int(t) for t in (np.arange(15) * 13 + 2) % v],
  ]


class GreedyBatchTest(chex.TestCase):

  @parameterized.parameters("huginn_tiny", "ouro_tiny")
  def test_batch_equals_each_prompt_alone(self, name):
    model, _ = fixture(name)
    p = prompts_for(model)
    alone = [loopspec_jax.generate(model, [q], max_new_tokens=N_NEW).tokens[0] for q in p]
    for batch, idx in (([p[1], p[2]], (1, 2)), ([p[2], p[0]], (2, 0))):
      got = loopspec_jax.generate(model, batch, max_new_tokens=N_NEW).tokens
      self.assertEqual(got, [alone[i] for i in idx], msg=f"batch of prompts {idx}")
    # The prompts really lead to different continuations (the batch is not trivially uniform).
    self.assertGreater(len({tuple(a) for a in alone}), 1)

  def test_eos_stops_one_request(self):
    model, oracle = fixture("huginn_tiny")
    want = oracle["greedy_tokens"].tolist()  # 154, 152, 154, 152, ...
    eos = want[1]
    other = prompts_for(model)[1]
    free = loopspec_jax.generate(model, [other], max_new_tokens=N_NEW).tokens[0]
    self.assertNotIn(eos, free)
    res = loopspec_jax.generate(model, [oracle["input_ids"].tolist(), other], max_new_tokens=N_NEW, eos_id=eos)
    self.assertEqual(res.tokens[0], want[:2])  # stops right after emitting eos (eos included)
    self.assertEqual(res.tokens[1], free)  # the other request runs to max_new_tokens
    self.assertEqual(res.stats["tokens_generated"], 2 + N_NEW)

  def test_max_new_tokens_prefix(self):
    model, oracle = fixture("ouro_tiny")
    res = loopspec_jax.generate(model, [oracle["input_ids"].tolist()], max_new_tokens=5)
    self.assertEqual(res.tokens[0], oracle["greedy_tokens"][:5].tolist())


class SamplingTest(chex.TestCase):

  def _sample(self, prompts, seed, request_ids, **kw):
    model, _ = fixture("huginn_tiny")
    kw = dict(dict(temperature=1.5, top_p=0.95), **kw)
    return loopspec_jax.generate(model, prompts, max_new_tokens=N_NEW, seed=seed, request_ids=request_ids, **kw).tokens

  def test_seeded_sampling_is_reproducible_and_batch_independent(self):
    model, _ = fixture("huginn_tiny")
    p = prompts_for(model)
    a = self._sample([p[0], p[1]], seed=3, request_ids=[0, 1])
    self.assertEqual(a, self._sample([p[0], p[1]], seed=3, request_ids=[0, 1]))
    # A request's tokens depend on (seed, request id, position) only: not on its batch, slot or neighbours.
    self.assertEqual(self._sample([p[1]], seed=3, request_ids=[1])[0], a[1])
    b = self._sample([p[2], p[0]], seed=3, request_ids=[7, 0])
    self.assertEqual(b[1], a[0])
    # Sampling is not greedy in disguise: another seed (or request id) changes the draw.
    greedy = loopspec_jax.generate(model, [p[0]], max_new_tokens=N_NEW).tokens[0]
    other_seed = self._sample([p[0], p[1]], seed=4, request_ids=[0, 1])
    self.assertTrue(a[0] != greedy or other_seed[0] != greedy)
    self.assertNotEqual(other_seed, a)

  def test_top_k_one_is_greedy(self):
    model, oracle = fixture("huginn_tiny")
    got = self._sample([oracle["input_ids"].tolist()], seed=11, request_ids=[0], top_k=1)
    self.assertEqual(got[0], oracle["greedy_tokens"].tolist())


class RandomInitTest(chex.TestCase):

  def test_huginn_random_initial_state(self):
    model, oracle = fixture("huginn_tiny")
    prompt = oracle["input_ids"][:8].tolist()
    n_new = 4  # prompt + continuation = 12 tokens: the readout shapes test_fixtures.py compiles
    res = loopspec_jax.generate(model, [prompt], max_new_tokens=n_new, init_state="random", seed=5)
    again = loopspec_jax.generate(model, [prompt], max_new_tokens=n_new, init_state="random", seed=5)
    self.assertEqual(res.tokens, again.tokens)  # greedy with a keyed random s0 is reproducible
    toks = res.tokens[0]
    self.assertLen(toks, n_new)
    # The decoder draws s0 per (seed, request, position); a full-sequence forward from the same s0 must agree
    # with it: the greedy tokens are the argmax of the depth-R logits at the preceding positions.
    seq = prompt + toks
    sp = common.make_sampling_params(1, n_new, 0.0, 0, 1.0, 5, None)
    noise = common.state_noise(sp, jnp.arange(len(seq))[None], model.config)[0]
    self.assertEqual(noise.shape, (len(seq), model.config.hidden_size))
    rand = loopspec_jax.readouts(model, seq, init_state=noise)
    zero = loopspec_jax.readouts(model, seq)
    self.assertGreater(np.abs(rand[0] - zero[0]).max(), 1e-2)  # the random start changes the logits
    np.testing.assert_array_equal(rand[-1, len(prompt) - 1 : -1].argmax(-1), toks)

  def test_random_init_on_ouro_is_rejected(self):
    model, oracle = fixture("ouro_tiny")
    with pytest.raises(ValueError, match="init_state='random' applies to Raven-style models"):
      loopspec_jax.generate(model, [oracle["input_ids"].tolist()], max_new_tokens=4, init_state="random")


class ValidationTest(chex.TestCase):
  """Bad arguments fail with a clear message before anything is traced or compiled: the decode programs are
  replaced by mocks that fail the test if they are ever reached."""

  @parameterized.named_parameters(
      ("empty_prompt", dict(prompts=[[1, 2], []]), "prompt 1 is empty"),
      ("no_prompts", dict(prompts=[]), "non-empty list"),
      ("a_string", dict(prompts="hello"), "non-empty list"),
      ("too_long", dict(prompts=[list(range(60))]), "exceeds the context of 64 positions"),
      ("out_of_vocab", dict(prompts=[[1, 256]]), r"token id 256 outside the vocabulary \[0, 256\)"),
      ("negative_id", dict(prompts=[[-1, 2]]), "token id -1 outside the vocabulary"),
      ("negative_temperature", dict(temperature=-0.5), "temperature must be >= 0"),
      ("nan_temperature", dict(temperature=float("nan")), "temperature must be >= 0"),
      ("top_p_zero", dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
      ("top_p_above_one", dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
      ("top_k_negative", dict(top_k=-1), "top_k must be a non-negative integer"),
      ("bad_init_state", dict(init_state="ones"), "init_state must be 'zeros' or 'random'"),
      ("zero_new_tokens", dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
      ("eos_out_of_vocab", dict(eos_id=999), "eos_id 999 is outside the vocabulary"),
      ("unknown_method", dict(method="beam"), "unknown method 'beam'"),
      ("depths_for_ar", dict(d1=2), "method='ar' takes no d1"),
  )
  def test_rejected_before_compiling(self, kwargs, match):
    model, oracle = fixture("huginn_tiny")
    args = dict(prompts=[oracle["input_ids"].tolist()], max_new_tokens=N_NEW)
    args.update(kwargs)
    helpers.assert_rejected_before_compiling(model, args, match, [(common, "prefill_state"), (ar, "decode_loop")])

  def test_readouts_validation(self):
    model, oracle = fixture("ouro_tiny")
    with pytest.raises(ValueError, match="init_state applies to Raven-style models"):
      loopspec_jax.readouts(model, oracle["input_ids"], init_state=np.zeros((12, 64), np.float32))
    model, _ = fixture("huginn_tiny")
    with pytest.raises(ValueError, match=r"init_state must have shape \(12, 64\)"):
      loopspec_jax.readouts(model, oracle["input_ids"], init_state=np.zeros((11, 64), np.float32))
    with pytest.raises(ValueError, match="readout depth 0 must be >= 1"):
      loopspec_jax.readouts(model, oracle["input_ids"], depths=(0,))


class TraceCountTest(chex.TestCase):
  """Requests of the same batch size and length bucket reuse one compiled prefill and one decode loop.

  `common.prefill_state` / `ar.decode_loop` are jitted at import; here they are swapped (mock.patch.object, undone
  after the test) for fresh jits of the same undecorated functions wrapped in `chex.assert_max_traces(n=1)`.
  The wrapper counts Python executions of the function body, which happen only while jax traces, so a second
  trace (= a recompile) raises. The fresh jits also start with empty caches, so `_cache_size()` counts exactly
  the programs these calls compiled, independent of what other tests compiled before.
  """

  def setUp(self):
    super().setUp()
    chex.clear_trace_counter()

  def test_two_batches_share_one_trace(self):
    model, _ = fixture("ouro_tiny")  # the cheaper model to compile: the fresh jits below compile once more
    prefill, decode = helpers.fresh_jit(common.prefill_state), helpers.fresh_jit(ar.decode_loop)
    p = prompts_for(model)
    with mock.patch.object(common, "prefill_state", prefill), mock.patch.object(ar, "decode_loop", decode):
      a = loopspec_jax.generate(model, [p[0], p[1]], max_new_tokens=N_NEW)
      # Different prompts, lengths, max_new_tokens (<= the same cache bucket) and eos: all traced values.
      b = loopspec_jax.generate(model, [p[2], p[0][:3]], max_new_tokens=N_NEW - 3, eos_id=7)
      self.assertEqual(prefill._cache_size(), 1)
      self.assertEqual(decode._cache_size(), 1)
    self.assertLen(a.tokens[1], N_NEW)
    self.assertLessEqual(len(b.tokens[0]), N_NEW - 3)
    # Sanity check of the instrument: a different batch size is a new trace, which the wrapper rejects.
    with mock.patch.object(common, "prefill_state", prefill), mock.patch.object(ar, "decode_loop", decode):
      with pytest.raises(AssertionError, match="traced > 1 times"):
        loopspec_jax.generate(model, [p[0]], max_new_tokens=N_NEW)


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags loading the file
class ScriptTest(chex.TestCase):

  def test_generate_script_main(self):
    from loopspec_configs import generate as gen_config
    from loopspec_experiments import common as exp_common
    from loopspec_experiments import generate as script

    _, oracle = fixture("huginn_tiny")
    ids = ",".join(str(t) for t in oracle["input_ids"])
    argv = [
        "loopspec-generate",
        f"--config={gen_config.__file__}",
        f"--config.checkpoint={os.path.join(FIXTURES, 'huginn_tiny')}",
        f"--config.prompt_ids={ids}",
        f"--config.max_new_tokens={N_NEW}",
    ]
    out = io.StringIO()
    try:
      rest = exp_common.parse_flags(script.FLAGS, argv)  # re-parsable in one process (other tests parse too)
      with redirect_stdout(out):
        script.main(rest)
      self.assertEqual(script._CONFIG.value.max_new_tokens, N_NEW)
    finally:
      script.FLAGS.unparse_flags()
    text = out.getvalue()
    self.assertIn(f"output ids: {oracle['greedy_tokens'].tolist()}", text)
    self.assertIn("tokens/s", text)

  def test_generate_from_config_with_a_tokenizer(self):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from loopspec_configs import generate as gen_config
    from loopspec_experiments import generate as script

    model, oracle = fixture("huginn_tiny")
    vocab = {f"w{i}": i for i in range(model.config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    cfg = gen_config.get_config()
    cfg.prompt = " ".join(f"w{t}" for t in oracle["input_ids"])
    cfg.prompt_ids = ""
    cfg.max_new_tokens = N_NEW
    with redirect_stdout(io.StringIO()) as out:
      res = script.generate_from_config(cfg, model=loopspec_jax.LoopedModel(model.config, model.params, tok))
    self.assertEqual(res["tokens"], oracle["greedy_tokens"].tolist())
    self.assertEqual(res["text"], " ".join(f"w{t}" for t in oracle["greedy_tokens"]))
    self.assertIn("output: ", out.getvalue())
    cfg.prompt = ""
    with pytest.raises(ValueError, match="give a prompt"):
      script.generate_from_config(cfg, model=model)
