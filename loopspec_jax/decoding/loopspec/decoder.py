"""LoopSpec as a decoder: host-side statistics and `make_decoder` (the jitted loop is `tick.decode_loop`)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import numpy as np

from loopspec_jax.config import ModelConfig
from loopspec_jax.analysis import theory
from loopspec_jax.decoding import common
from loopspec_jax.decoding.method import Method
from loopspec_jax.decoding.loopspec import state as S
from loopspec_jax.decoding.loopspec.tick import decode_loop


def summarize(st: S.LoopSpecState, cfg: ModelConfig, shape: S.PipelineShape) -> common.DecodeStats:
  """Raw counts of a LoopSpec run (per-request lane counters; figures: `LoopSpec.derived`)."""
  s = st.stats
  rows = ("ticks", "first", "second", "restart", "last_source", "reject_first", "gate_evals", "gate_opens")
  rows += ("skipped_first", "skipped_second", "live_sum", "cols_sum")
  return common.DecodeStats.of_loop(
      "loopspec",
      st,
      shape.d1,
      settings={
          "recurrence": cfg.recurrence,
          "d1": shape.d1,
          "d2": shape.d2,
          "gate_mass": shape.gate_mass,
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
    cfg: ModelConfig, *, greedy: bool, random_init: bool, d1, d2, lane_capacity, gate_mass=None, dynamic_width=True
) -> common.Decoder:
  """dynamic_width=False: every tick computes all W lane columns of every stage (the reference the dynamic
  width, `PipelineShape.ladder`, must equal token for token)."""
  S.validate(cfg, d1, d2, lane_capacity, gate_mass)
  d1 = int(d1)
  d2 = None if d2 is None else int(d2)
  width = S.stage_width(cfg.recurrence, d1, d2, lane_capacity)
  shape = S.PipelineShape(cfg.recurrence, d1, d2, width, float(gate_mass or 0.0), bool(dynamic_width))
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
  later tokens are drafted; `lane_capacity` bounds the lane table, `gate_mass` tightens the sampled gate."""

  name = "loopspec"
  positional = ("d1", "d2")
  d1: Optional[int] = None
  d2: Optional[int] = None
  lane_capacity: Optional[int] = None
  gate_mass: Optional[float] = None

  def validate(self, cfg: ModelConfig) -> None:
    S.validate(cfg, self.d1, self.d2, self.lane_capacity, self.gate_mass)

  def make_decoder(self, cfg: ModelConfig, *, greedy: bool, random_init: bool) -> common.Decoder:
    return make_decoder(
        cfg,
        greedy=greedy,
        random_init=random_init,
        d1=self.d1,
        d2=self.d2,
        lane_capacity=self.lane_capacity,
        gate_mass=self.gate_mass,
    )

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
    }
