"""The draft cost of a head (Medusa, EAGLE, MTP) beside a depth-d1 readout's (chain / tree self-speculation's
drafter), in bytes and flops at a real size: `loopspec-cost-report --config=cost/default.py:heads`.

Each drafter's draft program is compiled alone from abstract shapes (nothing allocated; the heads'
parameters at the model's dtype, as a deployed head would be stored) and its optimised HLO read by
`analysis/hlo_cost.py`, one draft call per row of the table:
- `readout d1=k`: one token through the prelude, k core steps, the coda and the LM head, attending to a
  KV cache holding `context` positions (`decoding/passes.run_level`, a chain draft / one tree level);
- `medusa`: every head on one final feature (`tree/medusa.build_tree`: the whole round's tree, k heads and
  their vocabulary projections);
- `eagle`: one head level of one row (`heads/eagle.step` + the target's final norm and LM head), attending to
  the head's own KV cache of `context` positions (a round runs gamma + 1 pending rows and then
  (gamma - 1) x branch frontier rows, `tree/eagle.py`);
- `mtp`: one MTP level of one row (`heads/mtp.logits`: a diagonal-attention block and the LM head).
Each program runs inside a while loop whose trip count is an argument (the cost model reads one iteration of
the outermost loop), its input tied to the carry so that nothing is hoisted out of it.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from loopspec_jax.analysis import cost
from loopspec_jax.decoding import common
from loopspec_jax.decoding import passes
from loopspec_jax.decoding.tree import medusa as medusa_decoder
from loopspec_jax.heads import eagle as E
from loopspec_jax.heads import medusa as heads_medusa
from loopspec_jax.heads import mtp as heads_mtp
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_experiments import common as xcommon

GB = 1e9


def _looped(draft, cfg, target_at=None):
  """fn(n, x, *rest): `draft(x', *rest)` n times, x' = x nudged by the carry (never, in fact: a comparison
  against 1e30), the outputs summed into the carry; rest[target_at] (the target's parameters) in their decode
  form, built before the loop as the decoders do (`looped.prepare_params`)."""

  def fn(n, x, *rest):
    if target_at is not None:
      rest = rest[:target_at] + (M.prepare_params(rest[target_at], cfg),) + rest[target_at + 1 :]

    def body(carry):
      i, acc = carry
      bump = (acc > 1e30).astype(x.dtype)
      return i + 1, acc + jnp.sum(draft(x + bump, *rest).astype(jnp.float32))

    return jax.lax.while_loop(lambda c: c[0] < n, body, (jnp.int32(0), jnp.float32(0.0)))[1]

  return fn


def _abstract(tree, dtype):
  return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype)), tree)


def _cache(cfg, batch: int, context: int):
  """Abstract KV cache (one tree decoder's layout) of `context` positions."""
  params = M.abstract_params(cfg)
  sp = jax.eval_shape(lambda: common.make_sampling_params(batch, 1, 0.0, 0, 1.0, 0, None))
  prompt, lengths = jax.ShapeDtypeStruct((batch, 16), jnp.int32), jax.ShapeDtypeStruct((batch,), jnp.int32)
  prefill = functools.partial(
      common.prefill_state,
      cfg=cfg,
      readout_depths=(cfg.recurrence,),
      total_len=context,
      random_init=False,
      cache_group=1,
  )
  return jax.eval_shape(prefill, params, prompt, lengths, sp)[0]


def drafts(cfg, d1s, num_heads: int, batch: int, context: int) -> dict:
  """{label: (function, abstract arguments, the KV buffers among them, the index of the target's parameters
  among the arguments after the first, or None)} of every draft program (module docstring)."""
  params = M.abstract_params(cfg)
  b, e, t = batch, cfg.hidden_size, context
  tok = jax.ShapeDtypeStruct((b, 1), jnp.int32)
  p0 = jax.ShapeDtypeStruct((b,), jnp.int32)
  feat = jax.ShapeDtypeStruct((b, e), jnp.float32)
  out = {}
  cache = _cache(cfg, b, t)
  layout = kvcache.CacheLayout.of(cfg, 1)
  for d1 in d1s:
    readout = lambda x, p, c, q, d1=d1: passes.run_level(p, c, layout, x, q, 0, None, None, d1, cfg, None)[0]
    out[f"readout d1={d1}"] = (readout, (tok, params, cache, p0), cache, 0)
  mh = _abstract(heads_medusa.abstract_params(heads_medusa.config_of(cfg, num_heads)), cfg.dtype)
  medusa = lambda x, hp, r: medusa_decoder.build_tree(hp, x, r, branch=4, tree_nodes=16).tokens
  out[f"medusa ({num_heads} heads, one round)"] = (medusa, (feat, mh, p0), (), None)
  eh = _abstract(E.abstract_params(E.head_config(cfg, "final")), cfg.dtype)
  kv = jax.ShapeDtypeStruct((b, cfg.num_kv_heads, t, cfg.head_dim), jnp.dtype(cfg.dtype))

  def eagle(x, hp, p, k, v, q, toks):
    ctx = [(k, v, jnp.broadcast_to(jnp.arange(t)[None, None, :] < q[:, None, None], (b, 1, t)))]
    h, _, _ = E.step(hp, p, toks, x[:, None, :], q[:, None], jnp.ones((b, 1, 1), bool), ctx, cfg)
    return M.readout_logits(p, h, cfg)

  out["eagle (one level, one row)"] = (eagle, (feat, eh, params, kv, kv, p0, tok), (kv, kv), 1)
  mp = _abstract(heads_mtp.init_params_abstract(cfg), cfg.dtype)
  mtp = lambda x, hp, p, toks: heads_mtp.logits(hp, p, x[:, None, :].astype(jnp.dtype(cfg.dtype)), toks, cfg)
  out["mtp (one level, one row)"] = (mtp, (feat, mp, params, tok), (), 1)
  return out


def draft_rows(cfg, d1s, num_heads: int, batch: int, context: int, branch: str = "max") -> list:
  """One row per draft program: ops, GFLOP and GB by category of one call (its HLO, one loop iteration)."""
  rows = []
  n = jax.ShapeDtypeStruct((), jnp.int32)
  for label, (fn, args, kv, target_at) in drafts(cfg, d1s, num_heads, batch, context).items():
    t0 = time.perf_counter()
    hlo = jax.jit(_looped(fn, cfg, target_at)).lower(n, *args).compile().as_text()
    step = cost.analyze_hlo(hlo, cost.kv_leaf_dims({"cache": kv}), cost.slot_bytes(cfg, batch, context), branch)
    d = step.as_dict()
    rows.append(dict(label=label, compile_seconds=time.perf_counter() - t0, **d))
  return rows


def format_rows(rows: list, model: str, context: int) -> str:
  ref = next(r for r in rows if r["label"].startswith("readout"))
  out = [
      f"| model | ctx | drafter (one call) | ops | GFLOP | GB total | GB weights | GB KV | x {ref['label']} flops "
      f"| x {ref['label']} bytes |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    tot = r["total_bytes"]
    cells = [model, str(context), r["label"], f"{r['ops']:.0f}", f"{r['flops'] / GB:.3g}", f"{tot / GB:.3g}"]
    cells += [f"{r['bytes']['weights'] / GB:.3g}", f"{r['bytes']['kv'] / GB:.3g}", f"{r['flops'] / ref['flops']:.3f}"]
    cells += [f"{tot / ref['total_bytes']:.3f}"]
    out.append("| " + " | ".join(cells) + " |")
  return "\n".join(out)


def run_draft_costs(c) -> list:
  """The `:heads` preset's report: the draft rows of each model of `c.models` at each context."""
  t0 = time.perf_counter()
  rows, tables = [], []
  for label in [m.strip() for m in c.models.split(",") if m.strip()]:
    settings = c.model_settings[label]
    for context in list(settings.contexts) or list(c.contexts):
      cfg = xcommon.model_config_at(settings.spec, c.dtype, context)
      got = draft_rows(cfg, tuple(settings.d1s), int(settings.num_heads), c.batch, context, c.branch)
      rows += [dict(r, model=label, context=context) for r in got]
      tables.append(format_rows(got, label, context))
      print(f"[{time.perf_counter() - t0:.0f}s] {label} ctx {context} done", flush=True)
  print(f"dtype {c.dtype}, batch {c.batch}; one call of each draft program (optimised HLO, CPU-compiled)\n")
  print("\n\n".join(tables) + f"\n\nreport took {time.perf_counter() - t0:.0f} s")
  if c.out:
    xcommon.atomic_write_json(c.out, {"config": c.to_dict(), "rows": rows})
    print(f"wrote {c.out}")
  return rows
