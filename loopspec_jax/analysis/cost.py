"""Device-independent cost of one decode-loop iteration, read from XLA's optimised HLO.

One iteration of a decoder's outer `lax.while_loop` is one AR token, one chain round or one LoopSpec tick.
`compile_decode_loop` compiles the decoder's real jitted loop from abstract shapes (no weights are
allocated), `analyze_hlo` finds the outermost while loop of the optimised HLO and sums over its body:

  ops     every instruction that is not free (parameter, constant, tuple, get-tuple-element, bitcast);
          a fusion is one op. Inner while bodies count times their trip count.
  flops   2 * prod(result dims) * prod(contracting dims) per dot (batch dims included), fused or not.
  bytes   split into weights / kv / copies / other:
          - dots read every operand and write their result;
          - gathers and non-contiguous slices (alone or fused with views) read and write what they
            select; a contiguous slice (one block of the buffer) is a view whose consumer reads it;
          - in-place writes (dynamic-update-slice, scatter) count only the UPDATE bytes;
          - copies (copy ops and copy/transpose-only fusions, e.g. of a gathered slot) read and write the
            whole operand;
          - other kernels write their output and read the loop inputs they touch (weights, KV, state).
          Bytes are counted at the STORAGE dtype of the buffer a value comes from (looking through
          converts): the CPU backend computes bf16 in f32 and keeps f32 shadows of bf16 buffers, which an
          accelerator would not; pure dtype conversions are reported separately (`convert_bytes`) and are
          not in the total. XLA's own cost_analysis()["bytes accessed"] is not used: it counts every
          in-place update as a whole-buffer access.
          weights = reads of loop-invariant loop inputs; kv = reads/writes of buffers with a KV-cache shape
          (the committed cache, the speculative store) or slices/gathers of them.
Copies whose operand is at least one cache slot (B x KV x T x D) are listed; "loop-carried" ones copy a
whole loop-carried buffer (the defect of issue 9). Conditionals count their most expensive branch (by
bytes) unless `branch="mean"`.

`roofline` turns a cost into a step time on a named accelerator: max(flops / peak, bytes / bandwidth)
+ ops * per-op overhead.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from typing import Dict, Iterable, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.analysis import theory
from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import autoregressive
from loopspec_jax.decoding import chain
from loopspec_jax.decoding import common
from loopspec_jax.decoding.loopspec import decoder as loopspec_decoder
from loopspec_jax.models import looped as M

DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "s32": 4,
    "u32": 4,
    "s64": 8,
    "u64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "s4": 0.5,
    "u4": 0.5,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "f8e4m3b11fnuz": 1,
    "token": 0,
    "tuple": 0,
}
FREE_OPS = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "opt-barrier",
        "partition-id",
        "replica-id",
        "add-dependency",
    }
)
VIEW_OPS = frozenset({"bitcast", "reshape", "convert", "get-tuple-element"})  # no data movement on a device
MOVE_OPS = frozenset({"copy", "transpose"})  # physical layout changes
SLICE_OPS = frozenset({"dynamic-slice", "slice", "gather"})
INPLACE_OPS = frozenset({"dynamic-update-slice", "scatter"})
CATEGORIES = ("weights", "kv", "copies", "other")

MAKE_DECODER = {
    "ar": autoregressive.make_decoder,
    "chain": chain.make_decoder,
    "loopspec": loopspec_decoder.make_decoder,
}


# ---------------------------------------------------------------------------------------------------
# HLO text parsing
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Instr:
  """One HLO instruction: leaves of its shape as (dtype, dims), opcode, operand names, raw attributes."""

  name: str
  shapes: List[Tuple[str, Tuple[int, ...]]]
  is_tuple: bool
  opcode: str
  operands: List[str]
  raw_operands: str
  attrs: str

  @property
  def dims(self) -> Tuple[int, ...]:
    return self.shapes[0][1] if self.shapes else ()

  def elements(self, leaf: int = 0) -> int:
    return int(np.prod(self.shapes[leaf][1])) if self.shapes else 0

  def nbytes(self) -> float:
    return float(sum(np.prod(d) * DTYPE_BYTES.get(t, 4) for t, d in self.shapes))

  def attr(self, key: str) -> Optional[str]:
    m = re.search(rf"(?:^|[\s,]){re.escape(key)}=%?([\w.\-]+)", self.attrs)
    return m.group(1) if m else None

  def attr_list(self, key: str) -> List[str]:
    m = re.search(rf"{re.escape(key)}=\{{([^}}]*)\}}", self.attrs)
    return [x.strip().lstrip("%") for x in m.group(1).split(",") if x.strip()] if m else []


@dataclasses.dataclass
class Computation:
  name: str
  instrs: Dict[str, Instr]
  root: str
  params: Dict[int, str]  # parameter number -> instruction name


_COMMENT = re.compile(r"/\*.*?\*/")
_LEAF = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s+->\s+.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s+=\s+(.*)$")


def _balanced(text: str, start: int) -> int:
  """Index just past the bracket group opening at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    c = text[i]
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def _split_top(text: str) -> List[str]:
  """Splits on commas outside brackets."""
  out, depth, cur = [], 0, []
  for c in text:
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
    if c == "," and depth == 0:
      out.append("".join(cur))
      cur = []
    else:
      cur.append(c)
  if cur:
    out.append("".join(cur))
  return [x.strip() for x in out if x.strip()]


