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
  host    read tokens / length / n_new / done, emit each slot's newly committed tokens, check stop strings on
          the decoded text, retire finished slots (eos, max_tokens, stop string, cancel)

The decode loop compiles once per engine configuration (method, depths, slots, context, greedy kernels or
not); prefill compiles once per 16-token prompt bucket (the buckets `generate` uses).

Exactness: a request's tokens depend only on its prompt, settings and key (the per-(request, position,
purpose) keys of every decoder; LoopSpec's lane table is rotated to the stage clock at admission), so they are
the same whatever else is in the batch and whenever it was admitted. A request with `seed=s` samples what
`generate(..., seed=<engine seed>, request_ids=[s])` samples; temperature 0 is greedy.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import threading
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax import api
from loopspec_jax.analysis import theory
from loopspec_jax.decoding import common
from loopspec_jax.parallel import logical
from loopspec_jax.parallel import sharding

MAX_SEED = 2**31 - 1


class RequestError(ValueError):
  """A request the engine refuses at submission; `param` names the offending field (OpenAI's error.param)."""

  def __init__(self, message: str, param: Optional[str] = None):
    super().__init__(message)
    self.param = param


class QueueFullError(RuntimeError):
  """The waiting queue is full: the request was refused (not dropped)."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Static configuration of an engine: one compiled decode loop per distinct value.

  method / d1 / d2 / gamma / lane_capacity: as `generate`. slots: B request slots. max_queue: waiting requests
  beyond which `submit` refuses. ticks_per_call: loop iterations per device call (AR: tokens, chain: rounds,
  LoopSpec: ticks). greedy_only: compile the greedy kernels (no distributions) and refuse temperature > 0;
  otherwise the sampled kernels run for every slot and temperature-0 slots decode greedily inside them.
  max_len: context per slot (prompt + max_tokens; default the model's). eos_id: -1 for none, None for the
  model config's. seed: the engine's base key.
  """

  method: str = "loopspec"
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
  finish_reason: Optional[str]  # 'stop' (eos or a stop string), 'length', 'cancelled'


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
# Device-side slot operations (jitted once per engine configuration)
# ---------------------------------------------------------------------------------------------------
@functools.partial(jax.jit, donate_argnames=("state",))
def insert_slot(state, fresh, slot, lane_shift):
  """Writes a batch-of-one decode state `fresh` into row `slot` (traced) of every [.., B, ..] leaf of `state`.

  The leaves' batch axis is found from their declared logical axes; leaves without one (the loop's iteration
  counter, LoopSpec's stage clock) keep the engine's value. `lane_shift` (traced) rolls every 'lanes' axis of
  the fresh state: LoopSpec's `initial_state` puts the root lane in the stage of depth group 0 at tick 0, and
  a request admitted at tick t needs it in that of tick t (stage ids shift by t mod G, times W lanes).
  """

  def put(path, x, y):
    axes = logical.leaf_axes(state, path, x)
    if "batch" not in axes:
      return x
    for i, name in enumerate(axes):
      if name == "lanes":
        y = jnp.roll(y, lane_shift, axis=i)
    return jax.lax.dynamic_update_slice_in_dim(x, y.astype(x.dtype), slot, axis=axes.index("batch"))

  return jax.tree_util.tree_map_with_path(put, state, fresh)


@functools.partial(jax.jit, static_argnames=("slots",))
def tile_slots(fresh, *, slots: int):
  """A state of `slots` idle slots from a batch-of-one state: repeated along every batch axis, all done."""

  def rep(path, x):
    axes = logical.leaf_axes(fresh, path, x)
    return jnp.repeat(x, slots, axis=axes.index("batch")) if "batch" in axes else x

  state = jax.tree_util.tree_map_with_path(rep, fresh)
  return state.replace(done=jnp.ones_like(state.done))


