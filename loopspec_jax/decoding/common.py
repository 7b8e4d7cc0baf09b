"""What every decoder shares: sampling settings, prompt batching and validation, prefill, the host driver.

A decoder (autoregressive, chain, LoopSpec) is described by a `Decoder`: the readout depths its caches
need, how many cache positions it may write past the budget, and three functions (build the loop state
from the prefilled cache, run the jitted `lax.while_loop`, turn the final state into `DecodeStats`).
`run_decoder` is the ONE host driver: prefill, timing, `block_until_ready`, token collection and the stats
common to every method. Nothing here knows which decoder it drives.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import compile_clock
from loopspec_jax.decoding import sampling
from loopspec_jax.decoding import stops as stop_seqs
from loopspec_jax.decoding.stats import DecodeStats
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import entry
from loopspec_jax.parallel import sharding
from loopspec_jax.parallel.logical import axes_field


# ---------------------------------------------------------------------------------------------------
# Sampling settings and per-(request, position) state noise
# ---------------------------------------------------------------------------------------------------
@flax.struct.dataclass
class SamplingParams:
  """Traced sampling settings shared by every decoder (greedy is a static flag, not in here).

  temperature / top_k / top_p are per request ([B]: a serving engine mixes greedy rows, temperature 0, with
  sampled ones in one compiled program); `row_distributions` broadcasts them to the logits' leading shape.
  `tick_budget` (None in `generate`): when set, `loop_until_done` also stops after that many iterations or
  as soon as a request finishes, so a serving engine can return to the host between bounded runs.
  `stops` (None: no stop sequences, no check compiled): int32 [K, L] token sequences that end a request like
  eos, checked at every commit (decoding/stops.py).
  """

  temperature: jax.Array = axes_field("batch")  # [B]
  top_k: jax.Array = axes_field("batch")  # [B]
  top_p: jax.Array = axes_field("batch")  # [B]
  base_key: jax.Array = axes_field("key")  # [2] the run's PRNG key
  request_ids: jax.Array = axes_field("batch")  # [B]
  eos_id: jax.Array = axes_field()  # [] (-1: none)
  max_new: jax.Array = axes_field("batch")  # [B]
  tick_budget: Optional[jax.Array] = axes_field(default=None)  # [] iterations per loop call (None: until done)
  stops: Optional[jax.Array] = axes_field(None, None, default=None)  # [K, L] stop sequences (None: none)


@dataclasses.dataclass(frozen=True)
class Sampling:
  """One call's sampling settings, as a typed host value: `generate` builds it, its driver turns it into the
  device `SamplingParams` (`params`), and the planner keys its plans on it and probes at its next seed.

  temperature 0 is greedy; top_k 0 and top_p 1 are off; eos_id None: none; stops: normalized token-id
  sequences (`stops.normalize`), None: none."""

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  eos_id: Optional[int] = None
  stops: Optional[tuple] = None

  @property
  def greedy(self) -> bool:
    return float(self.temperature) == 0.0

  def plan_key(self) -> tuple:
    """What a plan depends on: every setting but the seed (a plan is the same for every seed)."""
    return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "seed")

  def next_seed(self) -> "Sampling":
    return dataclasses.replace(self, seed=int(self.seed) + 1)

  def params(self, n: int, max_new_tokens, request_ids=None) -> "SamplingParams":
    kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    return make_sampling_params(n, max_new_tokens, request_ids=request_ids, **kw)


def make_sampling_params(n, max_new_tokens, temperature, top_k, top_p, seed, eos_id, request_ids=None, stops=None):
  """SamplingParams for n requests; max_new_tokens, temperature, top_k, top_p are scalars or per-request [n];
  `stops`: token-id sequences (`stops.stop_table`; None: none)."""
  table = stop_seqs.stop_table(stops)
  rid = np.arange(n) if request_ids is None else np.asarray(request_ids)
  per = lambda x, dt: jnp.broadcast_to(jnp.asarray(x, dt), (n,))
  return SamplingParams(
      temperature=per(temperature, jnp.float32),
      top_k=per(top_k, jnp.int32),
      top_p=per(top_p, jnp.float32),
      base_key=jax.random.PRNGKey(seed),
      request_ids=jnp.asarray(rid, jnp.int32),
      eos_id=jnp.int32(-1 if eos_id is None else eos_id),
      max_new=per(max_new_tokens, jnp.int32),
      stops=None if table is None else jnp.asarray(table),
  )


def row_distributions(logits, sp: SamplingParams):
  """`sampling.process_logits` (sampled kernel) of logits [B, ..., V] with each request's own settings.

  The per-request temperature / top_k / top_p [B] are broadcast to the logits' leading shape [B, ...]
  (AR [B, V]; chain [B, V] and [B, S, V]; LoopSpec endpoint rows [B, nR * W, V]). Rows at temperature 0 get
  one-hot(argmax), so a greedy request decodes token for token as with the greedy kernels.
  """
  lead = logits.shape[:-1]
  per_row = lambda x: jnp.broadcast_to(jnp.reshape(x, x.shape + (1,) * (len(lead) - x.ndim)), lead)
  return sampling.process_logits(
      logits, greedy=False, temperature=per_row(sp.temperature), top_k=per_row(sp.top_k), top_p=per_row(sp.top_p)
  )


def state_noise(sp: SamplingParams, positions, cfg: ModelConfig):
  """Per-(request, position) random initial states [B, S, E] (Raven 'like-init')."""

  def one(rid, p):
    key = sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_INIT)
    return M.random_state_noise(key, (cfg.hidden_size,), cfg)

  return jax.vmap(lambda rid, ps: jax.vmap(lambda p: one(rid, p))(ps))(sp.request_ids, positions)


def prompt_noise(sp: SamplingParams, b: int, t: int, cfg: ModelConfig, random_init: bool):
  if not random_init:
    return None
  return state_noise(sp, jnp.broadcast_to(jnp.arange(t), (b, t)), cfg)


@entry.program(entry.PREFILL)
def prefill_state(
    params,
    prompt,
    lengths,
    sp: SamplingParams,
    *,
    cfg: ModelConfig,
    readout_depths: tuple,
    total_len: int,
    random_init: bool,
    cache_group: int = 1,
):
  """Allocates the cache for total_len positions and prefills the prompt [B, Tp] at every depth.

  `cache_group`: recurrent steps per cache block (see models/kvcache.py): 1 for AR and chain, d1 for LoopSpec.
  """
  b, tp = prompt.shape
  layout = kvcache.CacheLayout.of(cfg, len(readout_depths), cache_group)
  cache = kvcache.empty_cache(cfg, layout, b, total_len)
  noise = prompt_noise(sp, b, tp, cfg, random_init)
  cache = kvcache.prefill(params, prompt, lengths, cache, cfg, layout, readout_depths, noise)
  tokens = jnp.zeros((b, total_len), jnp.int32).at[:, :tp].set(prompt)
  return cache, tokens


def fresh_counters(tokens, lengths, *counts: str) -> dict:
  """The fields a decode state starts with (a state's constructor keywords): tokens [B, T], length [B], n_new
  and done [B], the loop's iterations [] and a zero int32 [B] count per name in `counts` (rounds, ...)."""
  zb = jnp.zeros((tokens.shape[0],), jnp.int32)
  fields = {"tokens": tokens, "length": lengths, "n_new": zb, "done": jnp.zeros(zb.shape, bool)}
  return dict(fields, iterations=jnp.int32(0), **{name: zb for name in counts})


def loop_until_done(body, state, sp: Optional[SamplingParams] = None):
  """The decode loop: `body` until every request is done, on device (no host round trip per token or tick).

  With `sp.tick_budget` set (a serving engine), the loop also stops after that many iterations, or after the
  first iteration in which a request not done at entry finishes (so the host can retire it and admit another).
  """
  if sp is None or sp.tick_budget is None:
    return jax.lax.while_loop(lambda st: ~jnp.all(st.done), body, state)
  done0 = state.done

  def cond(carry):
    st, i = carry
    return (i < sp.tick_budget) & ~jnp.all(st.done) & ~jnp.any(st.done & ~done0)

  return jax.lax.while_loop(cond, lambda carry: (body(carry[0]), carry[1] + 1), (state, jnp.int32(0)))[0]


def commit_tokens(tokens, length, n_new, done, y, n_commit, sp: SamplingParams):
  """Appends up to S tokens y [B, S] per request (the first n_commit [B]), stopping at eos, at the end of a
  stop sequence (`sp.stops`, which may straddle earlier commits: decoding/stops.py) and at the budget.

  Returns (tokens, length, n_new, done, n_committed [B]). Finished requests commit nothing.
  """
  b, s = y.shape
  t = tokens.shape[1]
  idx = jnp.arange(s)[None, :]
  n = jnp.minimum(n_commit, sp.max_new - n_new)
  is_end = y == sp.eos_id
  if sp.stops is not None:
    is_end = is_end | stop_seqs.stop_hits(tokens, length, n_new, y, sp.stops)
  is_end = is_end & (idx < n[:, None])
  first_end = jnp.where(jnp.any(is_end, axis=1), jnp.argmax(is_end, axis=1) + 1, s + 1)
  n = jnp.where(done, 0, jnp.minimum(n, first_end))
  write_pos = jnp.where(idx < n[:, None], length[:, None] + idx, t)
  tokens = tokens.at[jnp.arange(b)[:, None], write_pos].set(y, mode="drop")
  n_new = n_new + n
  done = done | ((n_new >= sp.max_new) | (first_end <= n))
  return tokens, length + n, n_new, done, n


def commit_round(st, drafts, n_acc, nxt, sp: SamplingParams) -> dict:
  """The commit of one draft-then-verify round (chain, draft model, prompt lookup): the n_acc [B] accepted of
  drafts [B, G], then the verifier's next token nxt [B], within the budget and up to the first eos.

  `st` has tokens, length, n_new, done, rounds, accepted and iterations. Returns those fields updated (the
  state's `replace` keywords); a finished request changes nothing but the loop's iteration count."""
  b = drafts.shape[0]
  cand = jnp.concatenate([drafts, jnp.zeros((b, 1), jnp.int32)], axis=1).at[jnp.arange(b), n_acc].set(nxt)
  live = ~st.done
  tokens, length, n_new, done, n_commit = commit_tokens(st.tokens, st.length, st.n_new, st.done, cand, n_acc + 1, sp)
  return dict(
      tokens=tokens,
      length=length,
      n_new=n_new,
      done=done,
      rounds=st.rounds + live,
      accepted=st.accepted + jnp.where(live, jnp.minimum(n_acc, n_commit), 0),
      iterations=st.iterations + 1,
  )


# ---------------------------------------------------------------------------------------------------
# Validation shared by every decoder (runs before anything compiles)
# ---------------------------------------------------------------------------------------------------
def validate_prompts(prompts, cfg: ModelConfig, max_new_tokens: int) -> list:
  if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
    raise ValueError("prompts must be a non-empty list of token-id lists")
  out = []
  for i, p in enumerate(prompts):
    p = [int(t) for t in np.asarray(p).reshape(-1)] if not isinstance(p, list) else list(p)
    if len(p) == 0:
      raise ValueError(f"prompt {i} is empty")
    for t in p:
      if not isinstance(t, (int, np.integer)) or not 0 <= int(t) < cfg.vocab_size:
        raise ValueError(f"prompt {i} has token id {t!r} outside the vocabulary [0, {cfg.vocab_size})")
    if len(p) + max_new_tokens > cfg.max_len:
      raise ValueError(
          f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} it exceeds the "
          f"context of {cfg.max_len} positions"
      )
    out.append([int(t) for t in p])
  return out