def parse_shape(text: str) -> List[Tuple[str, Tuple[int, ...]]]:
  """'(f32[2,3]{1,0}, s32[])' -> [('f32', (2, 3)), ('s32', ())]."""
  out = []
  for dt, dims in _LEAF.findall(text):
    dims = dims.replace("<=", "")
    out.append((dt, tuple(int(d) for d in dims.split(",") if d.strip())))
  return out


def parse_instr(line: str) -> Optional[Tuple[Instr, bool]]:
  """Parses one instruction line; returns (instr, is_root) or None."""
  m = _INSTR.match(line)
  if not m:
    return None
  is_root, name, rest = bool(m.group(1)), m.group(2), m.group(3)
  if rest.startswith("("):
    end = _balanced(rest, 0)
    shape_text, rest = rest[:end], rest[end:].lstrip()
    is_tuple = True
  else:
    shape_text, _, rest = rest.partition(" ")
    is_tuple = False
  om = re.match(r"([\w\-]+)\(", rest)
  if not om:
    return None
  opcode = om.group(1)
  end = _balanced(rest, om.end() - 1)
  raw = rest[om.end() : end - 1]
  attrs = rest[end:]
  operands = []
  if opcode != "constant":
    for item in _split_top(raw):
      tok = item.split()[-1]
      if tok.startswith("%") or re.match(r"^[A-Za-z_][\w.\-]*$", tok):
        operands.append(tok.lstrip("%"))
  return Instr(name, parse_shape(shape_text), is_tuple, opcode, operands, raw, attrs), is_root


def parse_hlo(text: str) -> Tuple[Dict[str, Computation], str]:
  """All computations of an HLO module text; returns (computations by name, entry name)."""
  comps, entry, cur = {}, None, None
  for line in _COMMENT.sub("", text).splitlines():
    if cur is None:
      m = _HEADER.match(line)
      if m:
        cur = Computation(m.group(2), {}, "", {})
        if m.group(1):
          entry = cur.name
      continue
    if line.strip() == "}":
      if not cur.root and cur.instrs:
        cur.root = list(cur.instrs)[-1]
      comps[cur.name] = cur
      cur = None
      continue
    parsed = parse_instr(line)
    if parsed is None:
      continue
    ins, is_root = parsed
    cur.instrs[ins.name] = ins
    if is_root:
      cur.root = ins.name
    if ins.opcode == "parameter":
      cur.params[int(ins.raw_operands.strip())] = ins.name
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  return comps, entry


# ---------------------------------------------------------------------------------------------------
# Costs
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class CopyRecord:
  name: str
  nbytes: float  # operand bytes at storage dtype (read once and written once per execution)
  count: float  # executions per iteration
  loop_carried: bool  # a whole loop-carried buffer is copied


@dataclasses.dataclass
class StepCost:
  """Cost of one iteration of the outer loop. Bytes per category; flops; ops; copies of >= one cache slot."""

  ops: float = 0.0
  flops: float = 0.0
  bytes: Dict[str, float] = dataclasses.field(default_factory=lambda: {c: 0.0 for c in CATEGORIES})
  convert_bytes: float = 0.0  # pure dtype conversions (CPU bf16 artifacts), not in total_bytes
  large_copies: List[CopyRecord] = dataclasses.field(default_factory=list)
  unknown_trip_counts: int = 0
  conditionals: int = 0
  branch_policy: str = "max"
  items: Dict[Tuple[str, str], float] = dataclasses.field(default_factory=dict)  # (instr, category) -> bytes

  def charge(self, category: str, nbytes: float, who: str):
    self.bytes[category] += nbytes
    self.items[(who, category)] = self.items.get((who, category), 0.0) + nbytes

  def top_items(self, n: int = 10, category: Optional[str] = None) -> List[Tuple[str, str, float]]:
    """The n largest byte items (instruction name, category, bytes per iteration)."""
    rows = [(w, c, b) for (w, c), b in self.items.items() if category in (None, c)]
    return sorted(rows, key=lambda x: -x[2])[:n]

  @property
  def total_bytes(self) -> float:
    return float(sum(self.bytes.values()))

  @property
  def loop_carried_copies(self) -> float:
    return float(sum(c.count for c in self.large_copies if c.loop_carried))

  @property
  def cache_sized_copies(self) -> float:
    return float(sum(c.count for c in self.large_copies))

  def add(self, other: "StepCost", mult: float = 1.0):
    self.ops += mult * other.ops
    self.flops += mult * other.flops
    for c in CATEGORIES:
      self.bytes[c] += mult * other.bytes[c]
    self.convert_bytes += mult * other.convert_bytes
    self.large_copies += [dataclasses.replace(c, count=c.count * mult) for c in other.large_copies]
    for key, b in other.items.items():
      self.items[key] = self.items.get(key, 0.0) + mult * b
    self.unknown_trip_counts += other.unknown_trip_counts
    self.conditionals += other.conditionals

  def as_dict(self) -> dict:
    return {
        "ops": self.ops,
        "flops": self.flops,
        "bytes": dict(self.bytes),
        "total_bytes": self.total_bytes,
        "convert_bytes": self.convert_bytes,
        "loop_carried_copies": self.loop_carried_copies,
        "cache_sized_copies": self.cache_sized_copies,
        "large_copies": [dataclasses.asdict(c) for c in self.large_copies],
        "unknown_trip_counts": self.unknown_trip_counts,
        "conditionals": self.conditionals,
        "branch_policy": self.branch_policy,
    }


