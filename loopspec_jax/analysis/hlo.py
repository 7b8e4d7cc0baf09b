"""Parsing of XLA's optimised HLO text into computations and instructions, and the structural queries the
cost model (`analysis/hlo_cost.py`) asks of them: fusion kinds (view / copy / gather / compute), in-place
roots, sliced parameters, contiguous slices, dot flops.

Only what the text of `jax.jit(f).lower(...).compile().as_text()` holds is read: shapes as (dtype, dims)
leaves, opcodes, operand names and the raw attribute text (calls=, body=, index=, ...).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

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
  spaces: Tuple[int, ...] = ()  # per leaf, the memory space of its layout (`S(n)`; 0: HBM)

  def on_chip(self, leaf: int = 0) -> bool:
    """The leaf lives in a memory space other than HBM: a TPU layout's `S(1)` (on-chip vector memory),
    `S(2)` / `S(6)` (scalar memory). Its reads and writes are not HBM traffic."""
    return leaf < len(self.spaces) and self.spaces[leaf] != 0

  def hbm_bytes(self) -> float:
    """Bytes of the leaves in HBM (every leaf when no layout names a memory space)."""
    return float(sum(np.prod(d) * DTYPE_BYTES.get(t, 4) for i, (t, d) in enumerate(self.shapes) if not self.on_chip(i)))

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


_SPACED_LEAF = re.compile(r"[a-z][a-z0-9]*\[[^\]]*\](\{[^}]*\})?")


def parse_spaces(text: str) -> Tuple[int, ...]:
  """Memory space of each leaf of a shape text: 'bf16[8]{0:T(128)S(1)}' -> (1,); no `S(n)`: 0."""
  out = []
  for m in _SPACED_LEAF.finditer(text):
    sp = re.search(r"S\((\d+)\)", m.group(1) or "")
    out.append(int(sp.group(1)) if sp else 0)
  return tuple(out)


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
  shapes = parse_shape(shape_text)
  return Instr(name, shapes, is_tuple, opcode, operands, raw, attrs, parse_spaces(shape_text)), is_root


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


def const_value(ins: Instr) -> Optional[int]:
  try:
    return int(float(ins.raw_operands.strip()))
  except ValueError:
    return None


def contiguous(src_dims: Tuple[int, ...], out_dims: Tuple[int, ...]) -> bool:
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


def _field(fields: dict, key: str, n: int, default: int) -> List[int]:
  vals = [int(x) for x in fields.get(key, "").split("x") if x]
  return vals or [default] * n


def window_taps(ins: Instr, lhs_sizes: List[int], out_sizes: List[int]) -> List[Tuple[float, bool]]:
  """Per window dim of a convolution: (mean real lhs elements one output reads, whether the dim is a batch
  dim in disguise), from the window's size, stride, padding and dilations and the lhs / output spatial sizes.
  Padding and lhs dilation holes are not real elements: the TPU compiler writes a matmul's output dim as
  a reversed window over a one-element, fully padded lhs (1 tap), and a batched product (attention over
  heads and stages) as size s, stride s - 1, lhs_dilate s (1 tap per output: a batch dim). No window: []."""
  m = re.search(r"window=\{([^}]*)\}", ins.attrs)
  if m is None:
    return []
  fields = dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
  size = _field(fields, "size", 0, 1)
  n = len(size)
  stride, ldil, rdil = (_field(fields, k, n, 1) for k in ("stride", "lhs_dilate", "rhs_dilate"))
  pads = [tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")] if "pad" in fields else [(0, 0)] * n
  out = []
  for i in range(n):
    o = np.arange(out_sizes[i] if i < len(out_sizes) else 1)[:, None]
    pos = o * stride[i] + np.arange(size[i])[None, :] * rdil[i] - pads[i][0]  # in the dilated lhs
    length = ((lhs_sizes[i] if i < len(lhs_sizes) else 1) - 1) * ldil[i] + 1
    real = (pos >= 0) & (pos < length) & (pos % ldil[i] == 0)
    out.append((float(real.sum()) / max(o.size, 1), ldil[i] > 1 and ldil[i] == size[i]))
  return out


def conv_contraction(ins: Instr, comp: Computation) -> Tuple[float, int]:
  """(contracted elements per output, lhs rows) of a convolution from its dim_labels ('bf_io->bf', spatial
  dims as digits): the lhs feature size over feature_group_count times the real taps of its window
  (`window_taps`). Rows: the lhs elements per feature less the batch dims written as windows. The TPU
  compiler writes products as convolutions."""
  m = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.attrs)
  lhs = comp.instrs[ins.operands[0]].dims
  if m is None or "f" not in m.group(1):
    return 1, 1
  lab, olab = m.group(1), m.group(3)
  digits = sorted(int(c) for c in lab if c.isdigit())
  groups = int(ins.attr("feature_group_count") or 1)
  feature = lhs[lab.index("f")]
  taps = window_taps(ins, [lhs[lab.index(str(d))] for d in digits], [ins.dims[olab.index(str(d))] for d in digits])
  k, batch = feature / groups, 1
  for d in digits:
    real, is_batch = taps[d] if d < len(taps) else (1.0, False)
    k *= real
    batch *= lhs[lab.index(str(d))] if is_batch else 1
  return max(k, 1.0), max(int(np.prod(lhs)) // max(feature * batch, 1), 1)


def product_of_reduce(ins: Instr, comp: Computation) -> Optional[Instr]:
  """The multiply a reduce(add) sums (through converts / bitcasts), or None: a product written as
  multiply + reduce, which the TPU compiler makes of a dot with a single row (a decode matvec). Only a
  reduce its metadata names as a dot_general counts (not a norm's sum of squares)."""
  if ins.opcode != "reduce" or "dot_general" not in ins.attrs or ins.operands[0] not in comp.instrs:
    return None
  src = comp.instrs[ins.operands[0]]
  while src.opcode in ("convert", "bitcast", "copy") and src.operands and src.operands[0] in comp.instrs:
    src = comp.instrs[src.operands[0]]
  return src if src.opcode == "multiply" else None


def dot_flops(ins: Instr, comp: Computation) -> float:
  """2 * prod(result dims) * prod(contracting dims of the lhs) (a convolution: its `conv_contraction`; a
  reduce of a multiply: 2 * the multiply's elements)."""
  if ins.opcode == "convolution":
    return 2.0 * float(np.prod(ins.dims)) * conv_contraction(ins, comp)[0]
  if ins.opcode == "reduce":
    prod = product_of_reduce(ins, comp)
    return 2.0 * prod.elements() if prod is not None else 0.0
  lhs = comp.instrs[ins.operands[0]].dims
  k = 1
  for d in ins.attr_list("lhs_contracting_dims"):
    k *= lhs[int(d)]
  return 2.0 * float(np.prod(ins.dims)) * k


def dot_rows(ins: Instr, comp: Computation) -> int:
  """The skinny extent of a product: min over lhs / rhs of the elements of their free (neither contracting nor
  batch) dims. A decode matmul [M, K] x [K, N] has rows min(M, N) = M; attention of one query row against T
  keys (batched over heads) has rows 1. Product throughput on every device falls with it (`hardware.py`).
  A convolution: its lhs batch x spatial elements; a reduce of a multiply: 1 (a matvec)."""
  if ins.opcode == "convolution":
    return conv_contraction(ins, comp)[1]
  if ins.opcode == "reduce":
    return 1
  free = []
  for side, operand in (("lhs", ins.operands[0]), ("rhs", ins.operands[1] if len(ins.operands) > 1 else None)):
    if operand is None or operand not in comp.instrs:
      continue
    dims = comp.instrs[operand].dims
    bound = {int(d) for key in ("contracting_dims", "batch_dims") for d in ins.attr_list(f"{side}_{key}")}
    free.append(int(np.prod([d for i, d in enumerate(dims) if i not in bound])))
  return max(min(free), 1) if free else 1


def data_ops(comp: Computation) -> Tuple[set, set]:
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


def fusion_kind(comp: Computation) -> Tuple[str, Optional[int]]:
  """See `HloCostModel.fusion_kind`."""
  ops, params = data_ops(comp)
  if len(params) != 1:
    return "compute", None
  (p,) = params
  name = comp.root
  while True:  # a chain of views and contiguous slices from the root down to the parameter
    ins = comp.instrs[name]
    if ins.opcode == "parameter":
      return "view", p
    if ins.opcode in VIEW_OPS or (
        ins.opcode in ("dynamic-slice", "slice") and contiguous(comp.instrs[ins.operands[0]].dims, ins.dims)
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


def users(comp: Computation, name: str) -> List[Instr]:
  return [i for i in comp.instrs.values() if name in i.operands]


def only_index_use(comp: Computation, pname: str) -> bool:
  """The parameter is scalar-ish and feeds only index operands (slice starts, gather indices)."""
  p = comp.instrs[pname]
  return p.elements() <= 16 and all(u.opcode != "dot" for u in users(comp, pname))


def sliced_elements(comp: Computation, pname: str, comps=None) -> Optional[Tuple[int, bool]]:
  """If a fused parameter is only consumed as the sliced operand of slicing ops (through views, and with
  `comps` the computations by name, through the parameters of nested fusions: the TPU compiler fuses a
  layer's dynamic-slice of a weight stack into the product's fusion), returns (elements selected, all
  contiguous); else None."""
  total, whole, frontier = 0, True, [pname]
  while frontier:
    name = frontier.pop()
    for u in users(comp, name):
      if u.opcode in VIEW_OPS:
        frontier.append(u.name)
      elif u.opcode in SLICE_OPS and u.operands[0] == name:
        total += u.elements()
        if u.opcode == "gather" or not contiguous(comp.instrs[name].dims, u.dims):
          whole = False
      elif u.opcode == "fusion" and comps is not None and u.attr("calls") in comps:
        inner = comps[u.attr("calls")]
        for k, o in enumerate(u.operands):
          got = sliced_elements(inner, inner.params[k], comps) if o == name and k in inner.params else (0, True)
          if got is None:
            return None
          total, whole = total + got[0], whole and got[1]
      else:
        return None
  return (total, whole) if total else None


def nested(comp: Computation, comps) -> List[Tuple[Instr, Computation]]:
  """(instruction, its computation) of a fused computation and of the fusions nested in it."""
  out, stack, seen = [], [comp], set()
  while stack:
    c = stack.pop()
    if c.name in seen:
      continue
    seen.add(c.name)
    for ins in c.instrs.values():
      out.append((ins, c))
      if ins.opcode == "fusion" and ins.attr("calls") in comps:
        stack.append(comps[ins.attr("calls")])
  return out


def through_views(comp: Computation, name: str) -> Instr:
  ins = comp.instrs[name]
  while ins.opcode in VIEW_OPS:
    ins = comp.instrs[ins.operands[0]]
  return ins


def inplace_roots(comp: Computation) -> Dict[int, int]:
  """{parameter number: update elements} for dynamic-update-slice / scatter roots updating a parameter."""
  root = comp.instrs[comp.root]
  leaves = root.operands if root.opcode == "tuple" else [comp.root]
  out = {}
  for leaf in leaves:
    ins = through_views(comp, leaf)
    if ins.opcode not in INPLACE_OPS:
      continue
    target = through_views(comp, ins.operands[0])
    if target.opcode == "parameter":
      upd = comp.instrs[ins.operands[1 if ins.opcode == "dynamic-update-slice" else 2]]
      num = int(target.raw_operands.strip())
      out[num] = out.get(num, 0) + upd.elements()
  return out


def dot_signature(ins: Instr, comp: Computation) -> str:
  """A product's shape as a key: 'f32[1,128]xf32[128,384];lc=1;rc=0;lb=;rb=' (operand dtypes and dims,
  contracting and batch dims), what `calibrate.dot_benchmarks` times on the host."""
  parts = []
  for o in ins.operands[:2]:
    leaf = comp.instrs[o].shapes[0]
    parts.append(f"{leaf[0]}[{','.join(str(d) for d in leaf[1])}]")
  dn = [
      ",".join(ins.attr_list(f"{side}_{key}")) for key in ("contracting_dims", "batch_dims") for side in ("lhs", "rhs")
  ]
  return "x".join(parts) + f";lc={dn[0]};rc={dn[1]};lb={dn[2]};rb={dn[3]}"