@functools.partial(jax.jit, donate_argnames=("state",))
def finish_slot(state, slot):
  """Marks slot `slot` done (a cancelled or stop-string request): it commits nothing more, its lanes die."""
  return state.replace(done=state.done.at[slot].set(True))


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
    method_args = {"d1": config.d1, "d2": config.d2, "gamma": config.gamma, "lane_capacity": config.lane_capacity}
    self.random_init = config.init_state == "random"
    self.decoder = api._make_decoder(config.method, cfg, config.greedy_only, self.random_init, method_args)
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
    self.metrics = EngineMetrics(method=config.method)
    self._prev_counters = np.zeros((b, len(_COUNTERS)), np.int64)
    self._sp_base = None
    self.state = self._empty_state()

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
    tp, _ = common.buckets([len(prompt)], 0, self.cfg)
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
  def validate(self, req: Request) -> Request:
    """Checks a request against the model and this engine; raises RequestError naming the field."""
    cfg = self.cfg
    mt = req.max_tokens
    if isinstance(mt, bool) or not isinstance(mt, (int, np.integer)) or mt < 1:
      raise RequestError(f"max_tokens must be an integer >= 1, got {mt!r}", "max_tokens")
    p = req.prompt
    if isinstance(p, (str, bytes)) or not isinstance(p, (list, tuple, np.ndarray)) or len(p) == 0:
      raise RequestError("prompt must be a non-empty list of token ids", "prompt")
    for t in p:
      if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) < cfg.vocab_size:
        raise RequestError(f"prompt has token id {t!r} outside the vocabulary [0, {cfg.vocab_size})", "prompt")
    if len(p) + int(mt) > self.total:
      raise RequestError(
          f"the prompt has {len(p)} tokens; with max_tokens={mt} it exceeds the context of {self.total} positions",
          "max_tokens" if len(p) < self.total else "prompt",
      )
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
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or ())
    if any(not isinstance(x, str) or not x for x in stop) or len(stop) > 4:
      raise RequestError("stop must be a string or a list of at most 4 non-empty strings", "stop")
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
      if len(self._waiting) >= self.config.max_queue:
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
        (self.state.tokens, self.state.n_new, self.state.done, _counters(self.state))
    )
    now = time.perf_counter()
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
    self.metrics.admitted += 1

  def _emit(self, seq: Sequence_, new: list, reason: Optional[str], now: float) -> None:
    """Appends new tokens, decodes text, applies stop strings, calls back, retires the slot when finished."""
    if not new and reason is None:
      return
    seq.tokens += new
    text_new = ""
    if self.model.tokenizer is not None:
      body = seq.tokens[:-1] if reason == "stop" and seq.tokens and seq.tokens[-1] == self.eos_id else seq.tokens
      text = self.model.decode(body)
      hit = _find_stop(
          text, seq.request.stop, max(0, seq.sent_chars - max((len(x) for x in seq.request.stop), default=0))
      )
      if hit is not None:
        text, reason = text[:hit], "stop"
      elif reason is None and text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the rest
        text = text[: len(text.rstrip("\ufffd"))]
      seq.text = text
      text_new = text[seq.sent_chars :]
      seq.sent_chars = len(text)
    if new:
      seq.chunk_times.append((now, len(new)))
      if seq.t_first is None:
        seq.t_first = now
    self.metrics.tokens += len(new)
    self.metrics.window.append((now, len(new)))
    if reason is not None and seq.slot >= 0 and not self.state_done(seq.slot):
      self.state = finish_slot(self.state, jnp.int32(seq.slot))  # a stop string: stop decoding it
    chunk = Chunk(tokens=new, text=text_new, finished=reason is not None, finish_reason=reason)
    if reason is not None:
      self._retire(seq, reason, chunk)
    elif seq.on_chunk is not None:
      seq.on_chunk(seq, chunk)

  def state_done(self, slot: int) -> bool:
    return bool(jax.device_get(self.state.done[slot]))

  def _retire(self, seq: Sequence_, reason: str, chunk: Optional[Chunk] = None) -> None:
    self._slots[seq.slot] = None
    self._finish(seq, reason, chunk)

  def _finish(self, seq: Sequence_, reason: str, chunk: Optional[Chunk] = None) -> None:
    seq.finished, seq.finish_reason, seq.t_done = True, reason, time.perf_counter()
    self.metrics.finished[reason] += 1
    if seq.on_chunk is not None:
      seq.on_chunk(seq, chunk or Chunk(tokens=[], text="", finished=True, finish_reason=reason))
    seq.done_event.set()

  def _account(self, counters) -> None:
    """Engine-wide counters (tokens, LoopSpec / chain acceptance, live lanes) from the per-slot ones, which
    restart at zero when a slot is admitted."""
    counters = np.asarray(counters, np.int64)
    live = 0
    for slot, seq in enumerate(self._slots):
      if seq is None:
        continue
      self.metrics.counters += counters[slot, :-1] - self._prev_counters[slot]
      self._prev_counters[slot] = counters[slot, :-1]
      live += int(counters[slot, -1])
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
        ran = self.step()
        if not ran:
          with self._lock:
            if not self._stop and not self._waiting and not any(s is not None and s.cancelled for s in self._slots):
              self._wake.wait(timeout=0.5)

    self._thread = threading.Thread(target=loop, name="loopspec-engine", daemon=True)
    self._thread.start()

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
    if self._thread is None:
      while not seq.finished:
        self.step()
    seq.done_event.wait()
    return seq

  # ----- metrics ------------------------------------------------------------------------------------
  def mean_accepted_length(self) -> float:
    c = dict(zip(_COUNTERS, self.metrics.counters.tolist()))
    r, n = self.cfg.recurrence, c["n_new"]
    if n == 0:
      return 0.0
    if self.config.method == "loopspec":
      shape = self.decoder.init_kw["shape"]
      return theory.gamma_from_counts(r, shape.d1, shape.d2, n, c["second"] + c["restart"], c["restart"])
    if self.config.method == "chain":
      return theory.chain_accepted_length(r, self.config.d1, self.config.gamma, n, c["rounds"])
    return 1.0

  def gate_open_rate(self) -> float:
    c = dict(zip(_COUNTERS, self.metrics.counters.tolist()))
    return c["gate_opens"] / max(c["gate_evals"], 1)

  def prometheus(self) -> str:
    """The metrics in Prometheus text format (docs/serving.md)."""
    m = self.metrics
    now = time.perf_counter()
    while m.window and m.window[0][0] < now - m.window_seconds:
      m.window.popleft()
    rate = sum(n for _, n in m.window) / m.window_seconds
    lines = []

    def metric(name, kind, help_, value, labels=""):
      lines.extend([f"# HELP loopspec_{name} {help_}", f"# TYPE loopspec_{name} {kind}"])
      for lab, val in value if isinstance(value, list) else [(labels, value)]:
        lines.append(f"loopspec_{name}{lab} {float(val):.6g}")

    metric("requests_running", "gauge", "Requests holding a slot.", self.running)
    metric("requests_waiting", "gauge", "Requests in the waiting queue.", self.waiting)
    metric("slots", "gauge", "Request slots of the engine.", self.config.slots)
    metric("tokens_per_second", "gauge", f"Generated tokens per second over the last {m.window_seconds:g} s.", rate)
    metric("generated_tokens_total", "counter", "Tokens generated.", m.tokens)
    metric("busy_seconds_total", "counter", "Seconds spent in device calls.", m.busy_seconds)
    metric(
        "requests_finished_total",
        "counter",
        "Finished requests by reason.",
        [(f'{{reason="{k}"}}', v) for k, v in sorted(m.finished.items())] or [('{reason="stop"}', 0)],
    )
    metric("requests_rejected_total", "counter", "Submissions refused because the queue was full.", m.rejected)
    metric("mean_accepted_length", "gauge", "Tokens per full R-step execution (1 for AR).", self.mean_accepted_length())
    metric("gate_open_rate", "gauge", "Fraction of LoopSpec second-proposal gates that opened.", self.gate_open_rate())
    metric("lanes_live", "gauge", "Live LoopSpec lanes over all slots after the last device call.", m.last_live_lanes)
    return "\n".join(lines) + "\n"


