"""Compile-only TPU targets (loopspec_jax.analysis.aot): every registered method's decode loop compiles for a
TPU topology without a TPU, its memory is reported, and no while body copies a KV buffer.

Needs libtpu (the `[tpu]` extra; .ci/run installs it): without it the compile tests skip. The sizes are tiny
(Huginn-shaped, R = 4, 32 positions) and the draft lengths short, so each compile takes seconds (5-20 s on a
loaded 2-core host). At these sizes the compiler keeps caches in on-chip memory; copies into it are not KV
copies in HBM (`aot.loop_copies`).
"""

import subprocess
import sys

import jax
import pytest

from loopspec_jax.analysis import aot
from loopspec_configs.models import model_config
from loopspec_jax.methods import NAMES

needs_tpu = pytest.mark.skipif(aot.tpu_unavailable() is not None, reason=f"TPU compiler: {aot.tpu_unavailable()}")
TARGET = "tpu:v5e"
CFG = model_config("huginn:tiny", recurrence=4, max_len=32)
# every registered method (auto picks one of them) at draft lengths short enough to compile in seconds
SPECS = (
    "ar",
    "chain:d1=2,gamma=2",
    "loopspec:d1=1,d2=2",
    "loopspec:d1=2",
    "tree:gamma=2,branch=2,tree_nodes=4",
    "draft:gamma=2",
    "lookup:ngram=2,gamma=2",
    "lookahead",
    "medusa",
    "eagle:gamma=2,branch=2,tree_nodes=4",
    "mtp",
    "dflash:gamma=2",
)


def test_specs_cover_every_method():
  assert {s.partition(":")[0] for s in SPECS} == set(NAMES) - {"auto"}
  assert {s.partition(":")[0] for s in aot.method_specs()} == set(NAMES) - {"auto"}


@pytest.mark.parametrize(
    "text, name",
    [
        ("cpu", "cpu"),
        ("tpu:v5e", "tpu:v5e:2x2"),
        ("TPU:v5p:2x2x2", "tpu:v5p:2x2x2"),
        ("tpu:v6e:2x4", "tpu:v6e:2x4"),
        ("cuda:h100", "cuda:h100"),
    ],
)
def test_parse_target(text, name):
  assert aot.parse_target(text).name == name


@pytest.mark.parametrize("text", ["gpu", "tpu", "tpu:v9", "tpu:v5e:big", "tpu:v5e:2x2:x", "cuda", "cuda:k80"])
def test_parse_target_rejects(text):
  with pytest.raises(ValueError, match="unknown target"):
    aot.parse_target(text)


def test_refused_temp_bytes():
  msg = "RESOURCE_EXHAUSTED: ... the total memory required for HLO temporaries (31.65G) exceeds available HBM (15.75G)."
  assert aot.refused_temp_bytes(msg) == pytest.approx(31.65 * 1024**3)
  assert aot.refused_temp_bytes("other") is None
  # on one chip or a mesh: the arguments are the program's floor per device, the rest temporaries
  mem = aot.refused_memory(msg, 2e9)
  assert mem["argument_bytes"] == 2e9 and mem["temp_bytes"] == pytest.approx(31.65 * 1024**3 - 2e9)
  assert mem["fits"] is False and aot.refused_memory("other", 2e9)["temp_bytes"] is None


@needs_tpu
def test_topology_leaves_the_default_backend_alone():
  before = jax.default_backend()
  devices = aot.target_devices(aot.parse_target("tpu:v5e:2x2"))
  assert len(devices) == 4 and devices[0].platform == "tpu"
  assert jax.default_backend() == before
  assert float(jax.numpy.ones(3).sum()) == 3.0  # the default backend still runs programs


_CACHE_PROBE = """
import pathlib, sys, jax
from loopspec_jax.analysis import aot
jax.config.update("jax_compilation_cache_dir", sys.argv[2])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
sh = jax.sharding.NamedSharding(aot.target_mesh(aot.parse_target("tpu:v5e")), jax.sharding.PartitionSpec())
x = jax.ShapeDtypeStruct((128, 256), jax.numpy.bfloat16, sharding=sh)
program = lambda k: jax.jit(lambda a: (a @ a.T).sum() * k).lower(x)
program(1.0).compile()  # the process has used the cache (JAX decides that once)
aot.compile_only(program(2.0)) if sys.argv[1] == "compile_only" else program(2.0).compile()
program(3.0).compile()  # and uses it again after
"""


