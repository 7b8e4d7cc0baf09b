"""Seconds this process has spent compiling, from jax's own monitoring events, so that a call's timings can
leave compiling out (`run_decoder`: `prefill_seconds` / `decode_seconds` exclude it, `compile_seconds` beside).

jax reports tracing, lowering and XLA compiling of every jitted program as duration events
(`/jax/core/compile/*_duration`); the listener sums them. A read of jax's persistent compilation cache happens
inside the backend-compile span, so it is counted once, there; the cache's own events are not summed (its
`compile_time_saved_sec` is the time a hit saved, not time spent, and its retrieval time is already inside
the span).
Compiling runs synchronously inside the call that needs it, so a call's wall time minus the compile seconds
that elapsed during it is what the same call costs warm (up to first-run effects such as allocation). The
clock is process-wide: a thread that compiles while another call is timed is counted in that call too.
"""

from __future__ import annotations

import jax

_EVENT_PREFIX = "/jax/core/compile/"
_TOTAL = [0.0]


def _on_duration(event: str, seconds: float, **_) -> None:
  if event.startswith(_EVENT_PREFIX) and event.endswith("_duration"):
    _TOTAL[0] += float(seconds)


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def seconds() -> float:
  """Compile seconds of this process so far (read before and after a call: their difference is its own)."""
  return _TOTAL[0]
