"""Lane bookkeeping of the LoopSpec engine on hand-made arrays (no model): spawn placement and the stage clock."""

import jax.numpy as jnp
import numpy as np
import pytest

from loopspec_jax.decoding.loopspec import lanes


def _allocate(want1, want2):
  out = lanes.allocate_lanes(jnp.asarray(want1, bool), jnp.asarray(want2, bool))
  return [np.asarray(x) for x in out]


def test_first_proposals_fill_rows_in_order_before_second_ones():
  # Request 0: one first proposal (row 1) and one second proposal (row 0): both fit, first proposal first.
  # Request 1: two first proposals fill the stage; its second proposal is skipped.
  # Request 2: nothing requested.
  assigned, src, granted1, granted2 = _allocate([[0, 1], [1, 1], [0, 0]], [[1, 0], [1, 0], [0, 0]])
  np.testing.assert_array_equal(assigned, [[1, 1], [1, 1], [0, 0]])
  np.testing.assert_array_equal(src[:2], [[1, 2], [0, 1]])  # sources: first 0..W-1, second W..2W-1
  np.testing.assert_array_equal(granted1, [[0, 1], [1, 1], [0, 0]])
  np.testing.assert_array_equal(granted2, [[1, 0], [0, 0], [0, 0]])


def test_second_proposals_only_take_rows_left_free():
  want1 = [[1, 0, 0]]
  want2 = [[0, 1, 1]]
  assigned, src, granted1, granted2 = _allocate(want1, want2)
  np.testing.assert_array_equal(assigned, [[1, 1, 1]])
  np.testing.assert_array_equal(src, [[0, 4, 5]])
  np.testing.assert_array_equal(granted2, [[0, 1, 1]])
  # One row only: the first proposal wins, every second proposal is skipped.
  assigned, src, granted1, granted2 = _allocate([[1]], [[1]])
  np.testing.assert_array_equal(assigned, [[1]])
  np.testing.assert_array_equal(src, [[0]])
  np.testing.assert_array_equal(granted1, [[1]])
  np.testing.assert_array_equal(granted2, [[0]])


@pytest.mark.parametrize("n_groups,width", [(2, 1), (4, 2), (16, 2), (8, 3)])
def test_group_rows_is_an_involution_and_advances_one_group_per_tick(n_groups, width):
  for t in range(2 * n_groups + 1):
    rows = np.asarray(lanes.group_rows(jnp.int32(t), n_groups, width))
    np.testing.assert_array_equal(np.sort(rows), np.arange(n_groups * width))  # a permutation
    np.testing.assert_array_equal(rows[rows], np.arange(n_groups * width))  # its own inverse
    stages = np.asarray(lanes.stage_of_group(jnp.int32(t), n_groups))
    nxt = np.asarray(lanes.stage_of_group(jnp.int32(t + 1), n_groups))
    # The stage at depth group g during tick t is at group g + 1 during tick t + 1; lanes spawned at tick t
    # (stage t mod G) are at group 0 during tick t + 1.
    np.testing.assert_array_equal(nxt[1:], stages[:-1])
    assert nxt[0] == t % n_groups


@pytest.mark.parametrize("q_rows", [1, 2, 4])
def test_block_scores_equal_the_plain_dot(q_rows):
  rng = np.random.default_rng(0)
  qq = jnp.asarray(rng.standard_normal((3, 2, 4, q_rows, 8)), jnp.float32)
  keys = jnp.asarray(rng.standard_normal((3, 2, 4, 11, 8)), jnp.float32)
  want = np.einsum("gbkqd,gbktd->gbkqt", np.asarray(qq, np.float64), np.asarray(keys, np.float64))
  np.testing.assert_allclose(np.asarray(lanes.block_scores(qq, keys)), want, rtol=1e-5, atol=1e-5)