@needs_tpu
def test_a_topology_compile_stays_out_of_the_persistent_cache(tmp_path):
  """A compile-only executable cannot be loaded back from the persistent compilation cache (a second run
  warned "PjRtCompiler must be constructed with a Client" and recompiled): `aot.compile_only` writes none,
  even in a process that has used the cache, which uses it again after; a plain compile writes one."""
  files = {}
  for how in ("compile", "compile_only"):
    folder = tmp_path / how
    subprocess.run([sys.executable, "-c", _CACHE_PROBE, how, str(folder)], check=True, capture_output=True)
    files[how] = [p for p in folder.rglob("*") if p.is_file()]
  assert len(files["compile"]) == 3 and len(files["compile_only"]) == 2, files


@needs_tpu
@pytest.mark.parametrize("spec", SPECS)
def test_every_method_compiles_for_tpu(spec):
  r = aot.compile_loop(CFG, spec, TARGET)
  assert r.compiled, r.error
  assert r.memory["argument_bytes"] > 0 and r.memory["temp_bytes"] >= 0 and r.memory["fits"]
  assert r.xla_cost.get("flops", 0) > 0 and "optimal_seconds" in r.xla_cost
  assert "while" in r.hlo
  assert r.loop_copies == 0, f"{spec}: {r.loop_copies} copies of a KV buffer inside a while body"


@needs_tpu
def test_sharded_loop_lays_the_heads_out_for_the_mesh():
  """On a model axis that does not divide the heads (huginn:tiny's 4 on 8 chips of v5e-8) the loop compiles
  with the heads laid out as `generate(mesh=)` lays them out (8: the cache and weights shard 8 ways)."""
  r = aot.compile_loop(CFG, "ar", "tpu:v5e:2x4", (1, 8), batch=2)
  assert r.compiled, r.error
  assert r.mesh == (1, 8) and r.kv_dims[0][-3] == 8 and r.loop_copies == 0


@needs_tpu
@pytest.mark.parametrize("spec", ["ar", "loopspec:d1=1,d2=2"])
def test_sharded_loop_pins_layouts_per_shard(spec):
  """On a (2, 4) mesh the TPU layout pins (`layers.compact`, `row_major`) apply to each device's shard
  (`rules.per_shard`): the loop gathers no KV slot or weight stack whole (on main before this, AR had 80
  all-gathers at these sizes; Huginn-0125 at batch 8 on v5e-8, 265 KV copies in its loop)."""
  r = aot.compile_loop(CFG, spec, "tpu:v5e:2x4", (2, 4), batch=2)
  assert r.compiled, r.error
  assert "all-gather" not in r.hlo and r.loop_copies == 0


@needs_tpu
@pytest.mark.parametrize(
    "width",
    [
        pytest.param((4, 64, 32), id="tiny"),
        # Huginn-0125's widths (56 heads laid out, head dim 96), its tiny depth: the copy shows only at a cache
        # too large for on-chip memory (15 s on the 2-core host)
        pytest.param((56, 5376, 2048), id="huginn-width", marks=pytest.mark.slow),
    ],
)
def test_sharded_write_of_a_batch_stays_per_shard(width):
  """AR at batch 8 on a (2, 4) mesh writes each token's entries shard by shard as update slices
  (`rules.per_shard_call`): no KV copy in its loop. Before, the partitioned scatter's result was copied whole
  into the pinned layout every token (the huginn-width case: 1 copy; Huginn-0125: 2)."""
  heads, hidden, context = width
  cfg = model_config("huginn:tiny", recurrence=4, max_len=context)
  if heads != cfg.num_heads:
    cfg = cfg.replace(dtype="bfloat16", hidden_size=hidden, num_heads=heads, num_kv_heads=heads, head_dim=96)
    cfg = cfg.replace(intermediate_size=2 * hidden)
  r = aot.compile_loop(cfg, "ar", "tpu:v5e:2x4", (2, 4), batch=8)
  assert r.compiled, r.error
  assert "all-gather" not in r.hlo and r.loop_copies == 0


@needs_tpu
def test_one_chip_write_of_a_batch_keeps_a_huginn_shaped_cache_in_place():
  """AR at batch 8 on one chip writes each request's token as an update slice (`kvcache._put`): a scatter of
  one column per request into a head-dim-96 cache (positions on the lanes) was laid out as heads under
  positions, so the whole buffer was copied into and out of that layout every token (7 copies here before;
  Huginn-0125 with two core layers and R = 2: 32; on a 1x16 mesh: 2)."""
  cfg = model_config("huginn:tiny", hidden_size=2688, num_heads=28, num_kv_heads=28, head_dim=96)
  cfg = cfg.replace(intermediate_size=1024, n_core=1, recurrence=1, max_len=2048, dtype="bfloat16")
  r = aot.compile_loop(cfg, "ar", TARGET, batch=8)
  assert r.compiled, r.error
  assert r.loop_copies == 0


