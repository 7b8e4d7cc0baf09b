"""The serving engine: continuous batching of AR, chain or LoopSpec decoding over B request slots.

The device holds ONE decode state of the engine's method for B slots (static shapes: every [B, ...] leaf of
the method's state, e.g. LoopSpec's committed cache rows, lane table and counters, with per-slot sampling
settings in `SamplingParams`). `Engine.step` is one round trip:

  host    apply cancellations (the slot's `done` is set on device) and admit waiting requests into free
          slots: prefill the prompt as a batch of one, build the method's fresh state for it (`Decoder.init`)
          and write that state into the slot's rows of every [B, ...] leaf (`insert_slot`, jitted, the
          other slots untouched)
  device  the method's own jitted `lax.while_loop` (`Decoder.loop`) for at most `ticks_per_call` iterations,
          stopping early as soon as a slot finishes (`SamplingParams.tick_budget`, `common.loop_until_done`)
  host    read tokens / length / n_new / done, emit each slot's newly committed tokens, check stop strings
          token by token (the request ends at the first token whose text holds one: its token ids and usage
          do not depend on how many tokens a call committed; text that may still become a stop string is held
          back, so streamed text equals non-streamed text: serving/text.py), retire finished slots (eos,
          max_tokens, stop string, cancel)

The method is any `Method` of the registry (`loopspec_jax.methods`: a name, a spec such as 'loopspec:2,8', or a
`Method` object), built by `methods.build` and run through its own `make_decoder`.
The decode loop compiles once per engine configuration (method, depths, slots, context, greedy kernels or
not); prefill compiles once per 16-token prompt bucket (capped at the engine's context: `prompt_bucket`).

Exactness: a request's tokens depend only on its prompt, settings and key (the per-(request, position,
purpose) keys of every decoder; LoopSpec's lane table is rotated to the stage clock at admission), so they are
the same whatever else is in the batch and whenever it was admitted. A request with `seed=s` samples what
`generate(..., seed=<engine seed>, request_ids=[s])` samples; temperature 0 is greedy.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from typing import Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax import methods
from loopspec_jax import planner
from loopspec_jax.decoding import common
from loopspec_jax.decoding.method import Method
from loopspec_jax.parallel import sharding
from loopspec_jax.serving import metrics as metrics_lib
from loopspec_jax.serving import slots as slots_lib
from loopspec_jax.serving import text as text_lib
from loopspec_jax.serving.metrics import EngineMetrics
from loopspec_jax.serving.slots import COUNTERS, finish_slot, insert_slot, tile_slots

MAX_STOPS = 16  # stop strings per request (HumanEval's `until` has five)

MAX_SEED = 2**31 - 1
PREFILL_BUCKET = 16  # prompts are padded to a multiple of this (one prefill program per bucket), capped by the cache

log = logging.getLogger("loopspec_jax.serving")


def prompt_bucket(n: int, total: int) -> int:
  """The padded prompt length of an n-token prompt in an engine whose cache holds `total` positions: the next
  multiple of PREFILL_BUCKET, never more than `total` (a bucket past the cache cannot be written into it; the
  engine refuses prompts of `total` tokens or more, so the cap still holds every prompt)."""
  return min(-(-int(n) // PREFILL_BUCKET) * PREFILL_BUCKET, int(total))


class RequestError(ValueError):
  """A request the engine refuses at submission; `param` names the offending field (OpenAI's error.param)."""

  def __init__(self, message: str, param: Optional[str] = None):
    super().__init__(message)
    self.param = param


class QueueFullError(RuntimeError):
  """The waiting queue is full: the request was refused (not dropped)."""


class EngineFailedError(RuntimeError):
  """The engine's loop died (`Engine.failure` says why): it accepts no more requests."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Static configuration of an engine: one compiled decode loop per distinct value.

  method: a `Method` (the one home of its arguments); a name or spec string, with the convenience keywords
  d1 / d2 / gamma / lane_capacity as `generate` takes them, parses into one at construction (those fields are
  then None). slots: B request slots. max_queue: waiting requests
  beyond which `submit` refuses. ticks_per_call: loop iterations per device call (AR: tokens, chain: rounds,
  LoopSpec: ticks). greedy_only: compile the greedy kernels (no distributions) and refuse temperature > 0;
  otherwise the sampled kernels run for every slot and temperature-0 slots decode greedily inside them.
  max_len: context per slot (prompt + max_tokens; default the model's). eos_id: -1 for none, None for the
  model config's. seed: the engine's base key.
  """

  method: Union[str, Method] = "loopspec"
  d1: Optional[int] = None
  d2: Optional[int] = None
  gamma: Optional[int] = None
  lane_capacity: Optional[int] = None
  slots: int = 4
  max_queue: int = 64
  ticks_per_call: int = 16
  greedy_only: bool = False
  max_len: Optional[int] = None
  eos_id: Optional[int] = None
  seed: int = 0
  init_state: str = "zeros"

  def __post_init__(self):
    args = {k: getattr(self, k) for k in _METHOD_KEYWORDS}
    object.__setattr__(self, "method", methods.build(self.method, **args))
    for k in _METHOD_KEYWORDS:
      object.__setattr__(self, k, None)


_METHOD_KEYWORDS = ("d1", "d2", "gamma", "lane_capacity")  # folded into EngineConfig.method


@dataclasses.dataclass
class Request:
  """One completion request (token ids; the server encodes text)."""

  prompt: Sequence[int]
  max_tokens: int = 16
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: Optional[int] = None
  stop: Sequence[str] = ()


@dataclasses.dataclass
class Chunk:
  """What one engine step emitted for one request: its newly committed tokens (and their text)."""

  tokens: list
  text: str
  finished: bool
  finish_reason: Optional[str]  # 'stop' (eos or a stop string), 'length', 'cancelled', 'error' (engine failed)


@dataclasses.dataclass
class Sequence_:
  """Host-side record of a submitted request: where it runs and what it has emitted so far."""

  id: int
  request: Request
  key_id: int  # the request id of its random keys (its seed)
  on_chunk: Optional[Callable[["Sequence_", Chunk], None]]
  slot: int = -1
  tokens: list = dataclasses.field(default_factory=list)
  text: str = ""
  sent_chars: int = 0  # characters of `text` already emitted
  scanned: int = 0  # tokens already searched for stop strings (token by token: serving/text.py)
  done_call: Optional[int] = None  # the engine's device-call count when the request was retired
  finished: bool = False
  finish_reason: Optional[str] = None
  cancelled: bool = False
  t_submit: float = 0.0
  t_admit: float = 0.0
  t_first: Optional[float] = None
  t_done: Optional[float] = None
  chunk_times: list = dataclasses.field(default_factory=list)  # (time, tokens in the chunk)
  done_event: threading.Event = dataclasses.field(default_factory=threading.Event)


# ---------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------
class Engine:
  """Continuous batching over `config.slots` slots; thread-safe `submit` / `cancel`, `step` on one thread.

  Use `run_until_idle()` in process, or `start()` a background thread (the HTTP server does).
  """

  def __init__(self, model, config: EngineConfig = EngineConfig(), *, mesh=None, sharding_rules=None):
    cfg = model.config
    self.model, self.config, self.cfg = model, config, cfg
    if config.slots < 1 or config.max_queue < 0 or config.ticks_per_call < 1:
      raise ValueError(f"need slots >= 1, max_queue >= 0 and ticks_per_call >= 1, got {config}")
    common.validate_sampling(0.0, 0, 1.0, config.init_state, cfg)
    self.method = config.method  # any method of the registry
    self.plan = None  # method 'auto': the planner's pick for this engine's slots, context and sampling kernel
    if isinstance(self.method, planner.Auto):
      total = int(config.max_len or cfg.max_len)
      self.method, self.plan = planner.engine_plan(model, self.method, config.slots, total, config.greedy_only)
    self.method.validate(cfg)
    self.method.check_target(model)
    self.random_init = config.init_state == "random"
    self.decoder = self.method.make_decoder(cfg, greedy=config.greedy_only, random_init=self.random_init)
    common.validate_depth(self.decoder, cfg, self.method.label)
    self.total = int(config.max_len or cfg.max_len)
    if not 2 <= self.total <= cfg.max_len:
      raise ValueError(f"max_len={config.max_len} must be in [2, {cfg.max_len}] (the model's context)")
    eos = cfg.eos_id if config.eos_id is None else config.eos_id
    self.eos_id = None if eos is None or eos < 0 else int(eos)
    self.mesh = None if mesh is None else sharding.plan(mesh, sharding_rules)
    b = config.slots
    if self.mesh is not None and b % self.mesh.data_size:
      raise ValueError(f"slots={b} must be a multiple of the mesh's data axis ({self.mesh.data_size})")
    shape = self.decoder.init_kw.get("shape")  # LoopSpec's pipeline shape (its stage clock)
    self.n_groups, self.width = (shape.n_groups, shape.width) if shape is not None else (1, 1)
    # Host copies of the per-slot sampling settings (uploaded with each call).
    self._temperature = np.zeros(b, np.float32)
    self._top_k = np.zeros(b, np.int32)
    self._top_p = np.ones(b, np.float32)
    self._key_ids = np.zeros(b, np.int32)
    self._max_new = np.ones(b, np.int32)
    self._prompt_len = np.zeros(b, np.int32)
    self._slots: list = [None] * b  # Sequence_ per busy slot
    self._waiting: collections.deque = collections.deque()
    self._lock = threading.Lock()
    self._wake = threading.Condition(self._lock)
    self._ids = itertools.count()
    self._rng = np.random.default_rng(config.seed)
    self._thread = None
    self._stop = False
    self.failure: Optional[str] = None  # why the loop died ('Type: message'); None while it runs
    self.failed = threading.Event()
    self.metrics = EngineMetrics(method=self.method.name)
    self._prev_counters = np.zeros((b, len(COUNTERS)), np.int64)
    self._sp_base = None
    # Committed to its device from the start: the decode loop's outputs are committed whenever any input is (a
    # loaded head's or model's parameters), and a state that changed from uncommitted to committed between
    # two calls would compile the loop a second time.
    self.state = self._empty_state() if self.mesh is not None else jax.device_put(self._empty_state(), jax.devices()[0])
    # the decoder's static settings (R, d1, gamma, ...), read once: the method derives its served figures
    # from them and the engine's summed counters (metrics.served_stats)
    self.stats_settings = self.decoder.stats(self.state).settings

  # ----- construction -------------------------------------------------------------------------------
  def _sp(self, n, max_new, temperature, top_k, top_p, key_ids):
    return common.make_sampling_params(n, max_new, temperature, top_k, top_p, self.config.seed, self.eos_id, key_ids)

  def _loop_sp(self) -> common.SamplingParams:
    """The slots' settings for one device call (host arrays; the base key and budget built once)."""
    if self._sp_base is None:
      b = self.config.slots
      self._sp_base = self._sp(b, 1, 0.0, 0, 1.0, np.zeros(b, np.int32)).replace(
          tick_budget=jnp.int32(self.config.ticks_per_call)
      )
    return self._sp_base.replace(
        temperature=self._temperature.copy(),
        top_k=self._top_k.copy(),
        top_p=self._top_p.copy(),
        request_ids=self._key_ids.copy(),
        max_new=self._max_new.copy(),
    )

  def _fresh(self, prompt: list, max_new: int, temperature, top_k, top_p, key_id):
    """The method's initial state for one request (prefilled at the engine's context), batch of one."""
    tp = prompt_bucket(len(prompt), self.total)
    prompt_arr, len_arr = common.batch_prompts([prompt], tp)
    sp1 = self._sp(1, max_new, temperature, top_k, top_p, [key_id])
    cache, tokens = common.prefill_for(
        self.decoder,
        self.model.params,
        prompt_arr,
        len_arr,
        sp1,
        cfg=self.cfg,
        total=self.total,
        random_init=self.random_init,
        mesh=self.mesh,
    )
    return sharding.entry(self.decoder.init, self.mesh)(cache, tokens, len_arr, sp1, **self.decoder.init_kw)

  def _empty_state(self):
    """B idle slots (all done): a one-token request's fresh state repeated B times along the batch axes, so
    that the engine reuses the batch-of-one prefill and init programs that admission compiles anyway."""
    fresh = self._fresh([0], 1, 0.0, 0, 1.0, 0)
    return tile_slots(fresh, slots=self.config.slots)

  # ----- submission (any thread) --------------------------------------------------------------------
  def validate(self, req: Request, score_only: bool = False) -> Request:
    """Checks a request against the model and this engine; raises RequestError naming the field.
    score_only: the prompt is scored, not continued (it may fill the whole context)."""
    cfg = self.cfg
    mt = req.max_tokens
    if isinstance(mt, bool) or not isinstance(mt, (int, np.integer)) or mt < 1:
      raise RequestError(f"max_tokens must be an integer >= 1, got {mt!r}", "max_tokens")
    p = req.prompt
    if isinstance(p, (str, bytes)) or not isinstance(p, (list, tuple, np.ndarray)) or len(p) == 0:
      raise RequestError("prompt must be a non-empty list of token ids", "prompt")
    if (
        len(p) + (0 if score_only else int(mt)) > self.total
    ):  # before the per-token check: a huge prompt is refused at once
      raise RequestError(
          f"the prompt has {len(p)} tokens; with max_tokens={mt} it exceeds the context of {self.total} positions",
          "max_tokens" if len(p) < self.total else "prompt",
      )
    for t in p:
      if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) < cfg.vocab_size:
        raise RequestError(f"prompt has token id {t!r} outside the vocabulary [0, {cfg.vocab_size})", "prompt")
    t = req.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t < float("inf"):
      raise RequestError(f"temperature must be a number >= 0, got {t!r}", "temperature")
    if self.config.greedy_only and t > 0:
      raise RequestError("this engine was started greedy-only (temperature must be 0)", "temperature")
    k = req.top_k
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
      raise RequestError(f"top_k must be an integer >= 0, got {k!r}", "top_k")
    tp = req.top_p
    if isinstance(tp, bool) or not isinstance(tp, (int, float)) or not 0.0 < tp <= 1.0:
      raise RequestError(f"top_p must be in (0, 1], got {tp!r}", "top_p")
    s = req.seed
    if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s <= MAX_SEED):
      raise RequestError(f"seed must be an integer in [0, {MAX_SEED}], got {s!r}", "seed")
    stop = req.stop
    stop = [stop] if isinstance(stop, str) else list(stop) if isinstance(stop, (list, tuple)) else stop or []
    if not isinstance(stop, list) or any(not isinstance(x, str) or not x for x in stop) or len(stop) > MAX_STOPS:
      raise RequestError(
          f"stop must be a string or a list of at most {MAX_STOPS} non-empty strings, got {req.stop!r}", "stop"
      )
    if stop and self.model.tokenizer is None:
      raise RequestError("stop strings need a model with a tokenizer", "stop")
    return dataclasses.replace(
        req,
        prompt=[int(x) for x in p],
        max_tokens=int(mt),
        temperature=float(t),
        top_k=int(k),
        top_p=float(tp),
        stop=stop,
    )

  def submit(self, req: Request, on_chunk: Optional[Callable] = None) -> Sequence_:
    """Validates and queues a request; raises RequestError (bad input) or QueueFullError (queue full).

    on_chunk(seq, chunk) is called on the engine's thread after each step that emitted something for it.
    """
    req = self.validate(req)
    with self._lock:
      if self.failure is not None:
        raise EngineFailedError(f"the engine failed ({self.failure}); the server must be restarted")
      if len(self._waiting) >= self.config.max_queue:
        with self.metrics.lock:
          self.metrics.rejected += 1
        raise QueueFullError(
            f"the waiting queue is full ({self.config.max_queue} requests waiting, {self.config.slots} slots busy)"
        )
      key_id = req.seed if req.seed is not None else int(self._rng.integers(0, MAX_SEED))
      seq = Sequence_(id=next(self._ids), request=req, key_id=key_id, on_chunk=on_chunk, t_submit=time.perf_counter())
      self._waiting.append(seq)
      self._wake.notify_all()
    return seq

  def cancel(self, seq: Sequence_) -> None:
    """Cancels a request (waiting or running); its slot is freed at the next step."""
    with self._lock:
      seq.cancelled = True
      self._wake.notify_all()

  # ----- introspection ------------------------------------------------------------------------------
  @property
  def running(self) -> int:
    return sum(s is not None for s in self._slots)

  @property
  def waiting(self) -> int:
    return len(self._waiting)

  def idle(self) -> bool:
    with self._lock:
      return not self._waiting and self.running == 0

  # ----- the host loop (one thread) -----------------------------------------------------------------
  def step(self) -> bool:
    """Cancel, admit, run one bounded device call, emit and retire. Returns False when there was nothing to run."""
    with self._lock:
      cancelled = [s for s in self._slots if s is not None and s.cancelled]
      for s in [s for s in self._waiting if s.cancelled]:
        self._waiting.remove(s)
        self._finish(s, "cancelled")
    for s in cancelled:
      self.state = finish_slot(self.state, jnp.int32(s.slot))
      self._retire(s, "cancelled")
    with self._lock:
      admit = []
      while self._waiting and self.running + len(admit) < self.config.slots:
        admit.append(self._waiting.popleft())
    for s in admit:
      self._admit(s)
    if self.running == 0:
      return False
    t0 = time.perf_counter()
    sp = self._loop_sp()
    self.state = sharding.entry(self.decoder.loop, self.mesh)(self.model.params, self.state, sp, **self.decoder.loop_kw)
    tokens, n_new, done, counters = jax.device_get(
        (self.state.tokens, self.state.n_new, self.state.done, slots_lib.counters(self.state))
    )
    now = time.perf_counter()
    with self.metrics.lock:
      self.metrics.busy_seconds += now - t0
      self.metrics.calls += 1
    self._account(counters)
    for slot, seq in enumerate(self._slots):
      if seq is None:
        continue
      start = int(self._prompt_len[slot]) + len(seq.tokens)
      new = tokens[slot, start : int(self._prompt_len[slot]) + int(n_new[slot])].tolist()
      reason = None
      if done[slot]:
        reason = "stop" if self.eos_id is not None and new and new[-1] == self.eos_id else "length"
      self._emit(seq, new, reason, now)
    return True

  def _admit(self, seq: Sequence_) -> None:
    r = seq.request
    slot = self._slots.index(None)
    fresh = self._fresh(list(r.prompt), r.max_tokens, r.temperature, r.top_k, r.top_p, seq.key_id)
    shift = (int(jax.device_get(self.state.iterations)) % self.n_groups) * self.width
    self.state = insert_slot(self.state, fresh, jnp.int32(slot), jnp.int32(shift))
    self._temperature[slot], self._top_k[slot], self._top_p[slot] = r.temperature, r.top_k, r.top_p
    self._key_ids[slot], self._max_new[slot], self._prompt_len[slot] = seq.key_id, r.max_tokens, len(r.prompt)
    self._prev_counters[slot] = 0
    seq.slot, seq.t_admit = slot, time.perf_counter()
    self._slots[slot] = seq
    with self.metrics.lock:
      self.metrics.admitted += 1

  def _emit(self, seq: Sequence_, new: list, reason: Optional[str], now: float) -> None:
    """Appends new tokens, applies stop strings token by token (the tokens and text end at the first token that
    completes one), holds back text that may still become a stop string, calls back, retires when finished."""
    if not new and reason is None:
      return
    self.metrics.add_tokens(now, len(new))
    old = len(seq.tokens)
    seq.tokens += new
    text_new = ""
    if self.model.tokenizer is not None:
      reason, text_new = self._apply_text(seq, reason)
      new = seq.tokens[old:]  # a stop string may have cut tokens this call committed
    if new:
      seq.chunk_times.append((now, len(new)))
      if seq.t_first is None:
        seq.t_first = now
    if reason is not None and seq.slot >= 0 and not self.state_done(seq.slot):
      self.state = finish_slot(self.state, jnp.int32(seq.slot))  # a stop string: stop decoding it
    chunk = Chunk(tokens=new, text=text_new, finished=reason is not None, finish_reason=reason)
    if reason is not None:
      self._retire(seq, reason, chunk)
    elif seq.on_chunk is not None:
      seq.on_chunk(seq, chunk)

  def _apply_text(self, seq: Sequence_, reason: Optional[str]) -> tuple:
    """(reason, text to send now) after `seq.tokens` grew: a stop string cuts the tokens after the token that
    completed it and the text where it starts; unfinished text keeps back what may still become one."""
    stops = seq.request.stop
    eos_end = bool(seq.tokens) and seq.tokens[-1] == self.eos_id and reason == "stop"
    body = seq.tokens[:-1] if eos_end else seq.tokens
    hit = text_lib.first_stop(self.model.decode, body, stops, seq.scanned)
    if hit is not None:
      k, cut = hit
      del seq.tokens[k:]
      seq.scanned, reason = k, "stop"
      text = self.model.decode(seq.tokens)[:cut]
    else:
      seq.scanned = len(body)
      text = self.model.decode(body)
    seq.text = text
    send_to = len(text) if reason is not None else len(text) - text_lib.held_back(text, stops)
    text_new = text[seq.sent_chars : max(send_to, seq.sent_chars)]
    seq.sent_chars = max(send_to, seq.sent_chars)
    return reason, text_new

  def state_done(self, slot: int) -> bool:
    return bool(jax.device_get(self.state.done[slot]))

  def _retire(self, seq: Sequence_, reason: str, chunk: Optional[Chunk] = None) -> None:
    self._slots[seq.slot] = None
    seq.done_call = self.metrics.calls
    self._finish(seq, reason, chunk)

  def _finish(self, seq: Sequence_, reason: str, chunk: Optional[Chunk] = None) -> None:
    seq.finished, seq.finish_reason, seq.t_done = True, reason, time.perf_counter()
    with self.metrics.lock:
      self.metrics.finished[reason] += 1
    if seq.on_chunk is not None:
      seq.on_chunk(seq, chunk or Chunk(tokens=[], text="", finished=True, finish_reason=reason))
    seq.done_event.set()

  def _account(self, counters) -> None:
    """Engine-wide counters (tokens, LoopSpec / chain acceptance, live lanes) from the per-slot ones, which
    restart at zero when a slot is admitted."""
    counters = np.asarray(counters, np.int64)
    live, total = 0, np.zeros_like(self.metrics.counters)
    for slot, seq in enumerate(self._slots):
      if seq is None:
        continue
      total += counters[slot, :-1] - self._prev_counters[slot]
      self._prev_counters[slot] = counters[slot, :-1]
      live += int(counters[slot, -1])
    with self.metrics.lock:
      self.metrics.counters = self.metrics.counters + total
      self.metrics.last_live_lanes = float(live)

  # ----- drivers ------------------------------------------------------------------------------------
  def run_until_idle(self, max_steps: int = 1_000_000) -> None:
    """Steps until no request is waiting or running (in process; tests and the benchmark)."""
    for _ in range(max_steps):
      if not self.step() and self.idle():
        return
    raise RuntimeError("run_until_idle did not finish")

  def start(self) -> None:
    """Runs `step` on a background thread until `stop()`; it sleeps while there is nothing to do."""
    if self._thread is not None:
      return
    self._stop = False

    def loop():
      while not self._stop:
        try:
          ran = self.step()
        except BaseException as e:  # noqa: BLE001 (whatever it was, the requests must not hang)
          self.fail(e)
          return
        if not ran:
          with self._lock:
            if not self._stop and not self._waiting and not any(s is not None and s.cancelled for s in self._slots):
              self._wake.wait(timeout=0.5)

    self._thread = threading.Thread(target=loop, name="loopspec-engine", daemon=True)
    self._thread.start()

  def fail(self, exc: BaseException) -> None:
    """The loop died: logs the cause, records it (`failure`, `failed`), and finishes every waiting and running
    request with reason 'error' (their callbacks and events fire, so no handler waits for ever). The device
    state may be half-updated, so the engine serves nothing more: the process is meant to exit and be
    restarted (experiments/serve.py exits non-zero)."""
    log.error("the engine loop failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    with self._lock:
      self.failure = f"{type(exc).__name__}: {exc}"
      seqs = [s for s in self._slots if s is not None] + list(self._waiting)
      self._waiting.clear()
      self._slots = [None] * self.config.slots
      self._wake.notify_all()
    for seq in seqs:
      if not seq.finished:
        try:
          self._finish(seq, "error")
        except Exception:  # noqa: BLE001 (a callback's loop may be gone; the others still get theirs)
          log.exception("finishing request %d after the engine failed", seq.id)
    self.failed.set()

  def stop(self) -> None:
    with self._lock:
      self._stop = True
      self._wake.notify_all()
    if self._thread is not None:
      self._thread.join()
      self._thread = None

  def generate(self, req: Request) -> Sequence_:
    """Submits one request and waits for it (the engine must be `start()`ed, or this runs it in process)."""
    seq = self.submit(req)
    if self._thread is None:  # in process: a failing step raises here
      while not seq.finished:
        self.step()
    seq.done_event.wait()
    return seq

  # ----- metrics ------------------------------------------------------------------------------------
  def mean_accepted_length(self) -> float:
    return metrics_lib.mean_accepted_length(self)

  def gate_open_rate(self) -> float:
    return metrics_lib.gate_open_rate(self.metrics)

  def prometheus(self) -> str:
    """The metrics in Prometheus text format (docs/serving.md)."""
    return metrics_lib.prometheus(self)
