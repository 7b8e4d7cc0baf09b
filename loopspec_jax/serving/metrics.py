"""The serving engine's metrics: counters kept on the host after each device call, and their Prometheus text.

`EngineMetrics` holds engine-wide sums (tokens, calls, admissions, refusals, finishes by reason, the per-slot
decode counters of `slots.COUNTERS` summed over requests) and a sliding window of (time, tokens) for the
tokens-per-second gauge. `prometheus(engine)` renders them (docs/serving.md).

The engine's thread updates them while HTTP handlers read them: every update and every read holds
`EngineMetrics.lock` (a scrape renders from a snapshot taken under it, so it never iterates a deque or counter
the engine is appending to). Integers are printed exactly (2000001, not `%g`'s 2e+06).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import numpy as np

from loopspec_jax.decoding.stats import DecodeStats
from loopspec_jax.serving.slots import COUNTERS


@dataclasses.dataclass
class EngineMetrics:
  method: str
  tokens: int = 0  # tokens the device committed (including any decoded past a stop string)
  calls: int = 0  # device calls of the decode loop
  admitted: int = 0
  rejected: int = 0
  busy_seconds: float = 0.0
  last_live_lanes: float = 0.0
  window_seconds: float = 10.0
  finished: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  counters: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(COUNTERS), np.int64))
  window: collections.deque = dataclasses.field(default_factory=collections.deque)
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

  def count(self, name: str) -> int:
    return int(self.counters[COUNTERS.index(name)])

  def add_tokens(self, now: float, n: int) -> None:
    """n tokens committed at time `now` (the engine's thread): the total and the tokens/s window."""
    with self.lock:
      self.tokens += n
      self.window.append((now, n))
      while self.window and self.window[0][0] < now - self.window_seconds:
        self.window.popleft()

  def tokens_per_second(self, now: float) -> float:
    """Tokens committed over the last `window_seconds` before `now`, per second (hold `lock`)."""
    return sum(n for t, n in self.window if t >= now - self.window_seconds) / self.window_seconds


def served_stats(engine) -> DecodeStats:
  """The engine's counters summed over every request served, as the `DecodeStats` of one request (the
  method's own `derived` then gives its figures; nothing here re-derives them)."""
  m = engine.metrics
  rows = {name: [m.count(name)] for name in COUNTERS if name != "n_new"}
  rows["tokens"] = [m.count("n_new")]
  # the decoder's name: 'chain' with branch > 1 runs (and is summarised as) 'tree'
  return DecodeStats(engine.decoder.name, dict(engine.stats_settings), rows, {"iterations": m.calls})


def mean_accepted_length(engine) -> float:
  """Tokens per full R-step execution over every request served (the definition `generate`'s stats use)."""
  if engine.metrics.count("n_new") == 0:
    return 0.0
  return float(served_stats(engine).summary()["mean_accepted_length"])


def gate_open_rate(metrics: EngineMetrics) -> float:
  return metrics.count("gate_opens") / max(metrics.count("gate_evals"), 1)


def number(value) -> str:
  """A sample value as Prometheus reads it: integers exactly, floats with every digit (repr)."""
  if isinstance(value, (bool, np.bool_)):
    return str(int(value))
  if isinstance(value, (int, np.integer)):
    return str(int(value))
  return repr(float(value))


def prometheus(engine) -> str:
  """The metrics of `engine` in Prometheus text format (rendered from a snapshot taken under the lock)."""
  m = engine.metrics
  with m.lock:
    rate = m.tokens_per_second(time.perf_counter())
    accepted = mean_accepted_length(engine)
    snap = dataclasses.replace(m, finished=collections.Counter(m.finished), window=collections.deque())
  m, lines = snap, []

  def metric(name, kind, help_, value, labels=""):
    lines.extend([f"# HELP loopspec_{name} {help_}", f"# TYPE loopspec_{name} {kind}"])
    for lab, val in value if isinstance(value, list) else [(labels, value)]:
      lines.append(f"loopspec_{name}{lab} {number(val)}")

  metric(
      "engine_up", "gauge", "1 while the engine loop runs; 0 once it failed (see /health).", int(engine.failure is None)
  )
  metric("requests_running", "gauge", "Requests holding a slot.", engine.running)
  metric("requests_waiting", "gauge", "Requests in the waiting queue.", engine.waiting)
  metric("slots", "gauge", "Request slots of the engine.", engine.config.slots)
  metric("tokens_per_second", "gauge", f"Generated tokens per second over the last {m.window_seconds:g} s.", rate)
  metric("generated_tokens_total", "counter", "Tokens generated.", m.tokens)
  metric("device_calls_total", "counter", "Device calls of the decode loop.", m.calls)
  metric("busy_seconds_total", "counter", "Seconds spent in device calls.", m.busy_seconds)
  metric("requests_admitted_total", "counter", "Requests admitted into a slot.", m.admitted)
  metric(
      "requests_finished_total",
      "counter",
      "Finished requests by reason.",
      [(f'{{reason="{k}"}}', v) for k, v in sorted(m.finished.items())] or [('{reason="stop"}', 0)],
  )
  metric("requests_rejected_total", "counter", "Submissions refused because the queue was full.", m.rejected)
  metric("mean_accepted_length", "gauge", "Tokens per full R-step execution (1 for AR).", accepted)
  metric("gate_open_rate", "gauge", "Fraction of LoopSpec second-proposal gates that opened.", gate_open_rate(m))
  metric("lanes_live", "gauge", "Live LoopSpec lanes over all slots after the last device call.", m.last_live_lanes)
  return "\n".join(lines) + "\n"