@dataclasses.dataclass
class Frame:
  """A computation as executed from one call site (fusion, call, while body, conditional branch)."""

  comp: Computation
  caller: Optional[Instr]
  parent: Optional["Frame"]
  kind: str  # entry | body | fusion | call | branch
  outer: bool = False  # the analysed loop's body


@dataclasses.dataclass(frozen=True)
class Origin:
  """Where a value's bytes live: kind weights | kv | state | computed, and the storage bytes per element."""

  kind: str
  itemsize: float


class HloCostModel:
  """Sums the cost of one iteration of the outermost while loop of an optimised HLO module."""

  def __init__(
      self, text: str, kv_dims: Iterable[Tuple[int, ...]] = (), slot_bytes: float = float("inf"), branch: str = "max"
  ):
    if branch not in ("max", "mean"):
      raise ValueError(f"branch must be 'max' or 'mean', got {branch!r}")
    self.comps, self.entry = parse_hlo(text)
    self.kv_dims = {tuple(d) for d in kv_dims}
    self.slot_bytes = slot_bytes
    self.branch = branch
    self._carried_dims = set()
    self._kind_cache = {}

  # ---- the outer loop ------------------------------------------------------------------------------
  def _subtree_size(self, name: str, seen=None) -> int:
    seen = set() if seen is None else seen
    if name in seen or name not in self.comps:
      return 0
    seen.add(name)
    total = 0
    for ins in self.comps[name].instrs.values():
      total += 1
      for key in ("calls", "body", "condition", "to_apply", "true_computation", "false_computation"):
        sub = ins.attr(key)
        if sub:
          total += self._subtree_size(sub, seen)
      for sub in ins.attr_list("branch_computations"):
        total += self._subtree_size(sub, seen)
    return total

  def outer_loop(self) -> Tuple[Frame, Instr]:
    """(frame holding it, while instruction) of the largest while loop reachable from ENTRY outside loops."""
    best = None
    stack = [Frame(self.comps[self.entry], None, None, "entry")]
    while stack:
      frame = stack.pop()
      for ins in frame.comp.instrs.values():
        if ins.opcode == "while":
          size = self._subtree_size(ins.attr("body"))
          if best is None or size > best[0]:
            best = (size, frame, ins)
        elif ins.opcode == "call" and ins.attr("to_apply") in self.comps:
          stack.append(Frame(self.comps[ins.attr("to_apply")], ins, frame, "call"))
    if best is None:
      raise ValueError("the HLO module has no while loop")
    return best[1], best[2]

  def analyze(self) -> StepCost:
    frame, loop = self.outer_loop()
    body = self.comps[loop.attr("body")]
    root = body.instrs[body.root]
    self._carried_dims = {d for i, (_, d) in enumerate(root.shapes) if not self._invariant(body, i)}
    cost = self._walk(Frame(body, loop, frame, "body", outer=True))
    cost.branch_policy = self.branch
    return cost

  # ---- trip counts and invariance ------------------------------------------------------------------
  def _invariant(self, body: Computation, i: int) -> bool:
    """Tuple element i of the body's carry is passed through unchanged."""
    root = body.instrs[body.root]
    if root.opcode != "tuple" or i >= len(root.operands):
      return False
    src = body.instrs.get(root.operands[i])
    if src is None or src.opcode != "get-tuple-element" or int(src.attr("index")) != i:
      return False
    return body.instrs[src.operands[0]].opcode == "parameter"

  def trip_count(self, frame: Frame, loop: Instr) -> Optional[int]:
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attrs)
    if m:
      return int(m.group(1))
    cond = self.comps.get(loop.attr("condition"))
    if cond is None:
      return None
    root = cond.instrs[cond.root]
    if root.opcode != "compare" or len(root.operands) != 2:
      return None
    direction = re.search(r"direction=(\w+)", root.attrs)
    a, b = (cond.instrs[o] for o in root.operands)
    if direction is None:
      return None
    direction = direction.group(1)
    if b.opcode == "get-tuple-element" and a.opcode == "constant":  # limit > i  ==  i < limit
      a, b = b, a
      direction = {"GT": "LT", "GE": "LE"}.get(direction, "")
    if a.opcode == "get-tuple-element" and b.opcode == "constant":
      idx, limit = int(a.attr("index")), _const_value(b)
    else:
      return None
    init = self._tuple_operand(frame, loop.operands[0], idx)
    start = _const_value(init) if init is not None and init.opcode == "constant" else None
    if limit is None or start is None or direction not in ("LT", "LE"):
      return None
    return max(int(limit - start + (1 if direction == "LE" else 0)), 0)

  def _tuple_operand(self, frame: Frame, name: str, idx: int) -> Optional[Instr]:
    ins = frame.comp.instrs.get(name)
    if ins is not None and ins.opcode == "tuple" and idx < len(ins.operands):
      return frame.comp.instrs.get(ins.operands[idx])
    return None

  # ---- origins -------------------------------------------------------------------------------------
  def origin(self, frame: Frame, name: str, idx: Tuple[int, ...] = ()) -> Origin:
    """Traces a value back through views, slices, in-place updates, tuples and call boundaries."""
    kv = False
    ins = None
    for _ in range(10000):
      if name not in frame.comp.instrs:
        return Origin("kv" if kv else "computed", 4)
      ins = frame.comp.instrs[name]
      leaf_dims = (
          ins.shapes[idx[0]][1]
          if (idx and ins.is_tuple and idx[0] < len(ins.shapes))
          else (ins.dims if not ins.is_tuple else None)
      )
      if leaf_dims is not None and tuple(leaf_dims) in self.kv_dims:
        kv = True
      op = ins.opcode
      if op == "get-tuple-element":
        name, idx = ins.operands[0], (int(ins.attr("index")),) + idx
      elif op == "tuple" and idx:
        name, idx = ins.operands[idx[0]], idx[1:]
      elif op in VIEW_OPS or op in MOVE_OPS or op in SLICE_OPS or op in INPLACE_OPS:
        name = ins.operands[0]
      elif op == "while":
        name = ins.operands[0]
      elif op == "fusion" and self.fusion_kind(ins)[0] in ("view", "copy", "gather"):
        name = ins.operands[self.fusion_kind(ins)[1]]
      elif op == "fusion" and not ins.is_tuple and len(_inplace_roots(self.comps[ins.attr("calls")])) == 1:
        name = ins.operands[next(iter(_inplace_roots(self.comps[ins.attr("calls")])))]  # updated in place
      elif op == "parameter":
        num = int(ins.raw_operands.strip())
        if frame.kind in ("fusion", "call", "branch"):
          if frame.caller is None or frame.parent is None:
            break
          operand = num if frame.kind != "branch" else self._branch_operand(frame)
          name, frame = frame.caller.operands[operand], frame.parent
        elif frame.kind == "body":
          if frame.outer and idx:
            invariant = self._invariant(frame.comp, idx[0])
            size = self._storage_itemsize(frame.parent, frame.caller.operands[0], idx)
            return Origin("kv" if kv else ("weights" if invariant else "state"), size)
          name, frame = frame.caller.operands[0], frame.parent
        else:  # entry parameter
          break
      else:
        break
    dt = ins.shapes[idx[0]][0] if (idx and idx[0] < len(ins.shapes)) else (ins.shapes[0][0] if ins.shapes else "f32")
    return Origin("kv" if kv else "computed", DTYPE_BYTES.get(dt, 4))

  def _branch_operand(self, frame: Frame) -> int:
    comp_names = frame.caller.attr_list("branch_computations") or [
        frame.caller.attr("true_computation"),
        frame.caller.attr("false_computation"),
    ]
    return 1 + comp_names.index(frame.comp.name)

  def _storage_itemsize(self, frame: Frame, name: str, idx: Tuple[int, ...]) -> float:
    """Bytes per element of the buffer a value outside the loop comes from (through converts)."""
    return self.origin(frame, name, idx).itemsize

  def fusion_kind(self, fusion: Instr) -> Tuple[str, Optional[int]]:
    """('view', p): the output is a view / dtype conversion / contiguous slice of parameter p (free on a
    device); ('copy', p): a layout copy (transpose, copy) of p or of a slice of it; ('gather', p): a
    gather or non-contiguous slice of p; ('compute', None): anything else."""
    name = fusion.attr("calls")
    if name not in self._kind_cache:
      self._kind_cache[name] = _fusion_kind(self.comps[name])
    return self._kind_cache[name]

  # ---- walking -------------------------------------------------------------------------------------
  def _walk(self, frame: Frame) -> StepCost:
    cost = StepCost()
    for ins in frame.comp.instrs.values():
      op = ins.opcode
      if op in FREE_OPS:
        continue
      if op == "while":
        trips = self.trip_count(frame, ins)
        if trips is None:
          trips = 1
          cost.unknown_trip_counts += 1
        cost.add(self._walk(Frame(self.comps[ins.attr("body")], ins, frame, "body")), trips)
        cost.add(self._walk(Frame(self.comps[ins.attr("condition")], ins, frame, "body")), trips + 1)
        continue
      if op == "call":
        cost.add(self._walk(Frame(self.comps[ins.attr("to_apply")], ins, frame, "call")))
        continue
      if op == "conditional":
        cost.add(self._conditional(frame, ins))
        continue
      cost.ops += 1
      self._kernel(frame, ins, cost)
    return cost

  def _conditional(self, frame: Frame, ins: Instr) -> StepCost:
    names = ins.attr_list("branch_computations") or [ins.attr("true_computation"), ins.attr("false_computation")]
    branches = [self._walk(Frame(self.comps[n], ins, frame, "branch")) for n in names if n]
    out = StepCost(ops=1, conditionals=1)
    if self.branch == "max":
      out.add(max(branches, key=lambda c: (c.total_bytes, c.flops)))
    else:
      for b in branches:
        out.add(b, 1.0 / len(branches))
    return out

  def _read(self, cost: StepCost, origin: Origin, elements: float, dot: bool, who: str):
    """Counts a read of `elements` from a buffer of `origin` (dot operands always; else loop inputs only)."""
    nbytes = elements * origin.itemsize
    if origin.kind in ("weights", "kv"):
      cost.charge(origin.kind, nbytes, who)
    elif dot or origin.kind == "state":
      cost.charge("other", nbytes, who)

  def _kernel(self, frame: Frame, ins: Instr, cost: StepCost):
    """Adds one top-level kernel's flops and bytes."""
    op = ins.opcode
    if op == "fusion":
      self._fusion(frame, ins, cost)
      return
    if op in ("dot", "convolution"):
      cost.flops += _dot_flops(ins, frame.comp)
      for o in ins.operands:
        self._read(cost, self.origin(frame, o), frame.comp.instrs[o].elements(), True, ins.name)
      cost.charge("other", ins.nbytes(), ins.name)
      return
    if op in ("copy", "transpose"):
      self._copy(frame, ins, ins.operands[0], ins.elements(), cost)
      return
    if op == "convert":
      cost.convert_bytes += ins.nbytes()
      return
    if op in SLICE_OPS:
      src = self.origin(frame, ins.operands[0])
      if op != "gather" and _contiguous(frame.comp.instrs[ins.operands[0]].dims, ins.dims):
        return  # a view: its consumer reads it
      category = src.kind if src.kind in ("weights", "kv") else "other"
      cost.charge(category, 2 * ins.elements() * src.itemsize, ins.name)
      return
    if op in INPLACE_OPS:
      src = self.origin(frame, ins.operands[0])
      upd = frame.comp.instrs[ins.operands[1 if op == "dynamic-update-slice" else 2]]
      cost.charge("kv" if src.kind == "kv" else "other", upd.elements() * src.itemsize, ins.name)
      return
    for o in ins.operands:  # any other op: reads of loop inputs, writes of its output
      self._read(cost, self.origin(frame, o), frame.comp.instrs[o].elements(), False, ins.name)
    cost.charge("other", ins.nbytes(), ins.name)

  def _copy(self, frame: Frame, ins: Instr, operand: str, elements: int, cost: StepCost):
    src = self.origin(frame, operand)
    nbytes = elements * src.itemsize
    cost.charge("copies", 2 * nbytes, ins.name)
    if nbytes >= self.slot_bytes:
      carried = tuple(frame.comp.instrs[operand].dims) in self._carried_dims and src.kind in ("kv", "state")
      cost.large_copies.append(CopyRecord(ins.name, nbytes, 1.0, carried))

  def _fusion(self, frame: Frame, ins: Instr, cost: StepCost):
    comp = self.comps[ins.attr("calls")]
    ops = {i.opcode for i in comp.instrs.values()}
    kind, src = self.fusion_kind(ins)
    if kind == "view":  # a view or a dtype conversion: free on a device
      if "convert" in ops:
        cost.convert_bytes += ins.nbytes()
      return
    if kind == "copy":
      self._copy(frame, ins, ins.operands[src], ins.elements(), cost)
      return
    if kind == "gather":  # a materialised selection: read and write what it selects
      origin = self.origin(frame, ins.operands[src])
      category = origin.kind if origin.kind in ("weights", "kv") else "other"
      cost.charge(category, 2 * ins.elements() * origin.itemsize, ins.name)
      return
    has_dot = bool(ops & {"dot", "convolution"})
    cost.flops += sum(_dot_flops(i, comp) for i in comp.instrs.values() if i.opcode in ("dot", "convolution"))
    inplace = _inplace_roots(comp)  # param numbers updated in place, with update elements
    for num, pname in comp.params.items():
      operand = ins.operands[num]
      src = self.origin(frame, operand)
      if num in inplace:
        continue
      sliced = _sliced_elements(comp, pname)
      if sliced is not None:
        kind = "kv" if src.kind == "kv" else ("weights" if src.kind == "weights" else "other")
        cost.charge(kind, sliced[0] * src.itemsize * (1 if sliced[1] else 2), ins.name)
        continue
      self._read(cost, src, frame.comp.instrs[operand].elements(), has_dot, ins.name)
    # Writes: in-place roots write their updates (at the target's storage dtype), other outputs in full.
    written = 0.0
    for num, elements in inplace.items():
      src = self.origin(frame, ins.operands[num])
      cost.charge("kv" if src.kind == "kv" else "other", elements * src.itemsize, ins.name)
    root = comp.instrs[comp.root]
    leaves = root.operands if root.opcode == "tuple" else [comp.root]
    for leaf in leaves:
      if _through_views(comp, leaf).opcode in INPLACE_OPS:
        continue
      written += comp.instrs[leaf].nbytes()
    cost.charge("other", written, ins.name)


