"""Helpers shared by the test files, in one place (import with `import helpers`: pytest puts tests/ on sys.path).

The names below are stable; other test files import them:

  ROOT, FIXTURES               the repository root and tests/fixtures
  TINY_SPECS                   the tiny config of each family: "ouro:tiny", "huginn:tiny", "raven_llama:tiny",
                               "raven_olmo:tiny" (specs of `loopspec_configs.models.model_config`)
  PROMPTS, MAX_NEW             the shared 3-request batch (3, 7, 5 tokens; the (16, 32) length bucket) and budget
  EOS_PROMPTS                  the same shapes with a one-token first prompt
  eos_run(spec, contraction, method, **kw)   `method` on EOS_PROMPTS with an eos that stops the requests at
                               different times; asserts its tokens equal AR's and returns its result
  tiny_config(spec, **kw)      the ModelConfig of a spec with field overrides
  tiny_model(spec, contraction=None, seed=0, **kw)   a random LoopedModel, cached per arguments
  generate_cached(spec, contraction, method, prompts=PROMPTS, max_new=MAX_NEW, seed=0, **kw)
                               `generate` on a tiny model, cached (several tests read one run; never mutate it)
  ar_tokens(model, prompts, max_new, **kw)   the full-depth autoregressive reference continuation
  assert_rejected_before_compiling(model, args, match, entry_points)
                               generate(model, **args) raises ValueError(match) before any of the compiled
                               entry points (module, attribute name) runs
  fresh_jit(fn, max_traces=1)  a fresh jit of a jitted package function that raises on a retrace
  sampling_runs(model, method, method_kw, entry_points)   four seeded sampling calls under fresh jits that
                               raise on a retrace: "a", "again", "moved", "seed1" results and "cache_sizes"
  assert_seeded_and_batch_independent(runs)   the reproducibility checks of those four calls
  fixture(name)                (model, oracle dict) of tests/fixtures/<name> ('huginn_tiny', 'ouro_tiny'), cached
  fixture_batch(name)          (model, [oracle prompt, a shorter prompt], oracle greedy tokens)
  chi2_pvalue(counts, probs, check_support=True)     chi-square goodness of fit with small cells pooled
  chi2_power(n, probs, tv=0.05, alpha=0.01)  power of that test against ANY alternative at total variation tv
  rand_dist(rng, v, kind)      a random float32 distribution ("dense", or "sparse" with two zeros)
  greedy_argmax(model, prompt, new_tokens, depths)   per-depth argmax along a greedy continuation
  loopspec_sources(model, prompt, new_tokens, d1, d2) the commit sources greedy LoopSpec must report
  chain_counts(model, prompt, new_tokens, d1, gamma)  the (accepted drafts, rounds) greedy chain must report
  record_key_purposes()        context manager recording the purpose of every `sampling.request_key` call
  traced_key_purposes(method, model, prompts, max_new, random_init=False, **method_args)
                               the purposes requested while ONE decode loop of a method is traced
  record_sharded_calls()       records every sharded program run in this process and counts its traces and
                               compiles (8-device workers of test_sharding, test_head_padding, ...)
  write_worker_report(report, rec, c0, out_path, programs)   a mesh worker's tail: its program counts,
                               CPU seconds since c0, the report as JSON (test_{heads,tree,baselines}_mesh)

Every decoder draws its randomness through `sampling.request_key(base_key, request, position, purpose)`;
`traced_key_purposes` relies only on that contract and on `decoding.common.Decoder` (the decoder's `init` and
`loop`), so it applies unchanged to any decoder that `generate` dispatches to.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from tokenizers import Tokenizer

import loopspec_jax
from loopspec_jax import api
from loopspec_jax import methods
from loopspec_jax.checkpoint import native
from loopspec_configs.models import model_config
from loopspec_jax.decoding import common
from loopspec_jax.decoding import sampling
from loopspec_jax.models import looped
from loopspec_jax.parallel import entry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TINY_SPECS = ("ouro:tiny", "huginn:tiny", "raven_llama:tiny", "raven_olmo:tiny")

# Three requests of different lengths (3, 7, 5 tokens), all in the (16, 32) bucket with up to 24 new tokens.
PROMPTS = ((1, 2, 3), (5, 6, 7, 8, 9, 10, 11), (40, 41, 42, 43, 44))
MAX_NEW = 12
# Same batch size and bucket as PROMPTS (the same compiled programs), with a one-token prompt.
EOS_PROMPTS = ((7,), (5, 6, 7, 8, 9, 10, 11), (40, 41, 42, 43, 44))


# ---------------------------------------------------------------------------------------------------
# Models and reference decodes
# ---------------------------------------------------------------------------------------------------
def tiny_config(spec: str, **overrides):
  """The ModelConfig of `spec` (e.g. "huginn:tiny", "ouro:1p4b") with field overrides."""
  return model_config(spec, **overrides)


@functools.lru_cache(maxsize=None)
def _tiny_model(spec, contraction, seed, overrides):
  return api.from_config(tiny_config(spec, **dict(overrides)), seed=seed, contraction=contraction)


def tiny_model(spec: str, contraction=None, seed: int = 0, **overrides):
  """A randomly initialised model of `spec`, cached per arguments (contraction: see `init_params`)."""
  return _tiny_model(spec, contraction, seed, tuple(sorted(overrides.items())))


@functools.lru_cache(maxsize=None)
def _generate_cached(spec, contraction, method, prompts, max_new, seed, kw):
  model = tiny_model(spec, contraction, seed)
  return loopspec_jax.generate(model, [list(p) for p in prompts], max_new_tokens=max_new, method=method, **dict(kw))


def generate_cached(spec, contraction, method, prompts=PROMPTS, max_new=MAX_NEW, seed=0, **kw):
  """`generate` on `tiny_model(spec, contraction, seed)`, cached (the result is shared: never mutate it)."""
  prompts = tuple(tuple(int(t) for t in p) for p in prompts)
  return _generate_cached(spec, contraction, method, prompts, max_new, seed, tuple(sorted(kw.items())))


def eos_run(spec, contraction, method, **kw):
  """`method` on EOS_PROMPTS with eos_id = the 5th token of request 1's free AR continuation, so the requests
  stop at different times (asserted); its tokens must equal AR's, each cut right after its first eos."""
  free = generate_cached(spec, contraction, "ar", prompts=EOS_PROMPTS)
  eos = free.tokens[1][4]
  want = generate_cached(spec, contraction, "ar", prompts=EOS_PROMPTS, eos_id=eos)
  for full, cut in zip(free.tokens, want.tokens):
    assert cut == (full[: full.index(eos) + 1] if eos in full else full)
  assert len(set(len(t) for t in want.tokens)) > 1, want.tokens
  got = generate_cached(spec, contraction, method, prompts=EOS_PROMPTS, eos_id=eos, **kw)
  assert got.tokens == want.tokens, got.stats
  return got


