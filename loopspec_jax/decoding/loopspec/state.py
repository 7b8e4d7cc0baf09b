"""LoopSpec's decode state: the lane table (the branch tree as arrays), speculative KV, counters.

Lanes live in a table of G = R / d1 **stages** of W lanes each (N = G * W lanes per request). A lane spawned
at tick t goes to stage t mod G and advances d1 recurrent steps per tick, so all lanes of a stage share their
depth for life; at tick t the stage at depth g * d1 is `lanes.stage_of_group(t, G)[g]`. A lane's stable id is
stage * W + w: its speculative KV entries, ancestry bits and proposals are stored under that id until it
dies. Every lane of a stage reads the same committed-prefix slot, which is what lets a tick read the cache
with dense batched dots instead of per-lane gathers (see `lanes.grouped_attend`).

Logical axes are declared on every field (`parallel.logical.axes_field`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import common
from loopspec_jax.models import kvcache
from loopspec_jax.parallel import entry
from loopspec_jax.parallel.logical import axes_field

PROP_RESTART, PROP_FIRST, PROP_SECOND = 0, 1, 2  # how a lane's token was proposed (also a commit's source)
LANE = ("batch", "lanes")


@dataclasses.dataclass(frozen=True)
class PipelineShape:
  """Static shape of the pipeline: R, d1, optional d2, W lanes per stage, and the second proposal's gate.

  gate_mass: the least residual mass sum(max(0, p_d2 - q1)) for which the sampled gate opens (0: the
  paper's gate; `verify.second_proposal`).
  """

  recurrence: int
  d1: int
  d2: Optional[int]
  width: int
  gate_mass: float = 0.0
  dynamic: bool = True  # run each tick at the narrowest `ladder` width holding every live lane
  cols: int = 0  # inside one tick branch: the lane columns processed (0: all W)
  second: str = "residual"  # the second proposal: "residual" or "masked" (`second.propose`)
  gate: bool = True  # the second proposal's gate (False: proposes whenever it has mass)

  @property
  def c(self) -> int:  # columns processed by this tick branch
    return self.cols or self.width

  @property
  def ladder(self) -> tuple:
    """The static column counts a tick may run at: 1, 2, 4, ... below W, then W (`tick.make_tick` picks the
    smallest one >= every stage's highest live column + 1). Fixed (`dynamic=False`): W only."""
    if not self.dynamic:
      return (self.width,)
    out, c = [], 1
    while c < self.width:
      out.append(c)
      c *= 2
    return tuple(out) + (self.width,)

  def at_cols(self, cols: int) -> "PipelineShape":
    return dataclasses.replace(self, cols=cols)

  @property
  def n_groups(self) -> int:  # G: stages (= depth groups) per request
    return self.recurrence // self.d1

  @property
  def n_lanes(self) -> int:  # N = G * W
    return self.n_groups * self.width

  @property
  def readouts(self) -> tuple:  # depths with a readout (and a coda cache): d1, (d2,) R
    return (self.d1, self.recurrence) if self.d2 is None else (self.d1, self.d2, self.recurrence)

  @property
  def endpoint_groups(self) -> tuple:  # depth group of each readout after a tick's advance
    return tuple(r // self.d1 - 1 for r in self.readouts)


@flax.struct.dataclass
class LaneTable:
  """Per request (leading axis B), N lanes by stable id (stage * W + w)."""

  alive: jax.Array = axes_field(*LANE)  # [B, N] bool
  pos: jax.Array = axes_field(*LANE)  # [B, N] position of the lane's input token
  token: jax.Array = axes_field(*LANE)  # [B, N] input token
  parent: jax.Array = axes_field(*LANE)  # [B, N] parent lane id (-1: none)
  prop: jax.Array = axes_field(*LANE)  # [B, N] PROP_* of the token
  anc: jax.Array = axes_field("batch", "lanes", None)  # [B, N, N] anc[b, n, m]: m is a live strict ancestor of n
  s: jax.Array = axes_field("batch", "lanes", "embed")  # [B, N, E] recurrent state
  e: jax.Array = axes_field("batch", "lanes", "embed")  # [B, N, E] input injection (Ouro: the embedding)
  x1: jax.Array = axes_field(*LANE)  # [B, N] first proposal drafted at d1
  x2: jax.Array = axes_field(*LANE)  # [B, N] second proposal drafted at d2
  gate: jax.Array = axes_field(*LANE)  # [B, N] bool: the second proposal exists (and has a lane)
  q1: jax.Array = axes_field("batch", "lanes", "vocab")  # [B, N, V] (sampling) or [B, N, 0] (greedy)
  q2: jax.Array = axes_field("batch", "lanes", "vocab")  # [B, N, V] or [B, N, 0]


@flax.struct.dataclass
class SpecKV:
  """Speculative keys/values of the lanes by stable id, laid out like `kvcache.KVCache` with N for T."""

  prelude: tuple = axes_field("batch", "kv_heads", "lanes", "head_dim")  # n_prelude x (k, v) [B, KV, N, D]
  core: tuple = axes_field("groups", "batch", "kv_heads", "lanes", "head_dim")  # (d1 n_core) x [G, B, KV, N, D]
  coda: tuple = axes_field("readouts", "batch", "kv_heads", "lanes", "head_dim")  # n_coda x [nR, B, KV, N, D]


@flax.struct.dataclass
class LoopSpecStats:
  """Per-request counters, [B] each."""

  ticks: jax.Array = axes_field("batch")
  first: jax.Array = axes_field("batch")  # commits whose next lane is the first-proposal child
  second: jax.Array = axes_field("batch")  # ... the second-proposal child
  restart: jax.Array = axes_field("batch")  # ... a restarted lane
  last_source: jax.Array = axes_field("batch")  # PROP_* source of the last commit
  reject_first: jax.Array = axes_field("batch")  # verifications that rejected x1
  gate_evals: jax.Array = axes_field("batch")
  gate_opens: jax.Array = axes_field("batch")
  skipped_first: jax.Array = axes_field("batch")
  skipped_second: jax.Array = axes_field("batch")
  live_sum: jax.Array = axes_field("batch")
  live_max: jax.Array = axes_field("batch")
  demand_max: jax.Array = axes_field("batch")  # most spawns asked of one stage in a tick (granted or not)
  cols_sum: jax.Array = axes_field("batch")  # lane columns computed per stage, summed over the request's ticks
  # The release's split of the first rejections of decode tokens (every commit after a request's first):
  decode_reject_first: jax.Array = axes_field("batch")  # verifications that rejected x1
  second_verify: jax.Array = axes_field("batch")  # ... whose root had a second proposal (x2 verified)
  second_accept: jax.Array = axes_field("batch")  # ... that accepted x2
  first_token_ticks: jax.Array = axes_field("batch")  # ticks until the request's first commit


@flax.struct.dataclass
class LoopSpecState:
  cache: kvcache.KVCache  # committed prefix, laid out with group = d1
  spec: SpecKV
  lanes: LaneTable
  stats: LoopSpecStats
  tokens: jax.Array = axes_field("batch", "length")  # [B, T]
  length: jax.Array = axes_field("batch")  # [B] committed tokens; the prefix holds positions < length - 1
  n_new: jax.Array = axes_field("batch")  # [B]
  done: jax.Array = axes_field("batch")  # [B]
  limit: jax.Array = axes_field("batch")  # [B] last position a lane may be spawned at (exclusive)
  iterations: jax.Array = axes_field()  # [] ticks of the batched loop (the stage clock)


# ---------------------------------------------------------------------------------------------------
# Validation, capacity, construction
# ---------------------------------------------------------------------------------------------------
def validate(cfg: ModelConfig, d1, d2, capacity, gate_mass=None, second=None, gate=None):
  r = cfg.recurrence
  if d1 is None or int(d1) != d1 or d1 < 1:
    raise ValueError(f"LoopSpec needs an integer d1 >= 1, got {d1!r}")
  if r % d1:
    raise ValueError(f"d1={d1} must divide the recurrence R={r}")
  if d1 >= r:
    raise ValueError(f"d1={d1} must be smaller than R={r}")
  if d2 is not None:
    if int(d2) != d2 or not d1 < d2 < r:
      raise ValueError(f"d2={d2} must satisfy d1 < d2 < R (d1={d1}, R={r})")
    if d2 % d1:
      raise ValueError(f"d1={d1} must divide d2={d2}")
  if gate_mass is not None:
    if d2 is None:
      raise ValueError("gate_mass applies to the second proposal: give d2 as well")
    if isinstance(gate_mass, bool) or not isinstance(gate_mass, (int, float)) or not 0.0 <= gate_mass <= 1.0:
      raise ValueError(f"gate_mass must be a number in [0, 1] (a residual mass), got {gate_mass!r}")
  if (second is not None or gate is not None) and d2 is None:
    raise ValueError("second / gate choose the second proposal: give d2 as well")
  if gate is False and gate_mass is not None:
    raise ValueError("gate_mass tightens the gate: it does not apply with gate=False")
  if isinstance(capacity, str) and capacity != WORST:
    raise ValueError(f"lane_capacity must be an integer >= R/d1 or {WORST!r} (skip-free), got {capacity!r}")
  need = r // d1
  if capacity is not None and capacity != WORST and (int(capacity) != capacity or capacity < need):
    raise ValueError(f"lane_capacity={capacity} is too small: LoopSpec needs at least R/d1 = {need} lanes")


WORST = "worst"  # lane_capacity="worst": the schedule's worst case, so that no spawn is ever skipped

# The default table holds the worst case of the schedule when that costs at most this many lanes per request.
MAX_DEFAULT_LANES = 256


def worst_spawns(r: int, d1: int, d2: Optional[int]) -> list:
  """f[j], j < R/d1: the lanes spawned j ticks after a lane, all descending from it, when every gate opens
  and nothing is pruned: f[0] = 1, f[j] = f[j - 1] + f[j - d2/d1] (a lane's first child spawns one tick after
  it, its second child d2/d1 ticks after it). Without a second proposal every f[j] is 1."""
  g = r // d1
  hop = g if d2 is None else d2 // d1  # no second proposal: a second child never falls inside the R/d1 ticks
  f = [1]
  for j in range(1, g):
    f.append(f[j - 1] + (f[j - hop] if j >= hop else 0))
  return f


def worst_stage_lanes(r: int, d1: int, d2: Optional[int]) -> int:
  """The most lanes one stage can be asked to hold: f[R/d1 - 1] (a commit keeps one child's subtree, and the
  newest stage holds that subtree's latest generation)."""
  return worst_spawns(r, d1, d2)[-1]


def worst_live_lanes(r: int, d1: int, d2: Optional[int]) -> int:
  """The most live lanes per request in that worst case: sum f (R = 32, (2, 8): 249, the release's bound)."""
  return sum(worst_spawns(r, d1, d2))


def stage_width(r: int, d1: int, d2: Optional[int], capacity: Optional[int]) -> int:
  """Lanes per stage W: capacity / (R/d1) rounded up.

  Default: the schedule's worst case (`worst_stage_lanes`), so that no spawn is ever skipped, whenever its
  table has at most MAX_DEFAULT_LANES lanes (every R <= 8 configuration; Ouro's R = 4); otherwise 1 (single
  proposal) or 2 (room for one branch per stage). A tick computes only the columns holding live lanes
  (`PipelineShape.ladder`), but its cost follows the fullest stage, and the lane-table work (padded entry
  writes, the [N, N] ancestry, drafting and spawning over W columns) grows with W. At R = 32 the wide table
  gains gamma and loses wall clock on a compute-bound host (results/lanes/epyc2-2026-12-04-dynamic, tiny-raven:
  (1, 5) at W 64 reaches its every-spawn-granted gamma 21.85 against 13.26 at W 2, at ~15x the time per token;
  (2, 8) at W 16: gamma 14.47 against 12.84 at ~3x), so there the wide table is opt-in through `lane_capacity`
  (W 64 = `lane_capacity=2048` at d1 = 1), or `lane_capacity="worst"` (the worst case of any pair: every
  spawn granted, as in the release, which caps nothing)."""
  g = r // d1
  if capacity == WORST:
    return worst_stage_lanes(r, d1, d2)
  if capacity is None:
    worst = worst_stage_lanes(r, d1, d2)
    if g * worst <= MAX_DEFAULT_LANES:
      return worst
    return 1 if d2 is None else 2
  return math.ceil(capacity / g)


def default_capacity(r: int, d1: int, d2: Optional[int]) -> int:
  """Lanes per request by default: R/d1 stages of `stage_width` lanes."""
  return (r // d1) * stage_width(r, d1, d2, None)


@entry.program(entry.INIT)
def initial_state(
    cache, tokens, lengths, sp: common.SamplingParams, *, cfg: ModelConfig, shape: PipelineShape, greedy: bool
) -> LoopSpecState:
  """One root lane per request carrying the last prompt token from depth 0 (in the stage of group 0 at
  tick 0); empty speculative stores; q1/q2 of width V only when sampling."""
  b = tokens.shape[0]
  n, g = shape.n_lanes, shape.n_groups
  dt = jnp.dtype(cfg.dtype)
  zeros_i = jnp.zeros((b, n), jnp.int32)
  root = (g - 1) * shape.width  # stage_of_group(0, G)[0] = G - 1, row 0
  bi = jnp.arange(b)
  v = 0 if greedy else cfg.vocab_size
  lanes = LaneTable(
      alive=jnp.zeros((b, n), bool).at[:, root].set(True),
      pos=zeros_i.at[:, root].set(lengths - 1),
      token=zeros_i.at[:, root].set(tokens[bi, lengths - 1]),
      parent=zeros_i - 1,
      prop=zeros_i,
      anc=jnp.zeros((b, n, n), bool),
      s=jnp.zeros((b, n, cfg.hidden_size), dt),
      e=jnp.zeros((b, n, cfg.hidden_size), dt),
      x1=zeros_i - 1,
      x2=zeros_i - 1,
      gate=jnp.zeros((b, n), bool),
      q1=jnp.zeros((b, n, v), jnp.float32),
      q2=jnp.zeros((b, n, v), jnp.float32),
  )
  layout = kvcache.CacheLayout.of(cfg, len(shape.readouts), shape.d1)
  kv = (b, cfg.num_kv_heads, n, cfg.head_dim)
  pair = lambda lead: (jnp.zeros(lead + kv, dt), jnp.zeros(lead + kv, dt))
  spec = SpecKV(
      prelude=tuple(pair(()) for _ in range(layout.n_prelude)),
      core=tuple(pair((g,)) for _ in range(shape.d1 * layout.n_core)),
      coda=tuple(pair((len(shape.readouts),)) for _ in range(layout.n_coda)),
  )
  zb = jnp.zeros((b,), jnp.int32)
  stats = LoopSpecStats(
      ticks=zb,
      first=zb,
      second=zb,
      restart=zb,
      last_source=zb,
      reject_first=zb,
      gate_evals=zb,
      gate_opens=zb,
      skipped_first=zb,
      skipped_second=zb,
      live_sum=zb,
      live_max=zb,
      demand_max=zb,
      cols_sum=zb,
      decode_reject_first=zb,
      second_verify=zb,
      second_accept=zb,
      first_token_ticks=zb,
  )
  return LoopSpecState(
      cache=cache,
      spec=spec,
      lanes=lanes,
      stats=stats,
      tokens=tokens,
      length=lengths,
      n_new=zb,
      done=jnp.zeros((b,), bool),
      limit=lengths + sp.max_new - 1,
      iterations=jnp.int32(0),
  )
