"""Device-independent cost of one decode-loop iteration, read from XLA's optimised HLO (parsed by `hlo.py`).

One iteration of a decoder's outer `lax.while_loop` is one AR token, one chain round or one LoopSpec tick.
`compile_decode_loop` compiles the decoder's real jitted loop from abstract shapes (no weights are
allocated), `analyze_hlo` finds the outermost while loop of the optimised HLO and sums over its body:

  ops     every instruction that is not free (parameter, constant, tuple, get-tuple-element, bitcast);
          a fusion is one op. Inner while bodies count times their trip count.
  flops   2 * prod(result dims) * prod(contracting dims) per dot (batch dims included), fused or not; a
          convolution by its dim_labels, a reduce(add) of a multiply (how the TPU compiler writes a matvec)
          as 2 x the multiply's elements.
  bytes   split into weights / kv / copies / other:
          - dots read every operand and write their result;
          - gathers and non-contiguous slices (alone or fused with views) read and write what they
            select; a contiguous slice (one block of the buffer) is a view whose consumer reads it;
          - in-place writes (dynamic-update-slice, scatter) count only the UPDATE bytes;
          - copies (copy ops and copy/transpose-only fusions, e.g. of a gathered slot) read and write the
            whole operand; an async copy-start (the TPU's move between HBM and on-chip memory) reads its
            operand once, and what reads its copy-done reads nothing more from HBM;
          - other kernels write their output and read the loop inputs they touch (weights, KV, state);
          - buffers in an on-chip memory space (a TPU layout's S(n)) are not HBM traffic: their reads and
            writes are free, the copy-start / slice-start that filled them counted the HBM read.
          Bytes are counted at the STORAGE dtype of the buffer a value comes from (looking through
          converts): the CPU backend computes bf16 in f32 and keeps f32 shadows of bf16 buffers, which an
          accelerator would not; pure dtype conversions are reported separately (`convert_bytes`) and are
          not in the total. XLA's own cost_analysis()["bytes accessed"] is not used: it counts a while
          body once, on-chip accesses as accesses, and (CPU) every in-place update as a whole buffer.
          weights = reads of loop-invariant loop inputs; kv = reads/writes of buffers with a KV-cache shape
          (the committed cache, the speculative store) or slices/gathers of them.
  transcendentals  elements computed by transcendental ops (exp, log, tanh, logistic, rsqrt, sqrt, power,
          sin, cos, erf, divide), fused or not, per kernel: a CPU's vector units run these far below its
          stream bandwidth (a softmax or SiLU over M rows), an accelerator's special-function units do not.
Copies whose operand is at least one cache slot (B x KV x T x D) are listed; "loop-carried" ones copy a
whole loop-carried buffer (the defect of issue 9). Conditionals count their most expensive branch (by
bytes) unless `branch="mean"` (every branch alike) or `branch` is a tuple of weights: then a conditional
with that many branches counts sum_i w_i x branch i (a measured branch mix, e.g. how often each width of a
LoopSpec tick's `lax.switch` ran: `calibrate.branch_mix`), any other still its most expensive one.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from loopspec_jax.analysis.hlo import (
    CATEGORIES,
    DTYPE_BYTES,
    FREE_OPS,
    INPLACE_OPS,
    MOVE_OPS,
    SLICE_OPS,
    VIEW_OPS,
    Computation,
    Instr,
    const_value,
    contiguous,
    dot_flops,
    dot_rows,
    dot_signature,
    fusion_kind,
    inplace_roots,
    nested,
    parse_hlo,
    product_of_reduce,
    sliced_elements,
    through_views,
)

TRANSCENDENTAL_OPS = frozenset(
    {
        "exponential",
        "exponential-minus-one",
        "log",
        "log-plus-one",
        "logistic",
        "tanh",
        "rsqrt",
        "sqrt",
        "cbrt",
        "power",
        "sine",
        "cosine",
        "tan",
        "atan2",
        "erf",
        "divide",
    }
)


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
  branch_policy: object = "max"  # "max" / "mean" / a tuple of branch weights (`HloCostModel`)
  items: Dict[Tuple[str, str], float] = dataclasses.field(default_factory=dict)  # (instr, category) -> bytes
  # (instr, rows) -> flops: each product's flops by kernel and by its skinny extent (`hlo.dot_rows`)
  flop_items: Dict[Tuple[str, int], float] = dataclasses.field(default_factory=dict)
  # (instr, `dot_signature`) -> executions per iteration; per signature (flops of one execution, rows)
  dot_items: Dict[Tuple[str, str], float] = dataclasses.field(default_factory=dict)
  dot_shapes: Dict[str, Tuple[float, int]] = dataclasses.field(default_factory=dict)
  transcendentals: float = 0.0  # elements of transcendental ops per iteration (`TRANSCENDENTAL_OPS`)
  trans_items: Dict[str, float] = dataclasses.field(default_factory=dict)  # kernel -> transcendental elements

  def charge_transcendentals(self, elements: float, who: str):
    if elements:
      self.transcendentals += elements
      self.trans_items[who] = self.trans_items.get(who, 0.0) + elements

  def charge(self, category: str, nbytes: float, who: str):
    self.bytes[category] += nbytes
    self.items[(who, category)] = self.items.get((who, category), 0.0) + nbytes

  def charge_flops(self, ins: Instr, comp: Computation, who: str):
    """Adds the flops of product `ins` (of computation comp) to kernel `who`, keyed by its rows."""
    flops = dot_flops(ins, comp)
    self.flops += flops
    rows = dot_rows(ins, comp)
    key = (who, rows)
    self.flop_items[key] = self.flop_items.get(key, 0.0) + flops
    sig = dot_signature(ins, comp)
    self.dot_items[(who, sig)] = self.dot_items.get((who, sig), 0.0) + 1.0
    self.dot_shapes[sig] = (flops, rows)

  def kernels(self) -> Dict[str, dict]:
    """Per kernel (top-level instruction, executions folded in): bytes, bytes by category, {rows: flops} and
    {dot signature: executions}."""
    out: Dict[str, dict] = {}
    new = lambda: {"bytes": 0.0, "by_category": {}, "flops": {}, "dots": {}, "transcendentals": 0.0}
    for (who, sig), n in self.dot_items.items():
      out.setdefault(who, new())["dots"][sig] = n
    for (who, cat), b in self.items.items():
      k = out.setdefault(who, new())
      k["bytes"] += b
      k["by_category"][cat] = k["by_category"].get(cat, 0.0) + b
    for (who, rows), f in self.flop_items.items():
      k = out.setdefault(who, new())
      k["flops"][rows] = k["flops"].get(rows, 0.0) + f
    for who, n in self.trans_items.items():
      out.setdefault(who, new())["transcendentals"] += n
    return out

  @property
  def flops_by_rows(self) -> Dict[int, float]:
    out: Dict[int, float] = {}
    for (_, rows), f in self.flop_items.items():
      out[rows] = out.get(rows, 0.0) + f
    return dict(sorted(out.items()))

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
    for key, f in other.flop_items.items():
      self.flop_items[key] = self.flop_items.get(key, 0.0) + mult * f
    for key, n in other.dot_items.items():
      self.dot_items[key] = self.dot_items.get(key, 0.0) + mult * n
    self.dot_shapes.update(other.dot_shapes)
    self.transcendentals += mult * other.transcendentals
    for key, n in other.trans_items.items():
      self.trans_items[key] = self.trans_items.get(key, 0.0) + mult * n
    self.unknown_trip_counts += other.unknown_trip_counts
    self.conditionals += other.conditionals

  def as_dict(self) -> dict:
    return {
        "ops": self.ops,
        "flops": self.flops,
        "flops_by_rows": {str(k): v for k, v in self.flops_by_rows.items()},
        "transcendentals": self.transcendentals,
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
      self, text: str, kv_dims: Iterable[Tuple[int, ...]] = (), slot_bytes: float = float("inf"), branch="max"
  ):
    if isinstance(branch, (tuple, list)):
      branch = tuple(float(w) for w in branch)
      if not branch or min(branch) < 0 or abs(sum(branch) - 1.0) > 1e-6:
        raise ValueError(f"branch weights must be >= 0 and sum to 1, got {branch}")
    elif branch not in ("max", "mean"):
      raise ValueError(f"branch must be 'max', 'mean' or a tuple of weights, got {branch!r}")
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
    """Tuple element i of the body's carry is passed through unchanged (also through an inner while loop
    that carries it unchanged: the TPU compiler threads loop-invariant weights through inner loops)."""
    root = body.instrs[body.root]
    if root.opcode != "tuple" or i >= len(root.operands):
      return False
    return self._from_param(body, root.operands[i], i)

  def _from_param(self, comp: Computation, name: str, i: int, depth: int = 0) -> bool:
    """Value `name` of comp is element i of comp's parameter tuple, unchanged."""
    src = comp.instrs.get(name)
    if src is None or src.opcode != "get-tuple-element" or depth > 8:
      return False
    holder, j = comp.instrs.get(src.operands[0]), int(src.attr("index"))
    if holder is not None and holder.opcode == "parameter":
      return j == i
    if holder is None or holder.opcode != "while" or not self._invariant(self.comps[holder.attr("body")], j):
      return False
    init = comp.instrs.get(holder.operands[0])
    return init is not None and init.opcode == "tuple" and self._from_param(comp, init.operands[j], i, depth + 1)

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
      idx, limit = int(a.attr("index")), const_value(b)
    else:
      return None
    init = self._tuple_operand(frame, loop.operands[0], idx)
    while init is not None and init.opcode in ("copy", "bitcast", "convert") and init.operands:
      init = frame.comp.instrs.get(init.operands[0])  # the TPU compiler copies the start constant
    start = const_value(init) if init is not None and init.opcode == "constant" else None
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
      elif op == "fusion" and not ins.is_tuple and len(inplace_roots(self.comps[ins.attr("calls")])) == 1:
        name = ins.operands[next(iter(inplace_roots(self.comps[ins.attr("calls")])))]  # updated in place
      elif op == "copy-done":  # read from where copy-start put it (it counted the transfer)
        return Origin("moved", DTYPE_BYTES.get(ins.shapes[0][0], 4) if ins.shapes else 4)
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
      self._kind_cache[name] = fusion_kind(self.comps[name])
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
    if isinstance(self.branch, tuple) and len(self.branch) == len(branches):
      for w, b in zip(self.branch, branches):
        out.add(b, w)
    elif self.branch == "mean":
      for b in branches:
        out.add(b, 1.0 / len(branches))
    else:
      out.add(max(branches, key=lambda c: (c.total_bytes, c.flops)))
    return out

  def _read(self, cost: StepCost, origin: Origin, elements: float, dot: bool, who: str):
    """Counts a read of `elements` from a buffer of `origin` (dot operands always; else loop inputs only)."""
    nbytes = elements * origin.itemsize
    if origin.kind in ("weights", "kv"):
      cost.charge(origin.kind, nbytes, who)
    elif origin.kind == "moved":  # on-chip: its copy-start counted the HBM transfer
      return
    elif dot or origin.kind == "state":
      cost.charge("other", nbytes, who)

  def _kernel(self, frame: Frame, ins: Instr, cost: StepCost):
    """Adds one top-level kernel's flops and bytes."""
    op = ins.opcode
    if op == "fusion":
      self._fusion(frame, ins, cost)
      return
    if op in TRANSCENDENTAL_OPS:
      cost.charge_transcendentals(float(ins.elements()), ins.name)
    if op in ("dot", "convolution") or product_of_reduce(ins, frame.comp) is not None:
      cost.charge_flops(ins, frame.comp, ins.name)
      for o in self._hbm_operands(frame, ins):
        self._read(cost, self.origin(frame, o), frame.comp.instrs[o].elements(), True, ins.name)
      cost.charge("other", ins.hbm_bytes(), ins.name)
      return
    if op in ("copy", "transpose"):
      self._copy(frame, ins, ins.operands[0], ins.elements(), cost)
      return
    if op == "copy-start":  # an async move between memory spaces (TPU: HBM <-> on-chip): its operand once
      name = ins.operands[0]
      while frame.comp.instrs[name].opcode in ("copy-done", "copy-start"):  # a chain of moves: its buffer
        name = frame.comp.instrs[name].operands[0]
      src = self.origin(frame, name)
      nbytes = frame.comp.instrs[ins.operands[0]].elements() * src.itemsize
      cost.charge(src.kind if src.kind in ("weights", "kv") else "other", nbytes, ins.name)
      return
    if op in ("slice-start", "dynamic-slice-start"):  # an async slice into on-chip memory: reads what it selects
      src, leaf = self.origin(frame, ins.operands[0]), ins.shapes[1 if len(ins.shapes) > 1 else 0]
      cost.charge(src.kind if src.kind in ("weights", "kv") else "other", np.prod(leaf[1]) * src.itemsize, ins.name)
      return
    if op in ("copy-done", "slice-done", "dynamic-slice-done"):
      return
    if op == "convert":
      cost.convert_bytes += ins.nbytes()
      return
    if op in SLICE_OPS:
      src = self.origin(frame, ins.operands[0])
      if op != "gather" and contiguous(frame.comp.instrs[ins.operands[0]].dims, ins.dims):
        return  # a view: its consumer reads it
      category = src.kind if src.kind in ("weights", "kv") else "other"
      cost.charge(category, 2 * ins.elements() * src.itemsize, ins.name)
      return
    if op in INPLACE_OPS:
      src = self.origin(frame, ins.operands[0])
      upd = frame.comp.instrs[ins.operands[1 if op == "dynamic-update-slice" else 2]]
      cost.charge("kv" if src.kind == "kv" else "other", upd.elements() * src.itemsize, ins.name)
      return
    for o in self._hbm_operands(frame, ins):  # any other op: reads of loop inputs, writes of its output
      self._read(cost, self.origin(frame, o), frame.comp.instrs[o].elements(), False, ins.name)
    cost.charge("other", ins.hbm_bytes(), ins.name)

  def _hbm_operands(self, frame: Frame, ins: Instr) -> List[str]:
    """ins's operands that live in HBM (not in an on-chip memory space: `Instr.on_chip`)."""
    return [o for o in ins.operands if o in frame.comp.instrs and not frame.comp.instrs[o].on_chip()]

  def _copy(self, frame: Frame, ins: Instr, operand: str, elements: int, cost: StepCost):
    src = self.origin(frame, operand)
    nbytes = elements * src.itemsize
    sides = (not frame.comp.instrs[operand].on_chip()) + (not ins.on_chip())  # HBM reads / writes
    if sides:
      cost.charge("copies", sides * nbytes, ins.name)
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
    has_dot = False
    inner = nested(comp, self.comps)  # the TPU compiler nests fusions (a product's operand slices)
    cost.charge_transcendentals(float(sum(i.elements() for i, _ in inner if i.opcode in TRANSCENDENTAL_OPS)), ins.name)
    for i, c in inner:
      if i.opcode in ("dot", "convolution") or product_of_reduce(i, c) is not None:
        cost.charge_flops(i, c, ins.name)
        has_dot = True
    inplace = inplace_roots(comp)  # param numbers updated in place, with update elements
    for num, pname in comp.params.items():
      operand = ins.operands[num]
      if num in inplace or frame.comp.instrs[operand].on_chip():
        continue
      src = self.origin(frame, operand)
      sliced = sliced_elements(comp, pname, self.comps)
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
    for j, leaf in enumerate(leaves):
      if through_views(comp, leaf).opcode in INPLACE_OPS or ins.on_chip(j):
        continue
      written += comp.instrs[leaf].nbytes()
    cost.charge("other", written, ins.name)


def analyze_hlo(
    text: str, kv_dims: Iterable[Tuple[int, ...]] = (), slot_bytes: float = float("inf"), branch="max"
) -> StepCost:
  """Cost of one iteration of the outermost while loop in an optimised HLO module text."""
  return HloCostModel(text, kv_dims, slot_bytes, branch).analyze()