_COUNTERS = ("n_new", "first", "second", "restart", "gate_evals", "gate_opens", "rounds", "accepted")


@jax.jit
def _counters(state):
  """[B, len(_COUNTERS) + 1] int32: the per-slot counters of any method's state (0 where a method has none),
  then the slot's live LoopSpec lanes."""
  zero = jnp.zeros_like(state.n_new)
  st = getattr(state, "stats", None)
  get = lambda name: getattr(st, name, None) if st is not None and hasattr(st, name) else getattr(state, name, None)
  cols = [zero if get(n) is None else get(n) for n in _COUNTERS]
  lanes = getattr(state, "lanes", None)
  cols.append(zero if lanes is None else jnp.sum(lanes.alive & ~state.done[:, None], axis=1))
  return jnp.stack([c.astype(jnp.int32) for c in cols], axis=1)


def _find_stop(text: str, stops, start: int) -> Optional[int]:
  """Index of the earliest stop string in text[start:] (None when none occurs)."""
  hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
  return min(hits) if hits else None


@dataclasses.dataclass
class EngineMetrics:
  method: str
  tokens: int = 0
  calls: int = 0
  admitted: int = 0
  rejected: int = 0
  busy_seconds: float = 0.0
  last_live_lanes: float = 0.0
  window_seconds: float = 10.0
  finished: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  counters: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(_COUNTERS), np.int64))
  window: collections.deque = dataclasses.field(default_factory=collections.deque)