def ar_tokens(model, prompts, max_new: int, **kw) -> list:
  """The full-depth autoregressive continuation (new tokens per prompt) every lossless method must reproduce."""
  return loopspec_jax.generate(model, [list(p) for p in prompts], max_new_tokens=max_new, method="ar", **kw).tokens


def assert_rejected_before_compiling(model, args: dict, match: str, entry_points) -> None:
  """`generate(model, **args)` raises ValueError matching `match`, and none of `entry_points` ((module,
  attribute name) pairs, e.g. (common, "prefill_state")) is called: validation runs before anything compiles."""
  never = mock.Mock(side_effect=AssertionError("validation let a bad request reach a compiled program"))
  with contextlib.ExitStack() as stack:
    for module, name in entry_points:
      stack.enter_context(mock.patch.object(module, name, never))
    with pytest.raises(ValueError, match=match):
      loopspec_jax.generate(model, **args)
  never.assert_not_called()


def fresh_jit(fn, max_traces: int = 1):
  """A fresh `jax.jit` of the undecorated jitted `fn` that raises when traced more than `max_traces` times.

  Its static arguments are the entry point's (`entry.static_argnames`: the keyword-only parameters). The fresh
  jit starts with an empty cache, so its `_cache_size()` counts exactly the programs compiled through it.
  """
  raw = fn.__wrapped__
  return jax.jit(chex.assert_max_traces(raw, n=max_traces), static_argnames=entry.static_argnames(raw))


