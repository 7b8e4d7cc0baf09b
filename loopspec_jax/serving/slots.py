"""Device-side slot operations of the serving engine (jitted once per engine configuration).

The engine holds one decode state of its method for B slots; these programs write a fresh batch-of-one state
into a slot, build B idle slots, mark a slot done, and read every slot's counters, without touching the other
slots' rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from loopspec_jax.parallel import logical


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


# Per-slot counters read after each device call (0 where a method has none), then the slot's live lanes.
COUNTERS = ("n_new", "first", "second", "restart", "gate_evals", "gate_opens", "rounds", "accepted", "nodes")


@jax.jit
def counters(state):
  """[B, len(COUNTERS) + 1] int32: the per-slot counters of any method's state (0 where a method has none),
  then the slot's live LoopSpec lanes."""
  zero = jnp.zeros_like(state.n_new)
  st = getattr(state, "stats", None)
  get = lambda name: getattr(st, name, None) if st is not None and hasattr(st, name) else getattr(state, name, None)
  cols = [zero if get(n) is None else get(n) for n in COUNTERS]
  lanes = getattr(state, "lanes", None)
  cols.append(zero if lanes is None else jnp.sum(lanes.alive & ~state.done[:, None], axis=1))
  return jnp.stack([c.astype(jnp.int32) for c in cols], axis=1)