def _const_value(ins: Instr) -> Optional[int]:
  try:
    return int(float(ins.raw_operands.strip()))
  except ValueError:
    return None


def _contiguous(src_dims: Tuple[int, ...], out_dims: Tuple[int, ...]) -> bool:
  """A slice of out_dims from src_dims (row-major) is one contiguous block."""
  if len(src_dims) != len(out_dims):
    return False
  partial = False
  for s, o in zip(src_dims, out_dims):
    if partial and o != s:
      return False
    if o != 1 and o != s:
      if partial:
        return False
      partial = True
    elif o == s and o != 1:
      partial = True
  return True


def _dot_flops(ins: Instr, comp: Computation) -> float:
  """2 * prod(result dims) * prod(contracting dims of the lhs)."""
  lhs = comp.instrs[ins.operands[0]].dims
  k = 1
  for d in ins.attr_list("lhs_contracting_dims"):
    k *= lhs[int(d)]
  return 2.0 * float(np.prod(ins.dims)) * k


def _data_ops(comp: Computation) -> Tuple[set, set]:
  """(opcodes, parameter numbers) on the data path to the root: slice/update indices are not followed."""
  ops, params, seen, stack = set(), set(), set(), [comp.root]
  while stack:
    name = stack.pop()
    if name in seen:
      continue
    seen.add(name)
    ins = comp.instrs[name]
    ops.add(ins.opcode)
    if ins.opcode == "parameter":
      params.add(int(ins.raw_operands.strip()))
    elif ins.opcode in ("dynamic-slice", "slice", "gather"):
      stack.append(ins.operands[0])
    elif ins.opcode == "dynamic-update-slice":
      stack += ins.operands[:2]
    elif ins.opcode == "scatter":
      stack += [ins.operands[0], ins.operands[2]]
    else:
      stack += ins.operands
  return ops, params