def sampling_runs(model, method: str, method_kw: dict, entry_points) -> dict:
  """Four sampling calls of one configuration of `method` under fresh jits of its programs.

  entry_points: (module, attribute) of each jitted program; each is swapped (undone on exit) for
  `fresh_jit(...)`: the assert_max_traces wrapper counts Python executions of the body, which happen only while
  jax traces, so a retrace raises, and `_cache_size()` counts exactly the programs these calls compiled
  whatever other tests compiled before. The calls differ in prompts, prompt lengths, seed and request ids (all
  traced values) but share the batch size and the length bucket.
  Returns {"a", "again" (same call), "moved" (PROMPTS[0] as request id 0 at batch index 1), "seed1": results,
  "cache_sizes": tuple of compiled-program counts, one per entry point}.
  """
  chex.clear_trace_counter()
  fresh = [fresh_jit(getattr(mod, name)) for mod, name in entry_points]
  gen = lambda prompts, **kw: loopspec_jax.generate(
      model, [list(p) for p in prompts], max_new_tokens=MAX_NEW, method=method, **method_kw, **kw
  )
  other = ((9, 8, 7, 6, 5, 4), (30, 31))
  with contextlib.ExitStack() as stack:
    for (mod, name), fn in zip(entry_points, fresh):
      stack.enter_context(mock.patch.object(mod, name, fn))
    out = {
        "a": gen(PROMPTS, seed=0),
        "again": gen(PROMPTS, seed=0),
        "moved": gen((other[0], PROMPTS[0], other[1]), seed=0, request_ids=[7, 0, 9]),
        "seed1": gen(PROMPTS, seed=1),
    }
  out["cache_sizes"] = tuple(fn._cache_size() for fn in fresh)
  return out


def assert_seeded_and_batch_independent(runs: dict, vocab_size: int) -> None:
  """The same seed reproduces the tokens, a request's tokens do not depend on its batch index or neighbours,
  another seed changes them, and every request got its full budget of in-vocabulary tokens."""
  a = runs["a"]
  assert a.tokens == runs["again"].tokens
  assert runs["moved"].tokens[1] == a.tokens[0]
  assert runs["seed1"].tokens != a.tokens
  assert all(len(t) == MAX_NEW for t in a.tokens)
  assert all(0 <= t < vocab_size for toks in a.tokens for t in toks)


@functools.lru_cache(maxsize=None)
def fixture(name: str):
  """(model, oracle dict of numpy arrays) of the real-format checkpoint tests/fixtures/<name>, loaded once."""
  path = os.path.join(FIXTURES, name)
  model = loopspec_jax.load(path)
  with np.load(os.path.join(path, "oracle.npz")) as f:
    oracle = {k: f[k] for k in f.files}
  return model, oracle


def fixture_batch(name: str):
  """(model, prompts, oracle greedy tokens): the fixture's prompt plus a shorter one, for batch tests."""
  model, oracle = fixture(name)
  prompt = oracle["input_ids"].tolist()
  return model, [prompt, prompt[3:8]], oracle["greedy_tokens"].tolist()


# ---------------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------------
def _pool(exp):
  """Mask of the cells whose expected count is at least 5 (the rest are pooled into one cell)."""
  return exp >= 5


def pair_counts(t1, t2, v: int):
  """[V, V] histogram of the token pairs (t1[i], t2[i])."""
  c = np.zeros((v, v))
  np.add.at(c, (np.asarray(t1), np.asarray(t2)), 1)
  return c


def first_two_emitted(n, path, y, nxt, tokens):
  """The first two tokens a tree round emits, for a depth-2 tree: (t1, t2) given the accepted count n, the
  accepted path, the round's next token y and the following round's draw nxt (used when n = 0)."""
  t1 = jnp.where(n == 0, y, tokens[path[1]])
  t2 = jnp.where(n == 0, nxt, jnp.where(n == 1, y, tokens[path[2]]))
  return t1, t2


def chi2_pvalue(counts, probs, check_support: bool = True, zero_tol: float = 1e-12) -> float:
  """Chi-square p-value of counts vs probs (any shapes, flattened); cells expected below 5 are pooled.

  check_support: a draw of an outcome of probability <= zero_tol fails at once. Without it (negative
  controls), counts in a pooled cell the null gives no mass at all return p = 0.
  """
  counts = np.asarray(counts, np.float64).ravel()
  probs = np.asarray(probs, np.float64).ravel()
  if check_support:
    bad = np.flatnonzero((probs <= zero_tol) & (counts > 0))
    assert bad.size == 0, f"{counts[bad].sum():.0f} draws of zero-probability outcomes (flat cells {bad})"
  exp = probs / probs.sum() * counts.sum()
  big = _pool(exp)
  obs, ex = list(counts[big]), list(exp[big])
  if (~big).any():
    if exp[~big].sum() > 0:
      obs.append(counts[~big].sum())
      ex.append(exp[~big].sum())
    elif counts[~big].sum() > 0:
      return 0.0
  obs, ex = np.array(obs), np.array(ex)
  if len(obs) < 2:
    return 1.0
  return float(stats.chisquare(obs, ex * obs.sum() / ex.sum()).pvalue)


