"""The cost of a decoder's loop iteration at real sizes: compile the loop from abstract shapes, read its HLO.

`compile_decode_loop` compiles any registered method's jitted decode loop (`loopspec_jax.methods`) from
`jax.ShapeDtypeStruct`s, `loop_cost` reads one iteration's ops / flops / bytes from its optimised HLO
(`analysis/hlo_cost.py`, parsing in `analysis/hlo.py`), and the functions below give the model's ideal
sizes, the tokens an iteration commits and a roofline projection. Turning a cost into seconds on a given
machine (bandwidth at the working set, product throughput at M rows, per-op overhead) is
`analysis/hardware.py`; measuring those terms on the host is `analysis/calibrate.py`.

The names of `hlo` and `hlo_cost` are re-exported here (`cost.analyze_hlo`, `cost.StepCost`, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax import methods
from loopspec_jax.analysis import theory
from loopspec_jax.analysis.hlo import CATEGORIES, DTYPE_BYTES, FREE_OPS, parse_hlo, parse_instr, parse_shape  # noqa: F401
from loopspec_jax.analysis.hlo_cost import CopyRecord, HloCostModel, StepCost, analyze_hlo  # noqa: F401
from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.models import looped as M


@dataclasses.dataclass
class CompiledLoop:
  """A decoder's compiled decode loop and what the cost model needs to read it."""

  method: str
  hlo: str
  kv_dims: List[Tuple[int, ...]]  # dims of the loop-carried KV buffers (cache, speculative store)
  slot_bytes: float  # one cache slot: B x KV x T x D at the cache dtype
  total_len: int
  compile_seconds: float


def kv_leaf_dims(state) -> List[Tuple[int, ...]]:
  """Dims of the state's leaves under a 'cache' / 'spec' / 'kv' key (rank >= 3): the KV buffers."""
  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    key = jax.tree_util.keystr(path).lower()
    if leaf.ndim >= 3 and any(k in key for k in ("cache", "spec", "kv")):
      out.append(tuple(leaf.shape))
  return out


@dataclasses.dataclass
class AbstractLoop:
  """A decoder's loop arguments as abstract values (`jax.ShapeDtypeStruct`s): what `compile_decode_loop` and
  the compile-only targets (`analysis/aot.py`) lower, with nothing allocated."""

  method: str
  decoder: common.Decoder
  params: dict
  state: object
  sp: common.SamplingParams
  total_len: int  # cache positions: cfg.max_len + the decoder's extra positions


def abstract_loop(
    cfg: ModelConfig,
    method,
    *,
    batch: int = 1,
    prompt_len: int = 16,
    greedy: bool = True,
    random_init: bool = False,
    **method_kw,
) -> AbstractLoop:
  """`method`'s decoder and its loop's abstract arguments for cfg (see `compile_decode_loop`)."""
  m = methods.build(method, **method_kw)
  m.validate(cfg)
  dec = m.make_decoder(cfg, greedy=greedy, random_init=random_init)
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
  return AbstractLoop(m.name, dec, params, state, sp, total)


def compile_decode_loop(cfg: ModelConfig, method, *, batch: int = 1, **kw) -> CompiledLoop:
  """Compiles `method`'s jitted decode loop for cfg from abstract shapes (nothing of the target is allocated).

  `method` is anything `methods.build` takes (a registered name, a spec string 'loopspec:2,8', a `Method`);
  the other keywords are `abstract_loop`'s (prompt_len, greedy, random_init) and the method's arguments
  (d1, gamma, d2, draft_model, ...), so every registered method is costed with no change here. The cache
  holds cfg.max_len positions (+ the decoder's extra positions), as `run_decoder` would allocate for a
  request filling the context. On the default backend; a TPU topology: `analysis/aot.py`.
  """
  a = abstract_loop(cfg, method, batch=batch, **kw)
  t0 = time.perf_counter()
  hlo = a.decoder.loop.lower(a.params, a.state, a.sp, **a.decoder.loop_kw).compile().as_text()
  seconds = time.perf_counter() - t0
  return CompiledLoop(a.method, hlo, kv_leaf_dims(a.state), slot_bytes(cfg, batch, a.total_len), a.total_len, seconds)


def slot_bytes(cfg: ModelConfig, batch: int, total: int) -> float:
  """Bytes of one cache slot (one (step, layer) K or V): batch x KV heads x total positions x head dim."""
  return float(batch * cfg.num_kv_heads * total * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize)


def loop_cost(compiled: CompiledLoop, branch: str = "max") -> StepCost:
  return analyze_hlo(compiled.hlo, compiled.kv_dims, compiled.slot_bytes, branch)


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


def tokens_per_iteration(method: str, cfg: ModelConfig, accepted_length: float, kw: dict, tau=None) -> float:
  """Tokens one loop iteration commits at mean accepted length `accepted_length` (tokens per R steps).

  `tau` (a measured tokens per verify pass) is the answer for any method whose iteration is one verify pass
  (the tree methods: tree, lookahead, ...). Without it a tree self-speculation round is projected at chain's
  tokens per round at its d1 and gamma: a lower bound, since the tree holds chain's greedy drafts."""
  if method == "ar":
    return 1.0
  if tau is not None:
    return float(tau)
  if method == "chain" and (kw.get("branch") or 1) > 1:
    method = "tree"
  if method in ("chain", "tree"):
    d1, gamma = kw.get("d1") or self_spec.DEFAULTS["d1"], kw.get("gamma") or self_spec.DEFAULTS["gamma"]
    return chain_tokens_per_round(cfg.recurrence, d1, gamma, accepted_length)
  if method == "loopspec":
    return loopspec_tokens_per_tick(cfg.recurrence, kw["d1"], accepted_length)
  raise ValueError(f"method {method!r} needs a measured tau (tokens per verify pass) to be projected")


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