def _fusion_kind(comp: Computation) -> Tuple[str, Optional[int]]:
  """See `HloCostModel.fusion_kind`."""
  ops, params = _data_ops(comp)
  if len(params) != 1:
    return "compute", None
  (p,) = params
  name = comp.root
  while True:  # a chain of views and contiguous slices from the root down to the parameter
    ins = comp.instrs[name]
    if ins.opcode == "parameter":
      return "view", p
    if ins.opcode in VIEW_OPS or (
        ins.opcode in ("dynamic-slice", "slice") and _contiguous(comp.instrs[ins.operands[0]].dims, ins.dims)
    ):
      name = ins.operands[0]
    else:
      break
  if ops <= (VIEW_OPS | MOVE_OPS | SLICE_OPS | {"parameter", "constant", "broadcast"}):
    if ops & MOVE_OPS:
      return "copy", p
    if ops & SLICE_OPS:
      return "gather", p
  return "compute", None


def _users(comp: Computation, name: str) -> List[Instr]:
  return [i for i in comp.instrs.values() if name in i.operands]


def _only_index_use(comp: Computation, pname: str) -> bool:
  """The parameter is scalar-ish and feeds only index operands (slice starts, gather indices)."""
  p = comp.instrs[pname]
  return p.elements() <= 16 and all(u.opcode != "dot" for u in _users(comp, pname))