def chi2_power(n: int, probs, tv: float = 0.05, alpha: float = 0.01) -> float:
  """A lower bound on the power of `chi2_pvalue(counts of n draws, probs) < alpha` against every alternative
  at total variation >= tv from probs.

  By Cauchy-Schwarz, (2 TV)^2 = (sum |d|)^2 <= sum d^2 / probs = chi-square divergence, and pooling cells
  only merges terms, so the noncentrality n * chi2-divergence is at least n * 4 tv^2; the power is the
  noncentral chi-square tail beyond the level-alpha critical value (df: cells after pooling, minus one).
  """
  probs = np.asarray(probs, np.float64).ravel()
  big = _pool(probs / probs.sum() * n)
  df = int(big.sum()) + int((~big).any()) - 1
  crit = stats.chi2.ppf(1 - alpha, df)
  return float(stats.ncx2.sf(crit, df, n * 4 * tv**2))


def rand_dist(rng, v: int, kind: str = "dense"):
  """A random float32 distribution [v] (numpy, so no compiles); "sparse" zeroes its two smallest entries."""
  z = rng.normal(size=v) * 1.5
  p = np.exp(z - z.max())
  if kind == "sparse":
    p[np.argsort(z)[:2]] = 0.0
  return (p / p.sum()).astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# Greedy acceptance predicted from per-depth readouts
# ---------------------------------------------------------------------------------------------------
SOURCE_RESTART, SOURCE_FIRST, SOURCE_SECOND = 0, 1, 2  # the engine's encoding (stats "last_source")


def greedy_argmax(model, prompt, new_tokens, depths, margin: float = 1e-4) -> np.ndarray:
  """int [len(depths), n] argmax at each depth of the logits that predict new token i (position len(prompt)-1+i)
  along the sequence prompt + new_tokens (one full-sequence forward, `loopspec_jax.readouts`).

  Asserts every top-1/top-2 gap exceeds `margin`, so the cached incremental decode (equal to the full forward
  up to ~1e-6) cannot pick another argmax on a float near-tie.
  """
  ids = list(prompt) + list(new_tokens)
  lg = loopspec_jax.readouts(model, ids, depths=tuple(depths))
  lg = lg[:, len(prompt) - 1 : len(ids) - 1]  # [D, n, V]
  top2 = np.sort(lg, axis=-1)[..., -2:]
  gap = top2[..., 1] - top2[..., 0]
  assert gap.min() > margin, f"argmax near-tie (gap {gap.min():.2e}) at depth/position {np.argwhere(gap <= margin)}"
  return np.argmax(lg, axis=-1)


def loopspec_sources(model, prompt, new_tokens, d1: int, d2) -> dict:
  """The per-commit sources greedy LoopSpec must report for the continuation `new_tokens` (AR's).

  For the token following position p: first if argmax p_d1 == argmax p_R at p; else second if d2 is set and
  argmax p_d2 == argmax p_R; else restart (with every spawn granted, i.e. no skipped spawns). Returns
  {"first", "second", "restart": counts, "last_source": the last commit's source, "sources": list}.
  """
  r = model.config.recurrence
  depths = (d1, r) if d2 is None else (d1, d2, r)
  a = greedy_argmax(model, prompt, new_tokens, depths)
  assert a[-1].tolist() == list(new_tokens), "the depth-R readouts disagree with the AR continuation"
  src = np.where(
      a[0] == a[-1], SOURCE_FIRST, np.where((d2 is not None) & (a[1] == a[-1]), SOURCE_SECOND, SOURCE_RESTART)
  )
  return {
      "first": int((src == SOURCE_FIRST).sum()),
      "second": int((src == SOURCE_SECOND).sum()),
      "restart": int((src == SOURCE_RESTART).sum()),
      "last_source": int(src[-1]),
      "sources": src.tolist(),
  }


