"""loopspec_jax/experiments/plan_memory.py: per-device totals equal the summed eval_shape trees laid out by the rules.

Everything here is abstract (eval_shape, no allocation), so planning 8 devices runs on one CPU. The same
totals are compared with real sharded arrays on 8 simulated devices in tests/test_sharding.py.
"""

import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from loopspec_jax.experiments import plan_memory
from loopspec_jax.parallel import sharding

GIB = 1024**3


def _bytes(tree):
  return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize("method", ["ar", "loopspec"])
def test_one_device_totals_equal_eval_shape_sizes(method):
  cfg = plan_memory.model_config("huginn:tiny", "bfloat16", 64)
  d1, d2, cap = (2, 4, 6) if method == "loopspec" else (None, None, None)
  row = plan_memory.plan_row(cfg, 3, 64, (1, 1), method, d1=d1, d2=d2, capacity=cap)
  trees = plan_memory.abstract_states(cfg, 3, 64, method, d1, d2, cap)
  for cat, tree in trees.items():
    assert row[cat] == _bytes(tree), cat
  assert row["total"] == sum(_bytes(t) for t in trees.values())
  # The committed cache is k and v of [..., B, KV, T, D] blocks (bf16) for every cached layer and step.
  positions = 64 + (1 if method == "loopspec" else 0)  # LoopSpec's cache has one scratch position
  per_block = 3 * cfg.num_kv_heads * positions * cfg.head_dim * 2
  assert row["committed_kv"] % (2 * per_block) == 0 and row["committed_kv"] >= 2 * per_block * cfg.recurrence


def test_sharded_totals_divide_by_the_rules():
  cfg = plan_memory.model_config("ouro:2p6b", "bfloat16", 4096)
  trees = plan_memory.abstract_states(cfg, 8, 4096, "loopspec", 1, None, 5)
  rows = {m: plan_memory.plan_row(cfg, 8, 4096, m, "loopspec", d1=1, capacity=5) for m in ((1, 1), (1, 8), (2, 4))}
  # KV heads (16) shard over model, requests over data: the caches divide by the device count.
  for m, row in rows.items():
    n = m[0] * m[1]
    assert row["committed_kv"] * n == _bytes(trees["committed_kv"])
    assert row["spec_kv"] * n == _bytes(trees["spec_kv"])
  # Parameters shard over model only (norms replicated), so (2, 4) holds more per device than (1, 8).
  assert rows[(1, 8)]["params"] < rows[(2, 4)]["params"] < rows[(1, 1)]["params"]
  specs = sharding.tree_specs(trees["params"], "params", {"data": 2, "model": 4}, cfg=cfg)
  spec_leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  expect = sum(
      math.prod(sharding.shard_shape(x.shape, s, {"data": 2, "model": 4})) * 2
      for x, s in zip(jax.tree_util.tree_leaves(trees["params"]), spec_leaves)
  )
  assert rows[(2, 4)]["params"] == expect


def test_padding_and_fit_flag():
  cfg = plan_memory.model_config("huginn:0125", "bfloat16", 4096)
  one = plan_memory.plan_row(cfg, 1, 4096, (2, 4), "ar")
  two = plan_memory.plan_row(cfg, 2, 4096, (2, 4), "ar")
  assert one["padded_batch"] == 2 and one["total"] == two["total"]
  # 55 heads do not divide 4: Huginn-0125's KV cache is replicated over model (about 10.6 GiB a request).
  assert 10 * GIB < one["committed_kv"] < 11 * GIB
  assert one["fits"] and not plan_memory.plan_row(cfg, 4, 4096, (2, 4), "ar")["fits"]


def test_cli_prints_a_table(tmp_path):
  """The console module runs from any directory with its package default config and --config.* overrides."""
  out = subprocess.run(
      [
          sys.executable,
          "-m",
          "loopspec_jax.experiments.plan_memory",
          "--config.models=ouro:tiny",
          "--config.dtype=float32",
          "--config.context=64",
          "--config.meshes=1x8,2x4",
          "--config.batches=1,3",
          "--config.device_memory_gib=0.00001",
          "--config.d2=none",
      ],
      cwd=tmp_path,
      capture_output=True,
      text=True,
      timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stderr.strip() == "", out.stderr[-3000:]  # no library INFO chatter
  lines = [l for l in out.stdout.splitlines() if l.startswith("| ouro:tiny")]
  assert len(lines) == 2 * 2 * 2  # meshes x methods x batches
  assert all(l.endswith("**NO** |") for l in lines)  # nothing fits in 10 KiB
  assert "| 2x4 | 3 (pad 4) |" in out.stdout
