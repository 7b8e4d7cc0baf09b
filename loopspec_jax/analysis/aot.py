"""Compile-only targets: a decode loop compiled for a TPU topology without a TPU, and what its compiler says.

libtpu (the `[tpu]` extra) holds the TPU compiler; `jax.experimental.topologies.get_topology_desc` gives a
topology's devices on any host, and a program lowered from `jax.ShapeDtypeStruct`s whose NamedShardings use
those devices compiles to a real TPU executable: `memory_analysis()` (what must fit HBM), `cost_analysis()`
(XLA's own flops / bytes / `optimal_seconds`) and `as_text()` (the TPU compiler's optimised HLO). Nothing is
placed: the default backend stays the CPU for the rest of the process.

Targets are names: "cpu" (the host's backend, as `cost.compile_decode_loop`), "tpu:<generation>" (its smallest
topology, `TOPOLOGIES`) or "tpu:<generation>:<topology>" (e.g. "tpu:v5e:2x4"). A loop runs on a ('data',
'model') mesh over the first data x model devices of the topology (one chip: (1, 1)), through the same
entry points and sharding rules as `generate(mesh=...)` (`parallel/sharding.py`'s `program`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re
import time
from typing import Optional, Tuple

import jax
from jax.experimental.compilation_cache import compilation_cache

from loopspec_jax.analysis import cost
from loopspec_jax.analysis.hlo import parse_hlo
from loopspec_jax.config import ModelConfig
from loopspec_jax.parallel import sharding

GIB = 1024.0**3
# generation -> (smallest topology get_topology_desc accepts, HBM per device in bytes). v5e's and v4's are the
# figures their compilers refuse a program over (v5e 15.75 GiB of 16; v4 "available HBM (15.25G)" for one
# device of the topology, not the chip's nominal 32 GiB); v5p and v6e are the nominal capacities.
TOPOLOGIES = {
    "v4": ("2x2x1", 15.25 * GIB),
    "v5e": ("2x2", 15.75 * GIB),
    "v5p": ("2x2x1", 95 * GIB),
    "v6e": ("2x2", 32 * GIB),
}

# GPU targets ("cuda:<name>"): the CUDA PJRT plugin (`jax-cuda12-pjrt`, the `[cuda-aot]` extra) compiles for a
# GPU described by a `GpuTargetConfigProto` without one. The device facts XLA's compiler reads (NVIDIA's
# published H100 SXM figures, as XLA's own spec of it lists them); its memory is the chip's HBM.
GPU_SPECS = {
    "h100": {
        "threads_per_block_limit": 1024,
        "threads_per_warp": 32,
        "shared_memory_per_block": 49152,
        "shared_memory_per_core": 233472,
        "threads_per_core_limit": 2048,
        "core_count": 132,
        "fpus_per_core": 128,
        "block_dim_limit_x": 2147483647,
        "block_dim_limit_y": 65535,
        "block_dim_limit_z": 65535,
        "memory_bandwidth": 3352320000000,
        "l2_cache_size": 52428800,
        "clock_rate_ghz": 1.98,
        "device_memory_size": 84942979072,
        "shared_memory_per_block_optin": 232448,
        "registers_per_core_limit": 65536,
        "registers_per_block_limit": 65536,
        "cuda_compute_capability": {"major": 9},
    },
}
GPU_NAMES = {"h100": "NVIDIA H100 80GB HBM3"}


def gpu_target_config(name: str) -> str:
  """The `GpuTargetConfigProto` (text format) of a GPU in GPU_SPECS."""
  fields = lambda d: " ".join(f"{k} {{ {fields(v)} }}" if isinstance(v, dict) else f"{k}: {v}" for k, v in d.items())
  return (
      f'gpu_device_info {{ {fields(GPU_SPECS[name])} }} platform_name: "CUDA" '
      f'dnn_version_info {{ major: 8 minor: 9 patch: 4 }} device_description_str: "{GPU_NAMES[name]}"'
  )


@dataclasses.dataclass(frozen=True)
class Target:
  """A compile target: platform 'cpu', 'tpu' (a generation and topology: 'v5e', '2x4') or 'cuda' (a GPU of
  GPU_SPECS as the generation, one device)."""

  platform: str
  generation: Optional[str] = None
  topology: Optional[str] = None

  @property
  def name(self) -> str:
    if self.platform == "cuda":
      return f"cuda:{self.generation}"
    return self.platform if self.platform == "cpu" else f"tpu:{self.generation}:{self.topology}"

  @property
  def hbm_bytes(self) -> Optional[float]:
    """HBM of one chip (None on the CPU)."""
    if self.platform == "cuda":
      return float(GPU_SPECS[self.generation]["device_memory_size"])
    return TOPOLOGIES[self.generation][1] if self.platform == "tpu" else None


def parse_target(text: str) -> Target:
  """'cpu' | 'tpu:v5e' | 'tpu:v5e:2x4' -> Target; anything else is a ValueError naming the choices."""
  parts = str(text).strip().lower().split(":")
  if parts == ["cpu"]:
    return Target("cpu")
  if parts[0] == "cuda" and len(parts) == 2 and parts[1] in GPU_SPECS:
    return Target("cuda", parts[1], "1x1x1")
  if parts[0] == "tpu" and len(parts) in (2, 3) and parts[1] in TOPOLOGIES:
    topo = parts[2] if len(parts) == 3 else TOPOLOGIES[parts[1]][0]
    if re.fullmatch(r"\d+(x\d+){1,2}", topo):
      return Target("tpu", parts[1], topo)
  raise ValueError(
      f"unknown target {text!r}: 'cpu', 'tpu:<generation>[:<topology>]' (generations {sorted(TOPOLOGIES)}) or"
      f" 'cuda:<gpu>' (gpus {sorted(GPU_SPECS)})"
  )


def tpu_unavailable() -> Optional[str]:
  """Why TPU targets cannot compile here (None when libtpu is installed)."""
  if importlib.util.find_spec("libtpu") is None:
    return "libtpu is not installed (pip install '.[tpu]')"
  return None


def cuda_unavailable() -> Optional[str]:
  """Why GPU targets cannot compile here (None when the CUDA PJRT plugin is installed)."""
  if importlib.util.find_spec("jax_plugins") is None or importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
    return "the CUDA PJRT plugin is not installed (pip install '.[cuda-aot]')"
  return None


def unavailable(target: Target) -> Optional[str]:
  """Why the target cannot compile here (None when it can)."""
  return {"tpu": tpu_unavailable, "cuda": cuda_unavailable}.get(target.platform, lambda: None)()


@functools.lru_cache(maxsize=None)
def target_devices(target: Target) -> tuple:
  """The target's devices: the CPU backend's, a TPU topology's or a described GPU's (abstract: they compile,
  never run)."""
  if target.platform == "cpu":
    return tuple(jax.devices("cpu"))
  if target.platform == "cuda":
    reason = cuda_unavailable()
    if reason:
      raise RuntimeError(f"target {target.name}: {reason}")
    from jax.experimental import topologies  # noqa: PLC0415

    config = gpu_target_config(target.generation)
    desc = topologies.get_topology_desc(target.generation, "cuda", target_config=config, topology=target.topology)
    return tuple(desc.devices)
  reason = tpu_unavailable()
  if reason:
    raise RuntimeError(f"target {target.name}: {reason}")
  from jax.experimental import topologies  # noqa: PLC0415 (only TPU targets need it)

  # libtpu locks /tmp/libtpu_lockfile for one process per host (it would own the chips); compiling for a
  # topology owns none, so several processes (pytest workers, a report beside the tests) may load it.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

  return tuple(
      topologies.get_topology_desc(platform="tpu", topology_name=f"{target.generation}:{target.topology}").devices
  )


def target_mesh(target: Target, mesh_shape: Tuple[int, int] = (1, 1)):
  """A ('data', 'model') mesh over the first data x model devices of the target."""
  return sharding.make_mesh(mesh_shape, target_devices(target))


@dataclasses.dataclass
class AotLoop:
  """One decode loop compiled (or refused) for a target: the compiler's figures and its optimised HLO."""

  method: str
  target: str
  mesh: Tuple[int, int]
  compiled: bool
  error: Optional[str]
  compile_seconds: float
  memory: dict  # argument / output / alias / temp bytes (`memory_row`)
  xla_cost: dict  # cost_analysis(): flops, bytes accessed, optimal_seconds (TPU), transcendentals
  hlo: str
  kv_dims: list
  slot_bytes: float
  total_len: int

  @property
  def loop_copies(self) -> Optional[int]:
    """`loop_copies` of the compiled HLO (None when the compiler refused the program)."""
    if not self.compiled:
      return None
    return loop_copies(self.hlo, slot_elements(self.kv_dims, self.mesh), self.total_len)