def chain_counts(model, prompt, new_tokens, d1: int, gamma: int) -> tuple:
  """(accepted drafts, rounds) greedy chain must report for the continuation `new_tokens` (AR's).

  A round at committed length L drafts gamma tokens at depth d1: drafts are accepted while argmax p_d1 ==
  argmax p_R along the continuation, and the round commits them plus one token, cut at the budget (a draft
  counts as accepted only if it is committed).
  """
  r = model.config.recurrence
  a = greedy_argmax(model, prompt, new_tokens, (d1, r))
  assert a[-1].tolist() == list(new_tokens), "the depth-R readouts disagree with the AR continuation"
  match = a[0] == a[-1]
  n = len(new_tokens)
  i = accepted = rounds = 0
  while i < n:
    k = 0
    while k < gamma and i + k < n and match[i + k]:
      k += 1
    rounds += 1
    accepted += k
    i += min(k + 1, n - i)
  return accepted, rounds


# ---------------------------------------------------------------------------------------------------
# Key purposes of the random draws
# ---------------------------------------------------------------------------------------------------
KeyRequest = collections.namedtuple("KeyRequest", "purpose site")


@contextlib.contextmanager
def record_key_purposes():
  """Patches `sampling.request_key` with a recording wrapper; yields the list of `KeyRequest`s it fills.

  purpose: the int purpose (or the string "traced" if a purpose is not a static value); site: the
  "file:line" of the caller, for messages. Only calls made while the context is open (and that really
  execute Python: tracing, or eager runs) are recorded.
  """
  calls = []
  real = sampling.request_key

  def wrapper(base_key, request_id, position, purpose):
    try:
      value = int(purpose)
    except (TypeError, jax.errors.ConcretizationTypeError):
      value = "traced"
    frame = traceback.extract_stack(limit=2)[0]  # the caller of request_key
    calls.append(KeyRequest(value, f"{os.path.basename(frame.filename)}:{frame.lineno}"))
    return real(base_key, request_id, position, purpose)

  with mock.patch.object(sampling, "request_key", wrapper):
    yield calls


def traced_key_purposes(method: str, model, prompts, max_new: int, random_init: bool = False, **method_args) -> list:
  """The `KeyRequest`s made while the decode loop of `method` (one iteration body) is traced, sampling on.

  The loop state is built abstractly (`jax.eval_shape`, outside the recording); the loop is traced with
  `jax.make_jaxpr` of the undecorated `Decoder.loop`, so the trace really happens whatever was compiled before.
  """
  cfg = model.config
  decoder = methods.build_checked(method, model, **method_args).make_decoder(cfg, greedy=False, random_init=random_init)
  prompts = common.validate_prompts(prompts, cfg, max_new)
  tp, total = common.buckets([len(p) for p in prompts], max_new, cfg)
  prompt_arr, len_arr = common.batch_prompts(prompts, tp)
  sp = common.make_sampling_params(len(prompts), max_new, 0.8, 0, 1.0, 0, None)

  def build(params, prompt_arr, len_arr, sp):
    cache, tokens = common.prefill_for(
        decoder, params, prompt_arr, len_arr, sp, cfg=cfg, total=total, random_init=random_init
    )
    return decoder.init(cache, tokens, len_arr, sp, **decoder.init_kw)

  state = jax.eval_shape(build, model.params, prompt_arr, len_arr, sp)
  loop = getattr(decoder.loop, "__wrapped__", decoder.loop)
  with record_key_purposes() as calls:
    jax.make_jaxpr(functools.partial(loop, **decoder.loop_kw))(model.params, state, sp)
  return calls