def validate_sampling(temperature, top_k, top_p, init_state, cfg: ModelConfig):
  if not temperature >= 0:
    raise ValueError(f"temperature must be >= 0, got {temperature}")
  if int(top_k) != top_k or top_k < 0:
    raise ValueError(f"top_k must be a non-negative integer, got {top_k}")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p must be in (0, 1], got {top_p}")
  if init_state not in ("zeros", "random"):
    raise ValueError(f"init_state must be 'zeros' or 'random', got {init_state!r}")
  if init_state == "random" and not cfg.is_raven:
    raise ValueError(f"init_state='random' applies to Raven-style models, not {cfg.family!r}")


def validate_depth(decoder, cfg: ModelConfig, label: str) -> None:
  """A round verifies drafts up to `decoder.extra_positions - 1` positions past the committed prefix (a tree's
  depth, a chain's gamma, a lookahead window): deeper than the model's context is refused before compiling."""
  deepest = decoder.extra_positions - 1
  if deepest >= cfg.max_len:
    raise ValueError(
        f"method {label} verifies drafts up to {deepest} positions ahead, too deep for the model's context "
        f"of {cfg.max_len} positions"
    )


def _round_up(x: int, m: int) -> int:
  return ((x + m - 1) // m) * m


def buckets(lengths, max_new_tokens: int, cfg: ModelConfig):
  """Static (prompt_len, total_len) buckets so that similar requests share one compiled program."""
  tp = min(_round_up(max(lengths), 16), cfg.max_len)
  total = min(_round_up(max(lengths) + max_new_tokens, 32), cfg.max_len)
  return tp, max(total, tp)


def batch_prompts(prompts: list, tp: int):
  arr = np.zeros((len(prompts), tp), np.int32)
  for i, p in enumerate(prompts):
    arr[i, : len(p)] = p
  return jnp.asarray(arr), jnp.asarray([len(p) for p in prompts], jnp.int32)


# ---------------------------------------------------------------------------------------------------
# Results and statistics
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class GenerateResult:
  """New tokens per prompt, the raw counts of the run (`counts`, a typed `DecodeStats` that adds across runs)
  and every figure derived from them (`stats`: `counts.summary()`)."""

  tokens: list  # new tokens per prompt (list of lists)
  stats: dict  # counts.summary()
  counts: Optional[DecodeStats] = None


def collect_tokens(tokens, lengths0, n_new) -> list:
  tokens = np.asarray(tokens)
  n_new = np.asarray(n_new)
  return [tokens[i, int(lengths0[i]) : int(lengths0[i]) + int(n_new[i])].tolist() for i in range(tokens.shape[0])]


# ---------------------------------------------------------------------------------------------------
# The one host driver
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Decoder:
  """How to run one decoding method (built by each decoder module's `make_decoder`).

  init(cache, tokens, lengths, sp) -> state; loop(params, state, sp) -> state (one jitted while_loop);
  stats(state) -> DecodeStats of raw counts (decoding/stats.py; timings are filled in by `run_decoder`). Both init and loop may be
  declared entry points (`parallel/entry.py`) taking their further arguments as keywords (`init_kw`, `loop_kw`): static
  settings (cfg, shape, greedy, ...) and, for method='draft', the drafter's parameters (traced, an argument
  kind of the entry point).
  """

  name: str
  readout_depths: tuple
  cache_group: int  # recurrent steps per cache block (models/kvcache.py)
  extra_positions: int
  init: Callable
  loop: Callable
  stats: Callable
  init_kw: dict = dataclasses.field(default_factory=dict)
  loop_kw: dict = dataclasses.field(default_factory=dict)


def round_decoder(
    name: str,
    cfg: ModelConfig,
    depth: int,
    init: Callable,
    loop: Callable,
    stats: Callable,
    *,
    loop_kw: dict,
    init_kw: Optional[dict] = None,
    d1: Optional[int] = None,
) -> Decoder:
  """The Decoder of a draft-then-verify method (chain, draft model, lookup, every drafter of the tree loop):
  caches of one recurrent step per block read out at full depth R (and at the drafts' depth `d1` for
  self-speculation; None: R alone), at most `depth` drafts verified past the committed token (a chain's
  gamma, a tree's depth). init_kw / loop_kw: the further keywords of its entry points (the loop's include
  greedy and random_init; None: none), to which the target's `cfg` is added."""
  depths = (cfg.recurrence,) if d1 is None else (d1, cfg.recurrence)
  init_kw, loop_kw = dict(init_kw or {}, cfg=cfg), dict(loop_kw, cfg=cfg)
  return Decoder(name, depths, 1, depth + 1, init, loop, stats, init_kw, loop_kw)


def prefill_for(
    decoder: Decoder,
    params,
    prompt_arr,
    len_arr,
    sp: SamplingParams,
    *,
    cfg: ModelConfig,
    total: int,
    random_init: bool,
    mesh=None,
):
  """`prefill_state` with the cache a decoder needs (its readout depths, block size and extra positions)."""
  return sharding.entry(prefill_state, mesh)(
      params,
      prompt_arr,
      len_arr,
      sp,
      cfg=cfg,
      readout_depths=decoder.readout_depths,
      total_len=total + decoder.extra_positions,
      random_init=random_init,
      cache_group=decoder.cache_group,
  )


def run_decoder(
    decoder: Decoder, params, prompt_arr, len_arr, sp: SamplingParams, *, mesh=None, **prefill
) -> GenerateResult:
  """Prefill, build the loop state, run the loop, time both phases and collect tokens and stats. `prefill`:
  the prefill's settings, `prefill_for`'s keywords (cfg, total, random_init).

  `prefill_seconds` and `decode_seconds` leave out the seconds spent compiling during the call (tracing,
  lowering, XLA, or reading jax's compilation cache: `compile_clock`), which are `compile_seconds`: a cold
  call's figures then compare with a warm one's."""
  c0, t0 = compile_clock.seconds(), time.perf_counter()
  cache, tokens = prefill_for(decoder, params, prompt_arr, len_arr, sp, mesh=mesh, **prefill)
  jax.block_until_ready(cache)
  c1, t1 = compile_clock.seconds(), time.perf_counter()
  state = sharding.entry(decoder.init, mesh)(cache, tokens, len_arr, sp, **decoder.init_kw)
  out = sharding.entry(decoder.loop, mesh)(params, state, sp, **decoder.loop_kw)
  jax.block_until_ready(out.tokens)
  c2, t2 = compile_clock.seconds(), time.perf_counter()
  counts = decoder.stats(out)
  counts.totals.update(prefill_seconds=max(t1 - t0 - (c1 - c0), 0.0), decode_seconds=max(t2 - t1 - (c2 - c1), 0.0))
  counts.totals.update(compile_seconds=c2 - c0)
  return GenerateResult(collect_tokens(out.tokens, np.asarray(len_arr), out.n_new), counts.summary(), counts)


def method_kwargs_error(method: str, allowed: Sequence[str], given: dict) -> Optional[str]:
  """The error message for method arguments that `method` does not take (None when all are allowed)."""
  extra = sorted(k for k, v in given.items() if v is not None and k not in allowed)
  if not extra:
    return None
  return f"method={method!r} takes no {'/'.join(extra)}"
