"""The public entry points: `load`, `save`, `readouts`, `generate` (stable; outside tools call them).

`generate` validates its arguments (before anything compiles), builds the chosen method's `Decoder` and
hands it to the one host driver, `decoding.common.run_decoder`; method "auto" goes to the planner
(`planner.generate`), which picks a registered method and runs it through the same driver. `load` lives in
`checkpoint/loading.py` (below the decoders: a drafter given by name loads through it).
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.checkpoint import loading
from loopspec_jax.checkpoint import native
from loopspec_jax import methods
from loopspec_jax import planner
from loopspec_jax.decoding import common
from loopspec_jax.decoding import stops as stop_seqs
from loopspec_jax.decoding.common import GenerateResult
from loopspec_jax.models import looped as M
from loopspec_jax.models.model import LoopedModel, from_config
from loopspec_jax.parallel import sharding

bundled_models = native.bundled_models
load = loading.load
save = native.save
METHODS = methods.NAMES

__all__ = ["GenerateResult", "LoopedModel", "bundled_models", "from_config", "generate", "load", "readouts", "save"]


def readouts(model: LoopedModel, token_ids, depths=None, *, init_state=None) -> np.ndarray:
  """float32 logits [len(depths), T, V] of a full-sequence forward read out at each depth (default 1..R)."""
  cfg = model.config
  ids = common.validate_prompts([list(np.asarray(token_ids).reshape(-1))], cfg, 0)[0]
  depths = tuple(range(1, cfg.recurrence + 1)) if depths is None else tuple(int(d) for d in depths)
  for d in depths:
    if not 1 <= d:
      raise ValueError(f"readout depth {d} must be >= 1")
  noise = None
  if init_state is not None:
    if not cfg.is_raven:
      raise ValueError("init_state applies to Raven-style models")
    noise = jnp.asarray(init_state, jnp.float32)
    if noise.shape != (len(ids), cfg.hidden_size):
      raise ValueError(f"init_state must have shape {(len(ids), cfg.hidden_size)}, got {noise.shape}")
    noise = noise[None]
  tokens = jnp.asarray([ids], jnp.int32)
  out = _forward_depths(model.params, tokens, jnp.asarray([len(ids)], jnp.int32), noise, depths=depths, cfg=cfg)
  return np.asarray(out[:, 0], np.float32)


_forward_depths = jax.jit(
    lambda params, tokens, lengths, noise, depths, cfg: M.forward_depths(params, tokens, lengths, depths, cfg, noise),
    static_argnames=("depths", "cfg"),
)


def _check_shardable(spec, decoder) -> None:
  """A method runs on a mesh only through declared sharded entry points (parallel/entry.py)."""
  if not all(sharding.is_entry_point(f) for f in (decoder.init, decoder.loop)):
    raise ValueError(f"method {spec.name!r} does not run on a mesh yet (no sharded entry points); use mesh=None")


def generate(
    model: LoopedModel,
    prompts,
    *,
    max_new_tokens: int,
    method="ar",
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    eos_id: Optional[int] = None,
    init_state: str = "zeros",
    request_ids=None,
    mesh=None,
    speculate_max_batch: Optional[int] = None,
    sharding_rules=None,
    stop=None,
    **method_args,
) -> GenerateResult:
  """Decodes `prompts` (lists of token ids) with `method`: a `Method` object (`lj.LoopSpec(d1=2, d2=8)`), or a
  name or spec string. A method's arguments have one home, its `Method` dataclass: a spec string parses into
  it ('loopspec:d1=2,d2=8'), and `**method_args` are its fields given as keywords beside a name or spec
  (`method="loopspec", d1=2, d2=8`; 'chain' d1, gamma, branch, tree_nodes; 'loopspec' d1, d2, lane_capacity,
  gate_mass; 'draft' draft_model, gamma; 'lookup' ngram, gamma; see `loopspec_jax.methods`). A keyword the
  method does not take is a ValueError naming it; keywords beside a `Method` object are a ValueError too.

  Every method is lossless with respect to full-depth decoding. Returns new tokens per prompt and stats.
  `mesh`: a jax Mesh with axes 'data' (requests) and 'model' (heads, MLP, vocab); the batch is padded to a
  multiple of the data-axis size with dummy requests, dropped from the result (see parallel/sharding.py).
  `speculate_max_batch=K`: batches of more than K requests decode with 'ar' instead (speculation stops
  paying once a batch is compute-bound; experiments/batch_bench.py measures where).
  `gamma="auto"` (chain, draft, lookup): each request picks its draft length from its own past acceptance
  (decoding/adaptive.py). `draft_model` must share the target's vocabulary and tokenizer (else ValueError);
  on a mesh its parameters and cache are sharded by the same rules as the target's.
  `gate_mass` (loopspec with d2, sampled): the second proposal's gate also needs this much residual mass
  sum(max(0, p_d2 - q1)); None or 0 is the paper's gate. Any value keeps decoding lossless.
  `stop`: stop sequences, each a string (needs the model's tokenizer; its encodings with and without a leading
  space, `decoding.stops.text_stops`) or a list of token ids: a request ends, like at eos, with the first new
  token that completes one (inside the decode loop, also mid-commit; the sequence's tokens are returned).
  """
  cfg = model.config
  if max_new_tokens is None or int(max_new_tokens) < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  max_new_tokens = int(max_new_tokens)
  prompts = common.validate_prompts(prompts, cfg, max_new_tokens)
  common.validate_sampling(temperature, top_k, top_p, init_state, cfg)
  if eos_id is not None and not 0 <= eos_id < cfg.vocab_size:
    raise ValueError(f"eos_id {eos_id} is outside the vocabulary [0, {cfg.vocab_size})")
  stops = _stop_sequences(model, stop)
  random_init = init_state == "random"
  sampling = common.Sampling(temperature, top_k, top_p, seed, eos_id, stops)
  call = dict(sampling=sampling, random_init=random_init, request_ids=request_ids, mesh=mesh, rules=sharding_rules)
  run_at = lambda ps, n: functools.partial(_run, model, ps, n, speculate_max_batch=speculate_max_batch, **call)
  # `run(spec, budget)` is this call with `budget` new tokens (the planner's probe); 'auto' (methods.Auto) is
  # planned here, and with re-planning continues from a prefix through `run_at(prompts + prefix, tokens left)`
  spec, run = methods.build(method, **method_args), run_at(prompts, max_new_tokens)
  if not isinstance(spec, methods.Auto):
    return run(spec)
  result = planner.generate(model, prompts, max_new_tokens, sampling, spec, run, run_at)
  if stops:  # its continuation after a re-plan cannot see a stop straddling the join
    result.tokens = [stop_seqs.cut_tokens(t, stops) for t in result.tokens]
  return result


def _stop_sequences(model: LoopedModel, stop) -> Optional[tuple]:
  """`generate`'s `stop` (a string, or a list of strings and token-id lists) as validated token sequences."""
  if stop is None:
    return None
  items = [stop] if isinstance(stop, str) else stop
  if not isinstance(items, (list, tuple)):
    raise ValueError(f"stop must be a string or a list of strings and token-id lists, got {type(stop).__name__}")
  seqs = []
  for item in items:
    if isinstance(item, str):
      if model.tokenizer is None:
        raise ValueError(f"stop string {item!r} needs the model's tokenizer; give token ids instead")
      if not item:
        raise ValueError("a stop string is empty")
      # a special token's text (e.g. '<|endoftext|>') decodes to nothing: its encoding as it is
      seqs += stop_seqs.text_stops([item], model.encode, model.decode) or [model.encode(item)]
    else:
      seqs.append(item)
  return stop_seqs.normalize(seqs, model.config.vocab_size)


def _run(
    model,
    prompts,
    max_new_tokens,
    spec,
    budget=None,
    *,
    sampling,
    random_init,
    request_ids,
    mesh,
    rules,
    speculate_max_batch,
) -> GenerateResult:
  """Decodes `prompts` with `spec` at the shapes of a `max_new_tokens` call (its compiled programs), each
  request stopping after `budget` new tokens (default max_new_tokens; an int, or one per request)."""
  cfg = model.config
  greedy = sampling.greedy
  spec = methods.build_checked(spec, model)
  if speculate_max_batch is not None and len(prompts) > speculate_max_batch:
    spec = methods.AR()  # large batches are compute-bound
  decoder = spec.make_decoder(cfg, greedy=greedy, random_init=random_init)
  common.validate_depth(decoder, cfg, spec.label)
  n_real = len(prompts)
  if mesh is not None:
    _check_shardable(spec, decoder)
    mesh = sharding.plan(mesh, rules)
    prompts, request_ids, _ = sharding.pad_requests(prompts, request_ids, mesh)
  lengths = [len(p) for p in prompts]
  tp, total = common.buckets(lengths, max_new_tokens, cfg)
  prompt_arr, len_arr = common.batch_prompts(prompts, tp)
  new = np.minimum(max_new_tokens if budget is None else budget, max_new_tokens)
  if new.ndim:  # per request: dummy requests of a mesh's padding get a budget of 1 (below)
    new = np.concatenate([new, np.ones(len(prompts) - len(new), new.dtype)])
  sp = sampling.params(len(prompts), new, request_ids=request_ids)
  if len(prompts) > n_real:  # dummy requests stop after one token
    sp = sp.replace(max_new=sp.max_new.at[n_real:].set(1))
  result = common.run_decoder(
      decoder, model.params, prompt_arr, len_arr, sp, cfg=cfg, total=total, random_init=random_init, mesh=mesh
  )
  return result if mesh is None else sharding.drop_padding(result, n_real)