def _sliced_elements(comp: Computation, pname: str) -> Optional[Tuple[int, bool]]:
  """If a fused parameter is only consumed as the sliced operand of slicing ops (through views), returns
  (elements selected, all contiguous); else None."""
  total, contiguous, frontier = 0, True, [pname]
  while frontier:
    name = frontier.pop()
    for u in _users(comp, name):
      if u.opcode in VIEW_OPS:
        frontier.append(u.name)
      elif u.opcode in SLICE_OPS and u.operands[0] == name:
        total += u.elements()
        if u.opcode == "gather" or not _contiguous(comp.instrs[name].dims, u.dims):
          contiguous = False
      else:
        return None
  return (total, contiguous) if total else None


def _through_views(comp: Computation, name: str) -> Instr:
  ins = comp.instrs[name]
  while ins.opcode in VIEW_OPS:
    ins = comp.instrs[ins.operands[0]]
  return ins


def _inplace_roots(comp: Computation) -> Dict[int, int]:
  """{parameter number: update elements} for dynamic-update-slice / scatter roots updating a parameter."""
  root = comp.instrs[comp.root]
  leaves = root.operands if root.opcode == "tuple" else [comp.root]
  out = {}
  for leaf in leaves:
    ins = _through_views(comp, leaf)
    if ins.opcode not in INPLACE_OPS:
      continue
    target = _through_views(comp, ins.operands[0])
    if target.opcode == "parameter":
      upd = comp.instrs[ins.operands[1 if ins.opcode == "dynamic-update-slice" else 2]]
      num = int(target.raw_operands.strip())
      out[num] = out.get(num, 0) + upd.elements()
  return out