@needs_tpu
def test_chain_keeps_an_ouro_shaped_cache_in_place():
  """Ouro's head dim of 128 (16 KV heads, 2048 positions: heads under positions, `layers.kv_order`): chain's
  loop reads and writes its core buffers in their argument layout. Before the reads and write windows were
  pinned too, 2 copies of a core buffer in this loop (Ouro-1.4B: chain 13, tree 26 per round)."""
  cfg = model_config("ouro:tiny", hidden_size=2048, num_heads=16, num_kv_heads=16, head_dim=128)
  cfg = cfg.replace(intermediate_size=4096, n_core=1, recurrence=3, max_len=2048)
  r = aot.compile_loop(cfg, "chain:d1=1,gamma=4", TARGET)
  assert r.compiled, r.error
  assert r.loop_copies == 0


@needs_tpu
def test_loopspec_keeps_one_head_per_device_in_place():
  """LoopSpec (1, 2) of an Ouro-shaped model (16 KV heads of 128) at batch 8 on a 1x16 mesh: one head per
  device, whose shard [.., 8, 1, T, 128] the TPU keeps with the batch under the positions. Its pins used the
  whole buffer's order (heads there, one padded to two rows), so the compiler relaid every core buffer out
  before the loop and back after it: temporaries 2.2x the cache here, and Ouro-2.6B at 8192 positions refused
  on v5e-16 (18.56 GiB). Pinned per shard in the shard's order (`layers.kv_pinned`): well under one cache."""
  cfg = model_config("ouro:tiny", hidden_size=2048, num_heads=16, num_kv_heads=16, head_dim=128)
  cfg = cfg.replace(intermediate_size=4096, n_core=1, recurrence=4, max_len=2048, dtype="bfloat16")
  r = aot.compile_loop(cfg, "loopspec:d1=1,d2=2", "tpu:v5e:4x4", (1, 16), batch=8)
  assert r.compiled, r.error
  cache = 2 * cfg.recurrence * 8 * 2049 * 128 * 2  # k and v of the core layer, one head, per device
  assert r.memory["temp_bytes"] < 0.5 * cache and r.loop_copies == 0, r.memory


@pytest.mark.skipif(aot.cuda_unavailable() is not None, reason=f"GPU compiler: {aot.cuda_unavailable()}")
@pytest.mark.parametrize("spec", ["ar", "loopspec:d1=1,d2=2"])
def test_loop_compiles_for_an_h100_without_a_gpu(spec):
  """The CUDA PJRT plugin compiles for a described H100 (`aot.GPU_SPECS`) on a host without a GPU: memory
  analysis, no KV copies in the loop (XLA's GPU cost_analysis is empty here)."""
  r = aot.compile_loop(CFG, spec, "cuda:h100")
  assert r.compiled, r.error
  assert r.memory["argument_bytes"] > 0 and r.memory["fits"] and r.loop_copies == 0


def test_gpu_target_config_is_a_text_proto():
  text = aot.gpu_target_config("h100")
  assert text.startswith("gpu_device_info { ") and "cuda_compute_capability { major: 9 }" in text
  assert aot.parse_target("cuda:h100").hbm_bytes == 84942979072


def test_slot_elements_is_one_devices_share():
  dims = [(4, 2, 8, 64, 16)]  # [G, B, KV, T, D]: a slot is B x KV x T x D
  assert aot.slot_elements(dims) == 2 * 8 * 64 * 16
  assert aot.slot_elements(dims, (2, 4)) == 2 * 8 * 64 * 16 // 8


def test_loop_copies_counts_only_kv_buffers_in_while_bodies():
  def loop(buf, v):
    body = lambda c: (c[0] + 1, c[1].at[c[0]].set(v), c[1])  # the carry holds old and new: a copy per iteration
    return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, buf, buf))

  buf, row = jax.numpy.zeros((4, 16, 8)), jax.numpy.ones((16, 8))
  hlo = jax.jit(loop).lower(buf, row).compile().as_text()
  assert aot.loop_copies(hlo, 16 * 8, 16) >= 1
  assert aot.loop_copies(hlo, 16 * 8, 99) == 0  # no buffer of that cache length


