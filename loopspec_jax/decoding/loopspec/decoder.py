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
  """Host-side statistics (sums over requests) including the release's mean accepted length."""
  r, d1, d2 = cfg.recurrence, shape.d1, shape.d2
  s = jax.tree_util.tree_map(np.asarray, st.stats)
  n = int(np.asarray(st.n_new).sum())
  first, second, restart = int(s.first.sum()), int(s.second.sum()), int(s.restart.sum())
  ticks = int(s.ticks.sum())
  evals = int(s.gate_evals.sum())
  return common.DecodeStats.of_loop(
      "loopspec",
      st,
      d1,
      mean_accepted_length=theory.gamma_from_counts(r, d1, d2, n, second + restart, restart) if n else 0.0,
      tokens_per_r_steps=r * n / max(ticks * d1, 1),
      commits={"first": first, "second": second, "restart": restart},
      gate_open_rate=int(s.gate_opens.sum()) / max(evals, 1),
      skipped_spawns=int(s.skipped_first.sum() + s.skipped_second.sum()),
      extras={
          "d1": d1,
          "d2": d2,
          "gate_mass": shape.gate_mass,
          "lane_capacity": shape.n_lanes,
          "stage_width": shape.width,
          "request_ticks": ticks,
          "ticks_max": int(s.ticks.max()),
          "reject_first": int(s.reject_first.sum()),
          "gate_evals": evals,
          "skipped_first": int(s.skipped_first.sum()),
          "skipped_second": int(s.skipped_second.sum()),
          "mean_live_lanes": float(s.live_sum.sum()) / max(ticks, 1),
          "max_live_lanes": int(s.live_max.max()),
          "per_request": {
              k: np.asarray(getattr(s, k)).tolist()
              for k in ("ticks", "first", "second", "restart", "last_source", "reject_first")
          },
      },
  )


def make_decoder(
    cfg: ModelConfig, *, greedy: bool, random_init: bool, d1, d2, lane_capacity, gate_mass=None
) -> common.Decoder:
  S.validate(cfg, d1, d2, lane_capacity, gate_mass)
  d1 = int(d1)
  d2 = None if d2 is None else int(d2)
  width = S.stage_width(cfg.recurrence, d1, d2, lane_capacity)
  shape = S.PipelineShape(cfg.recurrence, d1, d2, width, float(gate_mass or 0.0))
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
