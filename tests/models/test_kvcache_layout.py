"""`layers.kv_order`, the layout every KV pin asks for, is the layout the TPU gives the buffer as a program
argument: its default device layout, read from the TPU client (`get_default_layout`, no compile). Checked
for the cache buffers of every registered real-size model (both cache layouts, batch 1 and 8, contexts 2048
and 8192) whole and per shard on the meshes docs/scaling.md plans. A pin that differs from it makes the
compiler relay the buffer out: before the loop (temporaries) or inside it (Ouro-1.4B's chain and tree: 13
and 26 copies of a core buffer per round, results/tpu_aot/2026-12-07-ouro).

Needs libtpu (the `[tpu]` extra); without it the test skips."""

import re

import jax
import numpy as np
import pytest

from loopspec_jax.analysis import aot
from loopspec_jax.models import kvcache, layers
from loopspec_jax.parallel import sharding
from loopspec_configs.models import model_config

needs_tpu = pytest.mark.skipif(aot.tpu_unavailable() is not None, reason=f"TPU compiler: {aot.tpu_unavailable()}")
MODELS = ("huginn:0125", "ouro:1p4b", "ouro:2p6b", "raven_llama:3p2_1b")
MESHES = ((1, 1), (1, 8), (2, 4), (1, 16), (2, 8))


def device_order(device, shape, dtype) -> tuple:
  """Major-to-minor order of the TPU's default layout of `shape` (`{minor..major:tiling}`)."""
  text = str(device.client.get_default_layout(np.dtype(dtype), tuple(shape), device))
  minor_to_major = [int(i) for i in re.match(r"\{([\d,]*)", text).group(1).split(",")]
  return tuple(reversed(minor_to_major))


def buffer_shapes(cfg, batch: int, length: int) -> set:
  """Shapes of every KV buffer of both cache layouts (AR's group = R, the drafting methods' group = 1)."""
  shapes = set()
  for group in (cfg.recurrence, 1):
    layout = kvcache.CacheLayout.of(cfg, n_readouts=2, group=group)
    cache = jax.eval_shape(lambda: kvcache.empty_cache(cfg, layout, batch, length))
    shapes |= {leaf.shape for leaf in jax.tree.leaves(cache)}
  return shapes


def per_shard(shape, mesh) -> tuple:
  """[.., B, KV, T, D] as one device holds it: requests over data, KV heads over model (where they divide)."""
  *lead, b, kv, t, d = shape
  b = b // mesh[0] if b % mesh[0] == 0 else b
  kv = kv // mesh[1] if kv % mesh[1] == 0 else kv
  return (*lead, b, kv, t, d)


@needs_tpu
@pytest.mark.parametrize("spec", MODELS)
def test_pins_ask_for_the_argument_layout(spec):
  device = aot.target_devices(aot.parse_target("tpu:v5e"))[0]
  checked, wrong = 0, []
  for context in (2048, 8192):
    cfg = model_config(spec, dtype="bfloat16", max_len=context)
    for mesh in MESHES:
      topology = "tpu:v5e:2x4" if mesh[0] * mesh[1] <= 8 else "tpu:v5e:4x4"
      mcfg = sharding.padded_config(cfg, aot.target_mesh(aot.parse_target(topology), mesh))
      for batch in (1, 8):
        for extra in (0, 5, 9):  # the cache length: the context plus a method's draft positions
          for shape in buffer_shapes(mcfg, batch, context + extra):
            local = per_shard(shape, mesh)
            want = layers.kv_order(local, 2)
            checked += 1
            got = device_order(device, local, np.dtype("bfloat16"))
            if got != want:
              wrong.append((local, want, got))
  assert checked and not wrong, wrong[:5]


def test_kv_order_rule():
  """The rule itself (no TPU needed): Huginn-0125's D = 96 puts positions on the lanes, Ouro's D = 128 heads
  under positions when the positions pad, row-major when they do not; short caches and one head as the TPU."""
  assert layers.kv_order((32, 1, 55, 2053, 96), 2) == (0, 1, 2, 4, 3)
  assert layers.kv_order((4, 1, 16, 2053, 128), 2) == (0, 1, 3, 2, 4)
  assert layers.kv_order((4, 1, 16, 2048, 128), 2) == (0, 1, 2, 3, 4)
  assert layers.kv_order((4, 1, 1, 2053, 128), 2) == (1, 2, 3, 0, 4)  # the 4 groups under positions
  assert layers.kv_order((1, 7, 33, 128), 2) == (0, 2, 1, 3)  # 7 heads pad less than 33 positions
  assert layers.kv_order((8, 1, 2053, 96), 2) == (0, 1, 3, 2)  # one head: positions on the lanes too


@needs_tpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "int8"])
def test_kv_order_is_the_tpus_for_any_shape(dtype):
  """Beyond the registered models: 1-16 heads (odd counts too), leading axes (groups, batches, sizes of 1),
  lengths that fill sublane tiles or pad them (short caches too) and head dims of 32-256 lanes."""
  device = aot.target_devices(aot.parse_target("tpu:v5e"))[0]
  wrong, itemsize = [], np.dtype(dtype).itemsize
  for lead in [(), (1,), (2,), (3,), (8,), (32, 1), (4, 8), (4, 3)]:
    for kv in range(1, 17):
      for t in (9, 16, 33, 40, 2048, 2053, 8197):
        for d in (32, 64, 80, 96, 128, 192, 256):
          shape = lead + (kv, t, d)
          if layers.kv_order(shape, itemsize) != device_order(device, shape, dtype):
            wrong.append(shape)
  assert not wrong, wrong[:5]