# ---------------------------------------------------------------------------------------------------
# Models with a tokenizer (tests of the text-level integrations: lm-eval)
# ---------------------------------------------------------------------------------------------------
def numpy_params(cfg, contraction=None, seed: int = 0):
  """Parameters of cfg at the init scales of looped.init_params, drawn with numpy (eager jax.random compiles one
  kernel per parameter shape, ~25 s for huginn:tiny on a busy 2-core machine), float32. `contraction` scales the
  recurrent state's input (Raven) or sets the core norms (Ouro), so early depths agree with the full depth."""
  rng = np.random.RandomState(seed)

  def init(path, shape):
    if "norm" in path and "qk" not in path:
      return 1.0 + 0.1 * rng.randn(*shape)
    if "qk_bias" in path or path.endswith("['b']"):
      return 0.1 * rng.randn(*shape)
    if "embed" in path:
      return rng.randn(*shape) * (1.0 / math.sqrt(cfg.hidden_size) if cfg.embed_scale != 1.0 else 0.1)
    return rng.randn(*shape) / math.sqrt(shape[-2] if len(shape) >= 2 else shape[-1])

  shapes = looped.param_shapes(cfg)
  params = jax.tree_util.tree_map_with_path(
      lambda p, s: init(jax.tree_util.keystr(p), s), shapes, is_leaf=looped._is_shape
  )
  if contraction is not None:
    if cfg.is_raven:
      params["adapter"][: cfg.hidden_size] *= contraction
    else:
      for n in ("norm_2", "norm_4"):
        params["core"][n][:] = contraction
  return jax.tree_util.tree_map(lambda x: jax.numpy.asarray(x, jax.numpy.float32), params)


@functools.lru_cache(maxsize=None)
def _tokenized_model(spec, contraction, seed, overrides):
  cfg = model_config(spec, **dict(overrides))
  params = numpy_params(cfg, contraction, seed)
  tok = Tokenizer.from_file(os.path.join(native.bundled_path("tiny-raven"), "tokenizer.json"))
  return dataclasses.replace(api.LoopedModel(cfg, params), tokenizer=tok, source=f"test:{spec}")


def tokenized_model(spec: str = "huginn:tiny", contraction=0.7, seed: int = 0, **overrides):
  """A random tiny model with the bundled tiny-raven tokenizer (vocab 2048 unless overridden), cached.

  Weights are drawn with numpy at `init_params`' scales (no eager jax.random compiles); `contraction` scales
  the recurrent state's input (Raven) or the core norms (Ouro), so early depths agree with the full depth.
  """
  overrides = {"vocab_size": 2048, **overrides}
  return _tokenized_model(spec, contraction, seed, tuple(sorted(overrides.items())))


# ---------------------------------------------------------------------------------------------------
# Speculative baselines (draft model, prompt lookup): exact sequence distributions of any model
# ---------------------------------------------------------------------------------------------------
def exact_sequence_distribution(model, prompt, n_tokens: int, temperature: float, top_k: int = 0, top_p: float = 1.0):
  """P(y1..yn | prompt) as an array [V]*n when each token is drawn from `model`'s processed full-depth readout
  (`api.readouts` per prefix, `sampling.process_logits` with the given settings). For tiny vocabularies."""
  v, r = model.config.vocab_size, model.config.recurrence
  out = np.zeros((v,) * n_tokens, np.float64)

  def rec(prefix, prob):
    i = len(prefix) - len(prompt)
    if i == n_tokens:
      out[tuple(prefix[len(prompt) :])] = prob
      return
    logits = api.readouts(model, prefix, depths=[r])[0, -1]
    p = np.asarray(
        sampling.process_logits(logits, greedy=False, temperature=temperature, top_k=top_k, top_p=top_p), np.float64
    )
    for y in np.flatnonzero(p > 0):
      rec(prefix + [int(y)], prob * p[y])

  rec(list(prompt), 1.0)
  assert abs(out.sum() - 1.0) < 1e-4
  return out


# ---------------------------------------------------------------------------------------------------
# Test files that run their work in subprocesses (e.g. 8 simulated CPU devices: XLA_FLAGS before jax starts)
# ---------------------------------------------------------------------------------------------------
def run_workers(test_file: str, names, xla_flags: str, timeout_s: float) -> dict:
  """Runs `python test_file --worker NAME OUT.json` for every name at once, each with `xla_flags` and the CPU
  platform, and returns {name: the JSON report the worker wrote}; a failed worker fails the test with the tail
  of its log. The test file's `__main__` is `worker_main(its worker function)`."""
  env = dict(
      os.environ,
      XLA_FLAGS=xla_flags,
      JAX_PLATFORMS="cpu",
      PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")]),
  )
  tmp = tempfile.mkdtemp(prefix=os.path.splitext(os.path.basename(test_file))[0] + "-")
  procs = {}
  for name in names:
    out = os.path.join(tmp, f"{name}.json")
    cmd = [sys.executable, os.path.abspath(test_file), "--worker", str(name), out]
    procs[name] = (
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        out,
    )
  reports = {}
  for name, (proc, out) in procs.items():
    log, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"worker {name} failed:\n{log[-6000:]}"
    with open(out) as f:
      reports[name] = json.load(f)
  return reports