def _attend_loop(pin):
  """A decode-like loop over eight layers of KV slots [1, H, T, D] (Huginn's 55 heads of 96): each iteration a query per
  head attends to each slot and writes one position, through `pin` (kvcache.stored or the identity)."""
  jnp = jax.numpy

  def loop(w, caches, x):
    def body(c):
      i, x, caches = c
      new = []
      for k, v in caches:
        q = (x @ w).reshape(1, 55, 96)
        sc = jnp.einsum("bhd,bhtd->bht", q, k, preferred_element_type=jnp.float32)
        p = jax.nn.softmax(jnp.where(jnp.arange(k.shape[2]) < i, sc, -1e30), -1).astype(v.dtype)
        x = x + jnp.einsum("bht,bhtd->bhd", p, v).reshape(1, -1)
        put = lambda buf: pin(jax.lax.dynamic_update_slice(buf, q[:, :, None].astype(buf.dtype), (0, 0, i, 0)))
        new.append((put(k), put(v)))
      return i + 1, x, tuple(new)

    return jax.lax.while_loop(lambda c: c[0] < 8, body, (0, x, caches))

  return loop


@needs_tpu
def test_kv_pin_keeps_the_loop_in_the_arguments_layout():
  """Unpinned, the TPU compiler carries [.., T, 96] slots with the head dim on the lanes (padded to 128) and
  relays every slot out into temporaries before the loop; pinned (kvcache.stored), no temporaries."""
  from loopspec_jax.models import kvcache  # noqa: PLC0415

  mesh = aot.target_mesh(aot.parse_target(TARGET))
  sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  s = lambda shape: jax.ShapeDtypeStruct(shape, jax.numpy.bfloat16, sharding=sh)
  slot = (1, 55, 2048, 96)
  args = (s((5280, 5280)), tuple((s(slot), s(slot)) for _ in range(8)), s((1, 5280)))
  temp = {}
  for name, pin in (("none", lambda b: b), ("stored", kvcache.stored)):
    c = jax.jit(_attend_loop(pin), donate_argnums=(1,)).lower(*args).compile()
    temp[name] = c.memory_analysis().temp_size_in_bytes
    assert aot.loop_copies(c.as_text(), 55 * 2048 * 96, 2048) == 0
  slot_bytes = 55 * 2048 * 96 * 2
  assert temp["none"] >= 16 * slot_bytes  # the 16 slots relaid out (padded)
  assert temp["stored"] < slot_bytes, temp


def test_kv_pin_is_a_no_op_off_tpu():
  from loopspec_jax.models import kvcache  # noqa: PLC0415

  x = jax.numpy.zeros((1, 4, 32, 8))
  hlo = jax.jit(lambda b: kvcache.stored(b) * 2).lower(x).compile().as_text()
  assert "layout" not in hlo.lower().replace("entry_computation_layout", "") and "copy" not in hlo


@needs_tpu
@pytest.mark.parametrize("target, mesh", [(TARGET, (1, 1)), ("tpu:v5e:2x4", (2, 4))])
def test_argument_floor_bounds_the_compilers_arguments(target, mesh):
  """`argument_floor` (logical shard bytes) never exceeds the compiler's argument bytes per device, which add
  only layout padding: so a floor over HBM is a refusal the compiler would reach after a whole compile."""
  loop = aot.cost.abstract_loop(CFG, "loopspec:d1=1,d2=2", batch=2)
  prog = aot.loop_program(loop, aot.parse_target(target), mesh)
  r = aot.compile_loop(CFG, "loopspec:d1=1,d2=2", target, mesh, batch=2)
  assert r.compiled, r.error
  assert 0 < aot.argument_floor(prog.arrays) <= r.memory["argument_bytes"]


@needs_tpu
def test_arguments_over_hbm_are_refused_before_compiling():
  """A cache that alone is over one v5e chip (16.91 GB) is refused without a compile, the reason and the
  floor in the row; the same program on 16 chips is small enough to be left to the compiler."""
  cfg = CFG.replace(max_len=2**24, dtype="bfloat16")  # four 4.3 GB slots at batch 8
  r = aot.compile_loop(cfg, "ar", TARGET, batch=8)
  assert not r.compiled and r.compile_seconds == 0.0 and r.loop_copies is None
  assert r.error.startswith("not compiled: its arguments alone need") and "tpu:v5e:2x2 chip" in r.error
  assert r.memory["argument_bytes"] > aot.parse_target(TARGET).hbm_bytes and r.memory["fits"] is False
  assert aot.over_hbm(r.memory["argument_bytes"] / 16, aot.parse_target("tpu:v5e:4x4")) is None
