"""The TPU form of a KV write (`kvcache.update_slices`: one update slice per request and position, which the
TPU compiler writes in place) stores exactly what the scatter of every other backend stores, out-of-range
positions dropped; and a CPU lowering keeps the scatter (the TPU pins exist only in a TPU lowering)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loopspec_jax.models import kvcache, layers

T = 6
POS = np.array([[1, 2, 3], [5, 6, -1]])  # request 1: one position past the end (dropped), one from the end


def _buf_and_entries(lead_shape):
  rng = np.random.default_rng(0)
  buf = jnp.asarray(rng.normal(size=lead_shape + (2, 3, T, 4)), jnp.float32)  # [*M, B, KV, T, D]
  x = jnp.asarray(rng.normal(size=(2, 3, 3, 4)), jnp.float32)  # [B, S, KV, D]
  return buf, x


def test_update_slices_store_what_the_scatter_stores():
  buf, x = _buf_and_entries(())
  want = buf.at[jnp.arange(2)[:, None], :, POS].set(x, mode="drop")
  np.testing.assert_array_equal(kvcache.update_slices(buf, (), x, jnp.asarray(POS)), want)


@pytest.mark.parametrize("start", [1, 2])
def test_update_slices_of_consecutive_core_steps(start):
  buf, x = _buf_and_entries((5,))
  steps = x[None] * jnp.arange(1.0, 3.0)[:, None, None, None, None]  # [2 steps, B, S, KV, D]
  idx = (start + jnp.arange(2)[:, None, None], jnp.arange(2)[None, :, None], slice(None), jnp.asarray(POS)[None])
  want = buf.at[idx].set(steps, mode="drop")
  np.testing.assert_array_equal(kvcache.update_slices(buf, (start,), steps, jnp.asarray(POS)), want)


def test_cpu_lowering_keeps_the_scatter_and_no_layout_pin():
  buf, x = _buf_and_entries((5,))
  write = lambda b, k, p: kvcache.write_core_steps(
      kvcache.KVCache(prelude=(), core=((b, b),), coda=()), _Group1(), jnp.arange(2), k, k, p
  ).core[0][0]
  hlo = jax.jit(write).lower(buf, jnp.stack([x, x])[:, None], jnp.asarray(POS)).as_text()
  assert "scatter" in hlo and "dynamic_update_slice" not in hlo
  assert "layout" not in jax.jit(layers.row_major).lower(x).as_text().lower()


class _Group1:
  group = 1


def test_write_stack_stores_what_the_scatter_stores():
  """Every leading entry (a drafter's layers) at once, a position past the end dropped: on a TPU as update
  slices (`update_slices`), elsewhere as the one scatter."""
  rng = np.random.default_rng(1)
  buf = jnp.asarray(rng.normal(size=(2, 2, 3, T, 4)), jnp.float32)  # [L, B, KV, T, D]
  x = jnp.asarray(rng.normal(size=(2, 2, 3, 3, 4)), jnp.float32)  # [L, B, S, KV, D]
  pos = jnp.asarray(np.where(POS < 0, T, POS))  # [B, S], T: dropped
  want = buf.at[jnp.arange(2)[:, None, None], jnp.arange(2)[None, :, None], :, pos[None]].set(x, mode="drop")
  np.testing.assert_array_equal(kvcache.write_stack(buf, x, pos), want)
  np.testing.assert_array_equal(kvcache.update_slices(buf, (0,), x, pos), want)