def _simulate_worst_case(r, d1, d2):
  """Plain-Python schedule with every gate open: lanes (spawn tick, parent); each tick the lane at depth R
  commits its first child (the subtree of the other children dies). Returns the most lanes spawned at one tick
  that are alive together, and the most live lanes."""
  g, hop = r // d1, (None if d2 is None else d2 // d1)
  lanes_ = {0: (0, None)}  # id -> (spawn tick, parent id)
  nxt, most_stage, most_live = 1, 1, 1
  for t in range(1, 6 * g):
    born = []
    for lid, (t0, _) in list(lanes_.items()):
      if t - t0 == 1 or (hop is not None and t - t0 == hop):
        born.append(lid)
    for parent in born:
      lanes_[nxt] = (t, parent)
      nxt += 1
    roots = [lid for lid, (t0, _) in lanes_.items() if t - t0 == g]
    for root in roots:  # commit: keep the first child's subtree
      kept = min(c for c, (_, p) in lanes_.items() if p == root)

      def keeps(lid):
        while lid is not None and lid != kept:
          lid = lanes_[lid][1] if lid in lanes_ else None
        return lid == kept

      lanes_ = {lid: v for lid, v in lanes_.items() if keeps(lid)}
      lanes_[kept] = (lanes_[kept][0], None)
    per_tick = {}
    for t0, _ in lanes_.values():
      per_tick[t0] = per_tick.get(t0, 0) + 1
    most_stage = max(most_stage, max(per_tick.values()))
    most_live = max(most_live, len(lanes_))
  return most_stage, most_live


@pytest.mark.parametrize("r,d1,d2", [(4, 1, 2), (8, 1, 4), (8, 1, 2), (8, 2, 4), (8, 2, 6), (8, 1, None)])
def test_worst_case_lanes_equal_a_simulation_of_the_schedule(r, d1, d2):
  from loopspec_jax.decoding.loopspec import state

  assert _simulate_worst_case(r, d1, d2) == (state.worst_stage_lanes(r, d1, d2), state.worst_live_lanes(r, d1, d2))


def test_default_table_is_the_worst_case_up_to_the_lane_budget():
  from loopspec_jax.decoding.loopspec import state

  assert state.worst_live_lanes(32, 2, 8) == 249  # the release's bound
  assert state.stage_width(8, 1, 2, None) == 21 and state.stage_width(4, 1, 2, None) == 3
  assert state.stage_width(8, 2, 4, None) == 3 and state.stage_width(8, 1, 4, None) == 5
  assert state.stage_width(32, 1, 5, None) == state.stage_width(32, 2, 8, None) == 2  # worst: 3084, 69
  assert state.stage_width(32, 4, 8, None) == 21  # 8 stages x 21 <= 256
  assert state.stage_width(32, 1, None, None) == 1
  assert state.stage_width(8, 1, 2, 16) == 2  # an explicit capacity wins


class _FixedWidthLoopSpec(__import__("loopspec_jax").LoopSpec):
  """LoopSpec whose every tick computes all W lane columns (no width ladder): the reference."""

  def make_decoder(self, cfg, *, greedy, random_init):
    from loopspec_jax.decoding.loopspec import decoder

    kw = dict(d1=self.d1, d2=self.d2, lane_capacity=self.lane_capacity, gate_mass=self.gate_mass)
    return decoder.make_decoder(cfg, greedy=greedy, random_init=random_init, dynamic_width=False, **kw)


@pytest.mark.slow  # 25-50 s: two LoopSpec compiles; the default suite checks the dynamic table (the default) against AR
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 3}])
def test_dynamic_width_equals_the_fixed_wide_table(sampling):
  """Each tick computes only the first c columns of every stage, c the narrowest ladder width holding every
  live lane (huginn:tiny (1, 4): default W 5, ladder 1, 2, 4, 5): tokens and every per-request counter equal
  those of the table computed at W columns every tick, greedy and sampled."""
  import loopspec_jax
  from helpers import PROMPTS, tiny_model
  from loopspec_jax.decoding.loopspec import state

  assert state.PipelineShape(8, 1, 4, 5).ladder == (1, 2, 4, 5)
  assert state.PipelineShape(8, 1, 4, 5, dynamic=False).ladder == (5,)
  model = tiny_model("huginn:tiny", 0.6)
  prompts = [list(p) for p in PROMPTS]
  run = lambda m: loopspec_jax.generate(model, prompts, max_new_tokens=20, method=m, **sampling)
  dyn, fixed = run(loopspec_jax.LoopSpec(d1=1, d2=4)), run(_FixedWidthLoopSpec(d1=1, d2=4))
  assert dyn.stats["stage_width"] == fixed.stats["stage_width"] == 5
  assert dyn.tokens == fixed.tokens
  cols_dyn, cols_fixed = dyn.stats["per_request"].pop("cols_sum"), fixed.stats["per_request"].pop("cols_sum")
  assert dyn.stats["per_request"] == fixed.stats["per_request"]
  assert sum(cols_dyn) < sum(cols_fixed) == 5 * sum(fixed.stats["per_request"]["ticks"])  # narrower ticks
  assert dyn.stats["max_live_lanes"] == fixed.stats["max_live_lanes"] > 5  # a tick ran wider than one column
