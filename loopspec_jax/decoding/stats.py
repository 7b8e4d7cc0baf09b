"""Typed decode statistics: raw counts that add across batches and runs; figures derived in one place.

A decoder's final loop state becomes a `DecodeStats` of raw counts only:
- `per_request`: a list per counter with one entry per request (tokens, rounds, accepted, ticks, ...),
- `totals`: counters of the whole batched loop (iterations, core-step calls, layer calls, seconds),
- `maxima`: counters combined by max (the most live lanes seen),
- `settings`: the static configuration (d1, gamma, R, ...), equal for every run that is added,
- `planned`: the run was decoded by the planner (`method="auto"`), whose picks differ from call to call.
`a + b` (and `sum(stats_list, start)`, `DecodeStats.total(stats_list)`) concatenates the per-request lists and
sums the totals, so a benchmark's many `generate` calls become one `DecodeStats`. Derived figures (accepted
length, acceptance rate, tokens per second, ...) come from `summary()`: the figures every method shares here,
the method's own from its class's `derived` (`decoding.method.Method`); no caller recomputes them. This module
sits below every method: the registry (`loopspec_jax.methods`) hands each method's `derived` down into
`DERIVED` as it registers the class, so nothing here imports a method or the registry.

Runs of different methods or configurations do not add (a benchmark row must not silently mix them), except
runs the planner made: `auto`'s picks depend on the request and on measured probe times, so the runs of one
`auto` row (several prompts, or the two segments of a re-planned call, `then`) combine into method "auto"
with no settings and the figures every method shares; which method ran where is in each call's stats["plan"].
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List

import numpy as np

# method name -> its class's `derived(stats) -> dict`, filled by the registry (`loopspec_jax.methods`)
DERIVED: Dict[str, Callable[["DecodeStats"], dict]] = {}


def _plain(x):
  """numpy scalars / arrays -> Python ints, floats and lists (JSON-ready)."""
  x = np.asarray(x)
  return x.tolist()


@dataclasses.dataclass
class DecodeStats:
  """Raw counts of one or more decode runs of one method and configuration (see the module docstring)."""

  method: str
  settings: Dict[str, object] = dataclasses.field(default_factory=dict)
  per_request: Dict[str, List] = dataclasses.field(default_factory=dict)
  totals: Dict[str, float] = dataclasses.field(default_factory=dict)
  maxima: Dict[str, float] = dataclasses.field(default_factory=dict)
  planned: bool = False  # decoded by the planner (method="auto"): runs of other picks may join it

  @classmethod
  def of_loop(
      cls, method: str, state, steps_per_iteration: int, *, settings=None, per_request=None, totals=None, maxima=None
  ) -> "DecodeStats":
    """The counts every final loop state gives (tokens per request, iterations, core-step calls), plus the
    method's own as keywords (arrays or lists per request, scalars for totals and maxima)."""
    iters = int(np.asarray(state.iterations))
    n_new = _plain(state.n_new)
    rows = dict({k: _plain(v) for k, v in (per_request or {}).items()}, tokens=n_new)
    tot = {k: _plain(v) for k, v in (totals or {}).items()}
    tot.update(calls=1, iterations=iters, core_step_calls=iters * steps_per_iteration)
    tot["row_core_steps"] = tot["core_step_calls"] * len(n_new)
    tot.setdefault("prefill_seconds", 0.0)
    tot.setdefault("decode_seconds", 0.0)
    return cls(method, dict(settings or {}), rows, tot, {k: _plain(v) for k, v in (maxima or {}).items()})

  # -- adding ----------------------------------------------------------------------------------------
  def __add__(self, other: "DecodeStats") -> "DecodeStats":
    if not isinstance(other, DecodeStats):
      return NotImplemented
    same = self._config == other._config
    if not same and not (self.planned and other.planned):
      raise ValueError(
          f"cannot add stats of {self.method} {self.settings} and {other.method} {other.settings}: "
          "only runs of one method and configuration add (or runs of the planner, method='auto')"
      )
    pad = lambda s, k: list(s.per_request.get(k, [0] * s.requests))  # a counter one method lacks counts 0
    rows = {k: pad(self, k) + pad(other, k) for k in self._row_keys(other)}
    return self._joined(other, rows, same)

  @property
  def _config(self) -> tuple:
    return self.method, self.settings

  def _joined(self, other: "DecodeStats", rows: dict, same: bool) -> "DecodeStats":
    """These counts and `other`'s with per-request `rows`: totals add, maxima take the max; of two
    configurations (planner runs) method 'auto' with no settings."""
    tot = {k: self.totals.get(k, 0) + other.totals.get(k, 0) for k in {**self.totals, **other.totals}}
    mx = {k: max(self.maxima.get(k, 0), other.maxima.get(k, 0)) for k in {**self.maxima, **other.maxima}}
    method, settings = (self.method, dict(self.settings)) if same else ("auto", {})
    return DecodeStats(method, settings, rows, tot, mx, planned=self.planned and other.planned)

  def _row_keys(self, other) -> list:
    return list(dict.fromkeys(list(self.per_request) + list(other.per_request)))

  def __radd__(self, other):
    return self if other == 0 else NotImplemented  # sum(list_of_stats)

  @staticmethod
  def total(stats: list) -> "DecodeStats":
    """The sum of a non-empty list of DecodeStats."""
    out = stats[0]
    for s in stats[1:]:
      out = out + s
    return out

  def then(self, later: "DecodeStats", live=None) -> "DecodeStats":
    """The counts of the SAME requests decoded on by `later` (a continuation from the tokens these counts
    produced: `planner.Auto` re-planning): per-request counters add request by request (only where `live` [B]
    is true, default all: a request that had finished ran as a one-token dummy), totals add, maxima take the
    max. Of one method and configuration, the result is that method's; of two, method 'auto' (no settings:
    the picks are in the plan), whose derived figures are the common ones. The result is `planned`."""
    n = self.requests
    if later.requests != n:
      raise ValueError(f"then: {later.requests} requests continue {n}")
    live = [True] * n if live is None else [bool(x) for x in live]
    rows = {}
    for k in self._row_keys(later):
      a, b = self.per_request.get(k, [0] * n), later.per_request.get(k, [0] * n)
      rows[k] = [x + (y if keep else 0) for x, y, keep in zip(a, b, live)]
    return dataclasses.replace(self._joined(later, rows, self._config == later._config), planned=True)

  def as_planned(self) -> "DecodeStats":
    """These counts marked as the planner's (`planned`): they may join runs of the planner's other picks."""
    return dataclasses.replace(self, planned=True)

  def drop_requests(self, n: int) -> "DecodeStats":
    """The stats of the first n requests (a mesh pads the batch with dummy requests; they are not counted)."""
    rows = {k: list(v[:n]) for k, v in self.per_request.items()}
    tot = dict(self.totals, padded_requests=self.totals.get("padded_requests", 0) + len(self.per_request["tokens"]) - n)
    return DecodeStats(self.method, dict(self.settings), rows, tot, dict(self.maxima), planned=self.planned)

  # -- reading ---------------------------------------------------------------------------------------
  def count(self, name: str):
    """A raw count: the sum over requests of a per-request counter, else a total (0 if never counted)."""
    if name in self.per_request:
      return sum(self.per_request[name])
    return self.totals.get(name, 0)

  @property
  def requests(self) -> int:
    return len(self.per_request.get("tokens", []))

  @property
  def tokens(self) -> int:
    return self.count("tokens")

  def common_figures(self) -> dict:
    """The figures every method has, from the raw counts."""
    n, iters, secs = self.tokens, self.totals.get("iterations", 0), self.totals.get("decode_seconds", 0.0)
    commits = {k: self.count(k) for k in ("first", "second", "restart")}
    evals = self.count("gate_evals")
    return {
        "method": self.method,
        "batch": self.requests,
        "tokens_generated": n,
        "tokens": n,
        "prefill_seconds": self.totals.get("prefill_seconds", 0.0),
        "decode_seconds": secs,  # after prefill, compiling left out (decoding/compile_clock.py)
        "compile_seconds": self.totals.get("compile_seconds", 0.0),  # spent compiling inside these calls
        "tokens_per_second": n / max(secs, 1e-9),
        "ticks": iters,
        "tokens_per_tick": n / max(iters, 1),
        "core_step_calls": self.totals.get("core_step_calls", 0),
        "core_step_calls_per_token": self.totals.get("row_core_steps", 0) / max(n, 1),
        "commits": commits,
        "gate_open_rate": self.count("gate_opens") / evals if evals else 0.0,
        "skipped_spawns": self.count("skipped_first") + self.count("skipped_second"),
        "mean_accepted_length": 1.0,
        "tokens_per_r_steps": 1.0,
    }

  def pass_figures(self, offered: str, draft_calls: float, verify_calls: float) -> dict:
    """The figures of a method of draft-then-verify rounds, one full-depth verify pass each (draft model, lookup,
    the trees): tokens per pass (= per round = the mean accepted length), accepted drafts per `offered` one (a
    per-request counter: drafts or tree nodes), and drafting's share of the layer calls."""
    per_pass = self.tokens / max(self.count("rounds"), 1)
    acceptance = self.count("accepted") / max(self.count(offered), 1)
    share = draft_calls / max(draft_calls + verify_calls, 1e-9)
    figures = dict(mean_accepted_length=per_pass, tokens_per_round=per_pass, tokens_per_pass=per_pass)
    return dict(figures, acceptance_rate=acceptance, acceptance=acceptance, draft_cost_share=share)

  def summary(self) -> dict:
    """Every figure of these runs: the common ones, the settings, the sums of the per-request counters, the
    maxima and the method's derived figures (its class's `derived`, from `DERIVED`), plus the per-request
    lists."""
    if self.method not in DERIVED:
      raise ValueError(f"no derived figures registered for method {self.method!r} (known: {sorted(DERIVED)})")
    out = self.common_figures()
    out.update(self.settings)
    out.update({k: self.count(k) for k in self.per_request if k not in out})
    out.update({k: v for k, v in self.totals.items() if k not in out})
    out.update(self.maxima)
    out.update(DERIVED[self.method](self))
    out["per_request"] = {k: list(v) for k, v in self.per_request.items()}
    return out