def analyze_hlo(
    text: str, kv_dims: Iterable[Tuple[int, ...]] = (), slot_bytes: float = float("inf"), branch: str = "max"
) -> StepCost:
  """Cost of one iteration of the outermost while loop in an optimised HLO module text."""
  return HloCostModel(text, kv_dims, slot_bytes, branch).analyze()


# ---------------------------------------------------------------------------------------------------
# Compiling a decoder's loop from abstract shapes
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class CompiledLoop:
  """A decoder's compiled decode loop and what the cost model needs to read it."""

  method: str
  hlo: str
  kv_dims: List[Tuple[int, ...]]  # dims of the loop-carried KV buffers (cache, speculative store)
  slot_bytes: float  # one cache slot: B x KV x T x D at the cache dtype
  total_len: int
  compile_seconds: float


def _kv_leaf_dims(state) -> List[Tuple[int, ...]]:
  """Dims of the state's leaves under a 'cache' / 'spec' / 'kv' key (rank >= 3): the KV buffers."""
  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    key = jax.tree_util.keystr(path).lower()
    if leaf.ndim >= 3 and any(k in key for k in ("cache", "spec", "kv")):
      out.append(tuple(leaf.shape))
  return out


def compile_decode_loop(
    cfg: ModelConfig,
    method: str,
    *,
    batch: int = 1,
    prompt_len: int = 16,
    greedy: bool = True,
    random_init: bool = False,
    **method_kw,
) -> CompiledLoop:
  """Compiles `method`'s jitted decode loop for cfg from abstract shapes (nothing is allocated).

  The cache holds cfg.max_len positions (+ the decoder's extra positions), as `run_decoder` would allocate
  for a request filling the context. method_kw are the decoder's own arguments (d1, gamma, d2, ...).
  """
  if method not in MAKE_DECODER:
    raise ValueError(f"unknown method {method!r}; expected one of {sorted(MAKE_DECODER)}")
  dec = MAKE_DECODER[method](cfg, greedy=greedy, random_init=random_init, **method_kw)
  params = M.abstract_params(cfg)
  sp = jax.eval_shape(lambda: common.make_sampling_params(batch, 1, 0.0 if greedy else 1.0, 0, 1.0, 0, None))
  prompt = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32)
  lengths = jax.ShapeDtypeStruct((batch,), jnp.int32)
  total = cfg.max_len + dec.extra_positions
  cache, tokens = jax.eval_shape(
      functools.partial(
          common.prefill_state,
          cfg=cfg,
          readout_depths=dec.readout_depths,
          total_len=total,
          random_init=random_init,
          cache_group=dec.cache_group,
      ),
      params,
      prompt,
      lengths,
      sp,
  )
  state = jax.eval_shape(functools.partial(dec.init, **dec.init_kw), cache, tokens, lengths, sp)
  t0 = time.perf_counter()
  hlo = dec.loop.lower(params, state, sp, **dec.loop_kw).compile().as_text()
  seconds = time.perf_counter() - t0
  slot = batch * cfg.num_kv_heads * total * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize
  return CompiledLoop(method, hlo, _kv_leaf_dims(state), float(slot), total, seconds)


