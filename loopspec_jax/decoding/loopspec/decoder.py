"""LoopSpec as a decoder: host-side statistics and `make_decoder` (the jitted loop is `tick.decode_loop`)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import numpy as np

from loopspec_jax.config import ModelConfig
from loopspec_jax.analysis import theory
from loopspec_jax.decoding import common
from loopspec_jax.decoding.method import Method
from loopspec_jax.decoding.loopspec import second as second_lib
from loopspec_jax.decoding.loopspec import state as S
from loopspec_jax.decoding.loopspec.tick import decode_loop


def summarize(st: S.LoopSpecState, cfg: ModelConfig, shape: S.PipelineShape) -> common.DecodeStats:
  """Raw counts of a LoopSpec run (per-request lane counters; figures: `LoopSpec.derived`)."""
  s = st.stats
  rows = ("ticks", "first", "second", "restart", "last_source", "reject_first", "gate_evals", "gate_opens")
  rows += ("skipped_first", "skipped_second", "live_sum", "cols_sum")
  rows += ("decode_reject_first", "second_verify", "second_accept", "first_token_ticks")
  return common.DecodeStats.of_loop(
      "loopspec",
      st,
      shape.d1,
      settings={
          "recurrence": cfg.recurrence,
          "d1": shape.d1,
          "d2": shape.d2,
          "gate_mass": shape.gate_mass,
          "second_kind": shape.second if shape.d2 is not None else None,
          "gate": shape.gate if shape.d2 is not None else None,
          "lane_capacity": shape.n_lanes,
          "stage_width": shape.width,
      },
      per_request={k: getattr(s, k) for k in rows},
      maxima={
          "max_live_lanes": np.asarray(s.live_max).max(),
          "max_stage_demand": np.asarray(s.demand_max).max(),
          "ticks_max": np.asarray(s.ticks).max(),
      },
  )


def make_decoder(
    cfg: ModelConfig,
    *,
    greedy: bool,
    random_init: bool,
    d1,
    d2,
    lane_capacity,
    gate_mass=None,
    dynamic_width=True,
    second=None,
    gate=None,
) -> common.Decoder:
  """dynamic_width=False: every tick computes all W lane columns of every stage (the reference the dynamic
  width, `PipelineShape.ladder`, must equal token for token). second / gate: the ablation variants
  (`loopspec.second`; None: the paper's gated residual)."""
  second, gate = second_lib.normalize_second(second), second_lib.normalize_gate(gate)
  S.validate(cfg, d1, d2, lane_capacity, gate_mass, second, gate)
  d1 = int(d1)
  d2 = None if d2 is None else int(d2)
  width = S.stage_width(cfg.recurrence, d1, d2, lane_capacity)
  shape = S.PipelineShape(
      cfg.recurrence,
      d1,
      d2,
      width,
      float(gate_mass or 0.0),
      bool(dynamic_width),
      second=second or "residual",
      gate=True if gate is None else gate,
  )
  return common.Decoder(
      name="loopspec",
      readout_depths=shape.readouts,
      cache_group=d1,
      extra_positions=1,
      init=S.initial_state,
      loop=decode_loop,
      stats=functools.partial(summarize, cfg=cfg, shape=shape),
      init_kw={"cfg": cfg, "shape": shape, "greedy": greedy},
      loop_kw={"cfg": cfg, "shape": shape, "greedy": greedy, "random_init": random_init},
  )


@dataclasses.dataclass(frozen=True)
class LoopSpec(Method):
  """LoopSpec: first proposals at depth `d1`, a gated second proposal at `d2` (None: none), verified at R while
  later tokens are drafted; `lane_capacity` bounds the lane table (an int, or "worst": skip-free), `gate_mass`
  tightens the sampled gate; `second` ("residual" | "masked") and `gate` (True | False) are the paper's
  Table-3 ablation variants (`loopspec.second`), exact like the default (residual, gated).

  The release's "K:X" spelling (d1 = K, d2 = K * X; "K" alone: no second proposal) is accepted as d1:
  'loopspec:2:4' == 'loopspec:2,8'."""

  name = "loopspec"
  positional = ("d1", "d2")
  build_decoder = staticmethod(make_decoder)
  d1: Optional[int] = None
  d2: Optional[int] = None
  lane_capacity: Optional[int] = None
  gate_mass: Optional[float] = None
  second: Optional[str] = None
  gate: Optional[bool] = None

  def __post_init__(self):
    if isinstance(self.d1, str) and ":" in self.d1:
      d1, d2 = release_depths(self.d1)
      if self.d2 is not None and self.d2 != d2:
        raise ValueError(f"d1={self.d1!r} (the release's K:X) gives d2={d2}, but d2={self.d2} was given too")
      object.__setattr__(self, "d1", d1)
      object.__setattr__(self, "d2", d2)
    object.__setattr__(self, "second", second_lib.normalize_second(self.second))
    object.__setattr__(self, "gate", second_lib.normalize_gate(self.gate))

  def validate(self, cfg: ModelConfig) -> None:
    S.validate(cfg, self.d1, self.d2, self.lane_capacity, self.gate_mass, self.second, self.gate)

  @classmethod
  def derived(cls, stats) -> dict:
    """The release's mean accepted length (its cost identity, `theory.gamma_from_counts`), tokens per R
    steps on the per-request tick clock, and the mean live lanes per request tick."""
    st, n = stats.settings, stats.tokens
    r, d1 = st["recurrence"], st["d1"]
    second, restart, ticks = stats.count("second"), stats.count("restart"), stats.count("ticks")
    return {
        "mean_accepted_length": theory.gamma_from_counts(r, d1, st["d2"], n, second + restart, restart) if n else 0.0,
        "tokens_per_r_steps": r * n / max(ticks * d1, 1),
        "request_ticks": ticks,
        "mean_live_lanes": stats.count("live_sum") / max(ticks, 1),
        # model rows a tick computes per request alone: R/d1 stages x the ladder width its own live lanes need
        # (a batch runs each tick at its widest request's width)
        "mean_computed_lanes": (r // d1) * stats.count("cols_sum") / max(ticks, 1),
        # no verify pass of its own: its accepted length is mean_accepted_length; acceptance is the share of
        # commits whose next lane came from a proposal
        "tokens_per_pass": None,
        "acceptance": (stats.count("first") + stats.count("second")) / max(n, 1),
        "draft_cost_share": None,
        **release_figures(stats),
    }


def release_depths(text: str) -> tuple:
  """The release's "K:X" config name -> (d1, d2) = (K, K * X); "K" -> (K, None). Raven "2:4" = (2, 8)."""
  parts = str(text).strip().split(":")
  if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
    raise ValueError(f"the release's depth spelling is 'K' or 'K:X' with integers K, X; got {text!r}")
  k = int(parts[0])
  return (k, None) if len(parts) == 1 else (k, k * int(parts[1]))


def release_figures(stats) -> dict:
  """The release's figures (its `generation_metrics`), labelled `release_*`: over decode tokens only (every
  commit after a request's first, which the release samples at prefill), each first rejection split into
  second-skip (no second proposal) / second-accept / second-reject, gamma from those counts (its
  `cycle_accept_length`), and decode time after the first token, estimated here as the share of the
  request's ticks after its first commit (batch 1, as the release runs; one loop on device, no host clock
  inside it). `mean_accepted_length` / `decode_seconds` are our older figures over every token."""
  st, n = stats.settings, stats.tokens
  r, d1, d2 = st["recurrence"], st["d1"], st["d2"]
  started = sum(1 for t in stats.per_request.get("tokens", []) if t > 0)
  decode_tokens = n - started
  reject = stats.count("decode_reject_first")
  verified, accepted = stats.count("second_verify"), stats.count("second_accept")
  skip, rejected2 = reject - verified, verified - accepted
  gamma = theory.gamma_from_counts(r, d1, d2, decode_tokens, reject, skip + rejected2) if decode_tokens > 0 else 0.0
  ticks = stats.count("ticks")
  after = (ticks - stats.count("first_token_ticks")) / max(ticks, 1)
  secs = stats.totals.get("decode_seconds", 0.0) * after
  return {
      "release_decode_tokens": decode_tokens,
      "release_first_accept": decode_tokens - reject,
      "release_first_reject": reject,
      "release_second_skip": skip,
      "release_second_accept": accepted,
      "release_second_reject": rejected2,
      "release_gamma": gamma,
      "release_decode_seconds_est": secs,
      "release_tokens_per_second_est": decode_tokens / secs if secs > 0 else 0.0,
  }
