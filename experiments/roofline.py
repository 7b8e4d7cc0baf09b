"""AR and the LoopSpec tick on a model against this host's roofline, before and after the AR loop's layout.

  python -m loopspec_experiments.roofline --out results/roofline/<host>-<date> [--clock cpu]

In one process and interleaved (`calibrate.measure_runs`, the same load on every figure): the AR loop as it
was ("ar_scan": a `lax.scan` over the R core steps, each step copying its (step, layer) slots out of one
[R, ...] cache buffer per layer, and the tied LM head transposed once per call), the AR loop as it is
(`decoding/autoregressive.py`: steps unrolled, one buffer per slot read in place, the embedding contracted as
stored), a LoopSpec tick, and the host microbenchmarks of `analysis/calibrate.py` (stream bandwidth at a
1 GiB pass and at the model's working set, P(M), per-op overhead, every product shape of the loops).

Per AR loop: ms per token, the ideal bytes of a token (`cost.ar_token_bytes`), the bandwidth bound (ideal
bytes at the bandwidth measured at the working set, as `cost_calibration` does; and at the 1 GiB pass) and
the fraction of it reached. Per tick: its time against the calibrated model's (`cost_calibration.predict`,
per-op overhead fitted on the new AR loop as the calibration does).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import os
import platform

import jax
import jax.numpy as jnp

from loopspec_jax.analysis import calibrate
from loopspec_jax.analysis import cost
from loopspec_jax.decoding import autoregressive as ar
from loopspec_jax.decoding import common as dcommon
from loopspec_jax.decoding import sampling
from loopspec_experiments import common
from loopspec_experiments import cost_calibration as cc
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M


# ---------------------------------------------------------------------------------------------------
# The AR loop before this change (kept here as the baseline it is measured against)
# ---------------------------------------------------------------------------------------------------
def _scan_token_step(params, cache, tok, pos, layout, cfg):
  """One token through every depth with the R core steps in a scan (`kvcache.run_core_steps`, group 1)."""
  b, t = tok.shape[0], cache.length
  q = pos[:, None]
  mask = jnp.arange(t)[None, None, :] < pos[:, None, None]
  self_mask = jnp.ones((b, 1, 1), bool)
  e, k, v = M.pre(params, tok[:, None], q, self_mask, kvcache.prelude_ctx(cache, mask), cfg)
  cache = kvcache.write_prelude(cache, k, v, kvcache.ordered(q, e, t))
  s = M.initial_state(e, cfg)
  s, cache = kvcache.run_core_steps(params, cache, layout, s, e, q, self_mask, mask, 0, cfg.recurrence, cfg)
  hidden, k, v = M.coda_hidden(params, s, q, self_mask, kvcache.coda_ctx(cache, 0, mask), cfg)
  feats = M.final_features(params, hidden, cfg)
  logits = jnp.einsum("...e,ev->...v", feats, params["head_t"], preferred_element_type=jnp.float32)
  cache = kvcache.write_coda(cache, 0, k, v, kvcache.ordered(q, logits, t))
  return logits[:, 0], cache


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("state",))
def scan_decode_loop(params, state, sp, *, cfg):
  """The greedy AR loop as it was: scan over steps, group-1 cache, tied head materialised as [E, V]."""
  layout = kvcache.CacheLayout.of(cfg, 1)
  params = dict(M.prepare_params(params, cfg), head_t=M.head_matrix(params, cfg))

  def body(st):
    b = st.tokens.shape[0]
    pos = st.length - 1
    logits, cache = _scan_token_step(params, st.cache, st.tokens[jnp.arange(b), pos], pos, layout, cfg)
    y = sampling.greedy_token(logits)
    tokens, length, n_new, done, _ = dcommon.commit_tokens(
        st.tokens, st.length, st.n_new, st.done, y[:, None], jnp.ones_like(y), sp
    )
    return ar.DecodeState(
        cache=cache, tokens=tokens, length=length, n_new=n_new, done=done, iterations=st.iterations + 1
    )

  return dcommon.loop_until_done(body, state, sp)


@dataclasses.dataclass(frozen=True)
class ScanAR(ar.AR):
  """AR with the loop as it was before the unrolled layout (greedy only)."""

  name = "ar"

  @property
  def label(self) -> str:
    return "ar_scan"

  def make_decoder(self, cfg, *, greedy: bool, random_init: bool):
    if not greedy or random_init:
      raise ValueError("the baseline AR loop is greedy with a zero initial state")
    return dataclasses.replace(
        ar.make_decoder(cfg, greedy=True, random_init=False), cache_group=1, loop=scan_decode_loop, loop_kw={"cfg": cfg}
    )


# ---------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------
def ar_row(name, m, cfg, context, bw_ws, bw_gib) -> dict:
  ideal = float(sum(cost.ar_token_bytes(cfg, context).values()))
  ms = m["iteration_s"] * 1e3
  return {
      "loop": name,
      "ms_per_token": ms,
      "ms_all": [t * 1e3 for t in m["iteration_s_all"]],
      "ideal_bytes": ideal,
      "bandwidth_ws": bw_ws,
      "bandwidth_1gib": bw_gib,
      "bound_ms": ideal / bw_ws * 1e3,
      "fraction_of_bound": ideal / bw_ws * 1e3 / ms,
      "bound_1gib_ms": ideal / bw_gib * 1e3,
      "fraction_of_1gib_bound": ideal / bw_gib * 1e3 / ms,
  }


def measure(args) -> dict:
  calibrate.set_clock(args.clock)
  model = common.resolve_model(args.model)
  cfg = model.config.replace(max_len=args.context)
  specs = {"ar_scan": ScanAR(), "ar": "ar", args.tick_label: args.tick}
  loops = {
      k: calibrate.time_decode_loop(model, s, context=args.context, new_tokens=args.new_tokens, greedy=True)
      for k, s in specs.items()
  }
  steps = {k: cost.analyze_hlo(lr.hlo, lr.kv_dims, lr.slot_bytes) for k, lr in loops.items()}
  ws = cc.working_sets(cfg, args.context)
  sizes = sorted(set(list(ws.values()) + [float(1 << 30)]))
  fns, work = calibrate.host_fns(cfg, sizes, (1, 2, 4, 8, 16, 32), cc.shapes_to_time(steps.values(), 0))
  measured, host_secs = calibrate.measure_runs(loops, args.repeats, fns, "median")
  hw = calibrate.hardware_from(host_secs, work)
  bw_ws, bw_gib = hw.stream_bandwidth(ws["kv"]), hw.stream_bandwidth(float(1 << 30))
  rows = [ar_row(k, measured[k], cfg, args.context, bw_ws, bw_gib) for k in ("ar_scan", "ar")]
  for r, k in zip(rows, ("ar_scan", "ar")):
    r.update(ops=steps[k].ops, hlo_bytes=steps[k].total_bytes, flops=steps[k].flops)
  hw_fit = cc.fit_overhead(hw, steps["ar"], ws, measured["ar"]["iteration_s"])
  pred_s, terms, step = cc.predict(hw_fit, loops[args.tick_label], ws, "kernels")
  tick = {
      "loop": args.tick_label,
      "ms_per_tick": measured[args.tick_label]["iteration_s"] * 1e3,
      "ms_all": [t * 1e3 for t in measured[args.tick_label]["iteration_s_all"]],
      "predicted_ms": pred_s * 1e3,
      "ratio_to_model": measured[args.tick_label]["iteration_s"] / pred_s,
      "terms_ms": terms,
      "flops": step.flops,
      "bytes": step.total_bytes,
      "ops": step.ops,
      "flops_by_rows": {str(k): v for k, v in step.flops_by_rows.items()},
  }
  return {
      "ar": rows,
      "tick": tick,
      "host": hw_fit.as_dict(),
      "ar_scan_over_ar": rows[0]["ms_per_token"] / rows[1]["ms_per_token"],
  }


def markdown(res: dict) -> str:
  lines = [
      "| loop | ms/token | ideal MB | BW at working set GB/s | bound ms | of bound | BW 1 GiB GB/s | of 1 GiB bound | ops |"
  ]
  lines.append("|---|---|---|---|---|---|---|---|---|")
  for r in res["ar"]:
    lines.append(
        f"| {r['loop']} | {r['ms_per_token']:.1f} | {r['ideal_bytes'] / 1e6:.0f} | {r['bandwidth_ws'] / 1e9:.1f} |"
        f" {r['bound_ms']:.1f} | {100 * r['fraction_of_bound']:.0f}% | {r['bandwidth_1gib'] / 1e9:.1f} |"
        f" {100 * r['fraction_of_1gib_bound']:.0f}% | {r['ops']:.0f} |"
    )
  t = res["tick"]
  terms = ", ".join(f"{k} {v:.3g}" for k, v in t["terms_ms"].items())
  lines += [
      "",
      f"ar_scan / ar: {res['ar_scan_over_ar']:.2f}x",
      "",
      f"{t['loop']} tick: {t['ms_per_tick']:.1f} ms measured, {t['predicted_ms']:.1f} ms by the calibrated model"
      f" ({terms}): {t['ratio_to_model']:.2f}x; {t['flops'] / 1e9:.2f} GFLOP, {t['bytes'] / 1e6:.0f} MB, {t['ops']:.0f} ops",
  ]
  return "\n".join(lines) + "\n"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="random:huginn:bench_e512")
  p.add_argument("--context", type=int, default=512)
  p.add_argument("--new-tokens", type=int, default=16)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--clock", default="cpu", choices=sorted(calibrate.CLOCKS))
  p.add_argument("--tick", default="loopspec:d1=2,d2=8")
  p.add_argument("--tick-label", default="loopspec(2,8)")
  p.add_argument("--out", default="")
  p.add_argument("--tag", default="")
  args = p.parse_args(argv)
  load0 = os.getloadavg()
  start = datetime.datetime.now(datetime.timezone.utc)
  res = measure(args)
  res.update(
      args=vars(args),
      load_start=load0,
      load_end=os.getloadavg(),
      start=start.isoformat(timespec="seconds"),
      host=platform.node(),
      jax=jax.__version__,
      host_terms=res.pop("host"),
  )
  text = markdown(res)
  print(text, f"load {load0} -> {res['load_end']}")
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    name = f"roofline_{args.clock}{'_' + args.tag if args.tag else ''}"
    common.atomic_write_json(os.path.join(args.out, name + ".json"), res)
    common.atomic_write_text(os.path.join(args.out, name + ".md"), text + f"\nload {load0} -> {res['load_end']}\n")
  return res


if __name__ == "__main__":
  main()