def loop_cost(compiled: CompiledLoop, branch: str = "max") -> StepCost:
  return analyze_hlo(compiled.hlo, compiled.kv_dims, compiled.slot_bytes, branch)


# ---------------------------------------------------------------------------------------------------
# Model sizes computed from the config (independent of the HLO)
# ---------------------------------------------------------------------------------------------------
def param_bytes(cfg: ModelConfig) -> Dict[str, float]:
  """Bytes of each parameter group at cfg.dtype: embed, prelude, adapter, core, coda, head, other."""
  item = jnp.dtype(cfg.dtype).itemsize
  out = {}
  for key, leaf in M.param_shapes(cfg).items():
    leaves = jax.tree_util.tree_leaves(leaf, is_leaf=lambda x: isinstance(x, tuple))
    out[key] = float(sum(np.prod(s) for s in leaves) * item)
  return out


def ar_token_bytes(cfg: ModelConfig, context: int, batch: int = 1) -> Dict[str, float]:
  """Ideal bytes of one AR token: every weight read once per use (core R times; tied head read as the
  embedding) and every committed KV slot read once (K and V of each (step, layer) slot over `context`)."""
  pb = param_bytes(cfg)
  r = cfg.recurrence
  weights = pb["core"] * r + pb.get("prelude", 0.0) + pb.get("coda", 0.0) + pb.get("adapter", 0.0) * r
  weights += pb.get("lm_head", pb["embed"]) + pb.get("final_norm", 0.0)
  slots = cfg.n_prelude + r * cfg.n_core + cfg.n_coda
  slot = batch * cfg.num_kv_heads * context * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize
  return {"weights": weights, "kv": 2.0 * slots * slot}


# ---------------------------------------------------------------------------------------------------
# Roofline projection
# ---------------------------------------------------------------------------------------------------
def step_seconds(cost: StepCost, peak_flops: float, bandwidth: float, op_overhead: float = 0.0) -> float:
  """Roofline time of one iteration: max(flops / peak, bytes / bandwidth) + ops * per-op overhead."""
  return max(cost.flops / peak_flops, cost.total_bytes / bandwidth) + cost.ops * op_overhead


def loopspec_tokens_per_tick(r: int, d1: int, gamma: float) -> float:
  """A tick advances every lane d1 steps; at mean accepted length gamma (tokens per R steps) that commits
  gamma * d1 / R tokens."""
  return gamma * d1 / r


def chain_tokens_per_round(r: int, d1: int, draft_len: int, gamma: float) -> float:
  """Expected tokens per chain round, with the per-draft acceptance implied by LoopSpec's single-proposal
  identity gamma = R / (d1 + (R - d1) P(reject)) at the same draft depth d1 (capped to [0, 1])."""
  p_reject = min(max((r / gamma - d1) / (r - d1), 0.0), 1.0)
  return float(theory.chain_expected_tokens(1.0 - p_reject, draft_len))


def tokens_per_iteration(method: str, cfg: ModelConfig, accepted_length: float, kw: dict) -> float:
  """Tokens one loop iteration commits at mean accepted length `accepted_length` (tokens per R steps)."""
  if method == "ar":
    return 1.0
  if method == "chain":
    return chain_tokens_per_round(cfg.recurrence, kw["d1"], kw["gamma"], accepted_length)
  if method == "loopspec":
    return loopspec_tokens_per_tick(cfg.recurrence, kw["d1"], accepted_length)
  raise ValueError(f"unknown method {method!r}")


def project(
    cost: StepCost, tokens_per_iter: float, accelerators: Dict[str, dict], op_overhead: float = 0.0, batch: int = 1
) -> Dict[str, float]:
  """Projected tokens/s (all requests of the batch) on each named accelerator."""
  return {
      name: batch * tokens_per_iter / step_seconds(cost, a["peak_flops"], a["hbm_bandwidth"], op_overhead)
      for name, a in accelerators.items()
  }


def live_lanes(r: int, d1: int) -> int:
  """Lanes a LoopSpec tick must advance at full acceptance: the R/d1 pipeline plus the fresh lane."""
  return r // d1 + 1


def lane_kv_bytes(cfg: ModelConfig, d1: int, context: int, batch: int = 1) -> float:
  """Committed-prefix KV one lane reads in one tick: K and V of d1 x n_core (step, layer) slots."""
  slot = batch * cfg.num_kv_heads * context * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize
  return 2.0 * d1 * cfg.n_core * slot


def to_json(obj) -> str:
  return json.dumps(obj, indent=2, default=float)