def slot_elements(kv_dims: list, mesh: Tuple[int, int] = (1, 1)) -> int:
  """Elements of one KV slot [B, KV, T, D] on one device: the whole slot over the devices of the mesh (requests
  over data, KV heads over model; a dim the mesh does not divide is replicated, so this is at most the
  device's share and `loop_copies` counts no fewer copies)."""
  slot = kv_dims[0][-4:] if kv_dims else (1,)
  return max(1, math.prod(slot) // (int(mesh[0]) * int(mesh[1])))


def memory_row(stats, hbm: Optional[float]) -> dict:
  """Bytes per device of a compiled program (`compiled.memory_analysis()`): arguments, outputs, outputs
  aliased to (donated) arguments, temporaries, their sum `hbm_bytes` (arguments + outputs - aliased +
  temporaries + code) and whether it fits one chip's HBM."""
  row = {
      "argument_bytes": float(stats.argument_size_in_bytes),
      "output_bytes": float(stats.output_size_in_bytes),
      "alias_bytes": float(stats.alias_size_in_bytes),
      "temp_bytes": float(stats.temp_size_in_bytes),
      "code_bytes": float(stats.generated_code_size_in_bytes),
  }
  row["hbm_bytes"] = (
      row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"] + row["temp_bytes"] + row["code_bytes"]
  )
  row["fits"] = None if hbm is None else bool(row["hbm_bytes"] <= hbm)
  return row


def refused_temp_bytes(error: str) -> Optional[float]:
  """The memory a TPU compiler refused for HBM ('... HLO temporaries (31.65G) exceeds ...'), in bytes. The
  message says temporaries, but the figure is arguments + temporaries: Huginn-0125 AR on main reads 31.65G
  on v5e and 11.99 + 19.78 = 31.77 GiB of arguments + temporaries on v5p (`refused_memory`)."""
  m = re.search(r"HLO temporaries \(([\d.]+)([KMGT])\)", error or "")
  return float(m.group(1)) * 1024.0 ** "KMGT".index(m.group(2)) * 1024 if m else None


def refused_memory(error: str, floor: float) -> dict:
  """`memory_row` of a program refused for HBM: hbm_bytes the figure the compiler names, argument_bytes
  `floor` (the program's `argument_floor` per device: its logical bytes, without the TPU layouts' padding, on
  one chip or a mesh), temp_bytes their difference."""
  need = refused_temp_bytes(error)
  temp = None if need is None else need - floor
  return {"hbm_bytes": need, "argument_bytes": floor, "temp_bytes": temp, "fits": False}


def xla_cost_row(compiled) -> dict:
  """XLA's cost_analysis() totals (its per-operand keys dropped): flops, bytes accessed, optimal_seconds."""
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  return {k: float(v) for k, v in (ca or {}).items() if "{" not in k}


# Every registered decoding method once (`methods.NAMES` less 'auto', which picks one of these): LoopSpec with
# and without its second proposal. {d1} / {d2}: the draft depths (`method_specs`).
METHOD_SPECS = (
    "ar",
    "chain:d1={d1},gamma=8",
    "loopspec:d1={d1},d2={d2}",
    "loopspec:d1={d1}",
    "tree",
    "draft:gamma=4",
    "lookup:ngram=3,gamma=4",
    "lookahead",
    "medusa",
    "eagle",
    "mtp",
    "dflash",
)


def method_specs(d1: int = 2, d2: int = 8) -> tuple:
  return tuple(s.format(d1=d1, d2=d2) for s in METHOD_SPECS)


def stand_in_arguments(cfg: ModelConfig, spec: str) -> dict:
  """Abstract stand-ins for the artefacts a method takes (shapes only; nothing is trained or loaded): draft's
  drafter is the target's own architecture at recurrence 1; medusa (4 heads), eagle, mtp and dflash get heads of
  their kind shaped for cfg."""
  from loopspec_jax.heads import artefact, dflash, eagle, medusa, mtp  # noqa: PLC0415 (heavy: only these methods)
  from loopspec_jax.models import looped, model  # noqa: PLC0415

  name = spec.partition(":")[0]
  if name == "draft":
    dcfg = cfg.replace(recurrence=1)
    return {"draft_model": model.LoopedModel(dcfg, looped.abstract_params(dcfg), source="stand-in")}
  heads = {
      "medusa": lambda: ("medusa", medusa.abstract_params, medusa.config_of(cfg, 4)),
      "eagle": lambda: ("eagle", eagle.abstract_params, eagle.head_config(cfg)),
      "mtp": lambda: ("mtp", lambda c: mtp.init_params_abstract(cfg), mtp.head_config(cfg, 1.0)),
      "dflash": lambda: ("dflash", dflash.abstract_params, dflash.head_config(cfg)),
  }
  if name in heads:
    kind, shapes, config = heads[name]()
    return {"heads": artefact.Heads(kind, shapes(config), config, {}, source="stand-in")}
  return {}


def loop_program(loop: cost.AbstractLoop, target: Target, mesh_shape: Tuple[int, int] = (1, 1)):
  """The decode loop's sharded program for the target (`sharding.program`) over abstract values placed on the
  topology's devices; lowers and compiles nothing."""
  dec = loop.decoder
  mesh = target_mesh(target, mesh_shape)
  return sharding.program(dec.loop, mesh, loop.params, loop.state, loop.sp, **dec.loop_kw)


def argument_floor(arrays) -> float:
  """Bytes per device of a program's array arguments (abstract values with their shardings) by their logical
  shard shapes: a floor on the compiler's `argument_bytes`, which only adds the TPU layouts' padding (the
  largest device's share where a dimension does not divide)."""
  leaves = [x for x in jax.tree_util.tree_leaves(arrays) if hasattr(x, "dtype") and hasattr(x, "shape")]
  share = lambda x: x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
  return float(sum(math.prod(share(x)) * x.dtype.itemsize for x in leaves))


# How `over_hbm`'s reason begins: a row refused before compiling (its memory only `argument_floor`).
NOT_COMPILED = "not compiled: "


def over_hbm(floor: float, target: Target) -> Optional[str]:
  """Why a program whose arguments alone take `floor` bytes per device cannot fit the target's chip (None
  when it may): said before compiling, since the compiler would refuse it after a whole compile."""
  hbm = target.hbm_bytes
  if hbm is None or floor <= hbm:
    return None
  return (
      f"{NOT_COMPILED}its arguments alone need {floor / 1e9:.2f} GB per device (their logical bytes, before "
      f"layout padding), over the {hbm / 1e9:.2f} GB HBM of one {target.name} chip"
  )


def compile_only(lowered):
  """lowered.compile() for a topology's devices, past the persistent compilation cache: such an executable
  cannot be loaded back ("PjRtCompiler must be constructed with a Client"), so a cached entry (with
  `user_cache` or the tests' cache enabled) bought only disk and, on the next run, a warning and a recompile.
  JAX decides whether to use the cache once per process, so the switch is followed by a reset each way."""
  was = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    return lowered.compile()
  finally:
    jax.config.update("jax_enable_compilation_cache", was)
    compilation_cache.reset_cache()


def compile_loop(
    cfg: ModelConfig, method, target="tpu:v5e", mesh_shape: Tuple[int, int] = (1, 1), *, batch: int = 1, **kw
) -> AotLoop:
  """Compiles `method`'s decode loop for cfg on the target (a name or Target) from abstract shapes.

  kw: `cost.abstract_loop`'s (prompt_len, greedy, random_init) and the method's arguments. On a mesh
  whose model axis does not divide the heads, cfg is laid out first (`sharding.padded_config`). A program the
  target's compiler refuses (e.g. over HBM) is returned with compiled=False and the compiler's message;
  for an HBM refusal `memory` is `refused_memory`. One whose arguments alone exceed the chip's HBM
  (`over_hbm`) is returned so without compiling, `memory` its `argument_floor`."""
  target = parse_target(target) if isinstance(target, str) else target
  # The heads laid out for the mesh as `generate(mesh=)` / `load(mesh=)` lay them out (Huginn-0125's 55 heads
  # are 56 on a model axis of 2, 4 or 8): the cache and the parameters have the decoders' head count.
  cfg = sharding.padded_config(cfg, target_mesh(target, mesh_shape))
  if isinstance(method, str):
    kw = {**stand_in_arguments(cfg, method), **kw}
  loop = cost.abstract_loop(cfg, method, batch=batch, **kw)
  args = (loop.method, target.name, tuple(mesh_shape))
  kv = (cost.kv_leaf_dims(loop.state), cost.slot_bytes(cfg, batch, loop.total_len), loop.total_len)
  prog = loop_program(loop, target, mesh_shape)
  floor = argument_floor(prog.arrays)
  reason = over_hbm(floor, target)
  if reason:
    mem = {"argument_bytes": floor, "temp_bytes": None, "hbm_bytes": None, "fits": False}
    return AotLoop(*args, False, reason, 0.0, mem, {}, "", *kv)
  lowered = prog.lower()
  t0 = time.perf_counter()
  try:
    compiled = compile_only(lowered)
  except Exception as e:  # noqa: BLE001 (the compiler's refusal is a result: reported, not raised)
    msg = str(e).strip().splitlines()[0][:500]
    return AotLoop(*args, False, msg, time.perf_counter() - t0, refused_memory(msg, floor), {}, "", *kv)
  seconds = time.perf_counter() - t0
  mem = memory_row(compiled.memory_analysis(), target.hbm_bytes)
  return AotLoop(*args, True, None, seconds, mem, xla_cost_row(compiled), compiled.as_text(), *kv)


def loop_copies(hlo: str, slot_elements: int, cache_len: int) -> int:
  """Copies of a KV buffer of at least one slot (`slot_elements` elements, a dimension of the cache length
  `cache_len`) inside a while body: copy / copy-start ops, and fusions whose root is a copy (counted once,
  where they are called), in every computation a while body reaches (calls, branches, inner loops), whose
  result lives in HBM. The
  rule the CPU-compiled loops hold: 0. A copy into another memory space (a TPU layout `S(n)`: a prefetch to
  on-chip memory, which at tiny sizes holds a whole cache) duplicates nothing in HBM and is not counted."""
  comps, _ = parse_hlo(hlo)
  on_chip = _on_chip_results(hlo)
  bodies = [i.attr("body") for c in comps.values() for i in c.instrs.values() if i.opcode == "while"]
  seen, stack = set(), [b for b in bodies if b in comps]
  count = 0
  while stack:
    name = stack.pop()
    if name in seen:
      continue
    seen.add(name)
    comp = comps[name]
    for ins in comp.instrs.values():
      for key in ("body", "condition", "to_apply", "true_computation", "false_computation"):
        if ins.attr(key) in comps:
          stack.append(ins.attr(key))
      stack += [b for b in ins.attr_list("branch_computations") if b in comps]
      dims = _operand_dims(ins, comp)
      big = cache_len in dims and math.prod(dims) >= slot_elements
      if big and _is_copy(ins, comps) and ins.name not in on_chip:
        count += 1
  return count


def _on_chip_results(hlo: str) -> set:
  """Names of the moves between memory spaces: instructions whose (first) result has a memory space `S(n)`
  in its layout, copy-starts with either side (their first two results) in one (an eviction from on-chip
  memory back to HBM is a move too), and copies whose operand has one (the same eviction, written as a plain
  copy: at tiny sizes a scatter runs in on-chip memory and its result is copied out to the loop's buffer)."""
  out, spaced = set(), set()
  pattern = r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s+=\s+(\(?[a-z0-9]+\[[^=]*?)\s([\w\-]+)\(%?([\w.\-]*)"
  for m in re.finditer(pattern, hlo, re.M):
    layouts = re.findall(r"\]\{([^}]*)\}", m.group(2))
    sides = layouts[:2] if m.group(3) == "copy-start" else layouts[:1]
    if any("S(" in x for x in layouts[:1]):
      spaced.add(m.group(1))
    if any("S(" in x for x in sides) or (m.group(3) == "copy" and m.group(4) in spaced):
      out.add(m.group(1))
  return out


def _is_copy(ins, comps) -> bool:
  if ins.opcode in ("copy", "copy-start"):
    return True
  if ins.opcode == "fusion" and ins.attr("calls") in comps:
    called = comps[ins.attr("calls")]
    return called.instrs[called.root].opcode == "copy"
  return False


def _operand_dims(ins, comp) -> tuple:
  src = comp.instrs.get(ins.operands[0]) if ins.operands else None
  return tuple(src.dims if src is not None and not src.is_tuple else ins.dims)