def mesh_reports(test_file: str, workers: dict, xla_flags: str, timeout_s: float) -> dict:
  """`run_workers` over `workers` ({worker name: mesh shape or None}); prints each worker's CPU seconds and
  timings and returns {mesh shape or None: report} (the mesh tests' module fixture)."""
  by_name = run_workers(test_file, workers, xla_flags, timeout_s)
  for name, rep in by_name.items():
    print(name, "cpu_s:", rep["cpu_s"], "timings:", rep["timings"])
  return {workers[name]: rep for name, rep in by_name.items()}


def write_worker_report(report: dict, rec: dict, c0: float, out_path: str, programs: bool = True) -> None:
  """The tail of a mesh worker: `report["programs"]` = [traces, compiles, configurations] of `rec` (a
  `record_sharded_calls()` record; only if `programs`), `report["cpu_s"]` = CPU seconds since `c0`
  (`time.process_time()`), then the report written to `out_path` as JSON."""
  if programs:
    report["programs"] = [rec["traces"], rec["compiles"], len({c["config"] for c in rec["calls"]})]
  report["cpu_s"] = round(time.process_time() - c0, 1)
  with open(out_path, "w") as f:
    json.dump(report, f)


def worker_main(worker) -> None:
  """The `__main__` of a test file run by `run_workers`: `--worker NAME OUT.json` calls worker(NAME, OUT)."""
  if len(sys.argv) == 4 and sys.argv[1] == "--worker":
    worker(sys.argv[2], sys.argv[3])
  else:
    print(f"usage: {os.path.basename(sys.argv[0])} --worker NAME OUT.json", file=sys.stderr)
    sys.exit(2)


def sharding_spec(sharding) -> list:
  """A NamedSharding's PartitionSpec as JSON-able lists (None, an axis name, or a list of axis names)."""
  return [None if e is None else (e if isinstance(e, str) else list(e)) for e in sharding.spec]


def record_sharded_calls() -> dict:
  """Records every sharded program run in this process (call it once, in an 8-device worker subprocess).

  Wraps `sharding.Program.__call__` (for the rest of the process) so each run appends {"name": entry name,
  "mesh": mesh shape, "kwargs": its static keyword arguments (configs in the mesh's head layout), "in": the
  shardings of its placed array arguments, "out": of its result, "config": a hashable key of the configuration
  (entry, static arguments, input avals)} to `calls`; counts the traces of `sharding.run_sharded` (a wrapper
  whose body runs only while jax traces it) in `traces` and its backend compiles (jax.monitoring events) in
  `compiles`. One trace and one compile per configuration: `traces == compiles == len({c["config"] ...})`.
  """
  from loopspec_jax.parallel import sharding

  rec = {"calls": [], "traces": 0, "compiles": 0}
  traced = sharding.run_sharded

  @functools.wraps(traced)
  def run_sharded(*args):  # the same name, so jax's compile events name it as before
    rec["traces"] += 1
    return traced(*args)

  def on_event(event, duration, fun_name=None, **kw):
    del duration, kw
    if event == "/jax/core/compile/backend_compile_duration" and fun_name == "jit(run_sharded)":
      rec["compiles"] += 1

  jax.monitoring.register_event_duration_secs_listener(on_event)
  sharding.run_sharded = run_sharded  # `sharding.program` looks it up at each call
  run = sharding.Program.__call__
  shardings = lambda tree: jax.tree_util.tree_map(lambda x: x.sharding, tree)

  def recorded(prog):
    leaves, treedef = jax.tree_util.tree_flatten(prog.arrays)
    avals = tuple((tuple(x.shape), str(x.dtype)) for x in leaves)
    call = {"name": prog.name, "mesh": tuple(prog.mesh_plan.mesh.shape.values()), "kwargs": prog.kwargs}
    call.update({"in": shardings(prog.arrays), "config": (prog.name, prog.args[1:4], treedef, avals)})
    out = run(prog)
    rec["calls"].append(dict(call, out=shardings(out)))
    return out

  sharding.Program.__call__ = recorded
  return rec
