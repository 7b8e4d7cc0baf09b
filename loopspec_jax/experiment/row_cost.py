"""The cost of one core step on M rows against one row, and what it bounds: LoopSpec against AR on the host
it runs on (the measurement behind `loopspec-row-cost`; experiments/row_cost.py explains the bound).

t(M): one core step (`looped.core_step`, weights in decode form, every row attending to T cached positions
of its own per core layer) on M rows in a jitted `lax.fori_loop`; an AR token of `generate(method="ar")` at
the same cache length; LoopSpec / AR <= tokens per tick x t_AR / (d1 t(G)); and the whole tick against an AR
token at several cache lengths.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

import loopspec_jax
from loopspec_jax.experiment import timing
from loopspec_jax.models import looped as M


def core_step_loop(model, rows: int, context: int, steps: int):
  """A callable running `steps` core steps on `rows` rows (one jitted fori_loop), each row attending to its
  own block of `context` cached positions per core layer ([rows, KV, T, D] per layer: a tick's G lanes read
  G blocks, an AR token's one row reads one). Returns the final state (to block on)."""
  cfg = model.config
  dt = jnp.dtype(cfg.dtype)
  params = M.prepare_params(model.params, cfg)
  keys = jax.random.split(jax.random.PRNGKey(rows), 2 * cfg.n_core + 2)
  kv_shape = (rows, cfg.num_kv_heads, context, cfg.head_dim)
  kc = tuple(jax.random.normal(keys[l], kv_shape, dt) for l in range(cfg.n_core))
  vc = tuple(jax.random.normal(keys[cfg.n_core + l], kv_shape, dt) for l in range(cfg.n_core))
  s0 = 0.1 * jax.random.normal(keys[-2], (rows, 1, cfg.hidden_size), dt)
  e = 0.1 * jax.random.normal(keys[-1], (rows, 1, cfg.hidden_size), dt)
  pos = jnp.full((rows, 1), context, jnp.int32)
  mask = jnp.ones((rows, 1, context), bool)
  self_mask = jnp.ones((rows, 1, 1), bool)

  @jax.jit
  def run(params, s, e, kc, vc):
    ctx = lambda l: [(kc[l], vc[l], mask)]
    body = lambda _, s: M.core_step(params, s, e, pos, self_mask, ctx, cfg)[0]
    return jax.lax.fori_loop(0, steps, body, s)

  return lambda: run(params, s0, e, kc, vc)


def check_cache_length(cfg, context: int, new_tokens: int):
  """A decode of `new_tokens` after a prompt of `context - new_tokens` tokens must have a prompt and fit the
  model's context; ValueError otherwise (checked before anything compiles)."""
  if not new_tokens < context <= cfg.max_len:
    raise ValueError(
        f"cache length {context} must exceed new_tokens={new_tokens} (the prompt is the rest) and fit the "
        f"model's context of {cfg.max_len} positions"
    )


def random_prompt(model, context: int, new_tokens: int, rng) -> list:
  """Random token ids of a prompt whose decode of `new_tokens` fills `context` cache positions."""
  check_cache_length(model.config, context, new_tokens)
  return rng.randint(0, model.config.vocab_size, context - new_tokens).tolist()


def seconds_per_step(model, prompt: list, new_tokens: int, **method_kw) -> float:
  """Decode seconds (after prefill) per loop iteration of one `generate` call: per token for AR, per tick
  for LoopSpec."""
  st = loopspec_jax.generate(model, [prompt], max_new_tokens=new_tokens, **method_kw).stats
  return st["decode_seconds"] / max(st.get("ticks") or st["tokens_generated"], 1)


def ar_token_loop(model, context: int, new_tokens: int, seed: int):
  """A callable decoding one random prompt of `context - new_tokens` tokens with AR; returns decode seconds
  per token (the cache holds `context` positions, as `core_step_loop`'s rows attend to)."""
  prompt = random_prompt(model, context, new_tokens, np.random.RandomState(seed))
  return lambda: seconds_per_step(model, prompt, new_tokens, method="ar")


def measure(model, rows: list, context: int, new_tokens: int, steps: int, repeats: int, seed: int = 0) -> dict:
  """Median seconds of one core step per row count, and of one AR token; `repeats` rounds each time every
  row count and AR once in turn (after one untimed compiling round), so a slow spell hits all alike."""
  loops = {m: core_step_loop(model, m, context, steps) for m in rows}

  def step_seconds(f):
    t0 = time.perf_counter()
    jax.block_until_ready(f())
    return (time.perf_counter() - t0) / steps

  calls = {m: functools.partial(step_seconds, f) for m, f in loops.items()}
  calls["ar"] = ar_token_loop(model, context, new_tokens, seed)
  times = timing.interleaved(calls, repeats)
  ar_times = times.pop("ar")
  return {
      "step_seconds": timing.medians(times),
      "step_seconds_all": times,
      "ar_token_seconds": statistics.median(ar_times),
      "ar_token_seconds_all": ar_times,
  }


def pipeline_tokens_per_tick(new_tokens: int, n_groups: int) -> float:
  """Tokens per tick of an N-token request decoded without a rejection: the pipeline fills once (G - 1 ticks
  before the first commit), then commits one token every tick."""
  return new_tokens / (new_tokens + n_groups - 1)


def ratio_bound(ar_token_s: float, step_s_g: float, d1: int, tokens_per_tick: float = 1.0) -> float:
  """The most LoopSpec can gain over AR: tokens per tick x t_AR / (d1 t(G)) (a tick costs at least its d1
  core steps on the G pipeline rows)."""
  return tokens_per_tick * ar_token_s / (d1 * step_s_g)


def summarize(name: str, model, res: dict, d1: int, new_tokens: int, costs: Optional[dict] = None) -> dict:
  """The bound for the model's pipeline width G = R / d1, from `measure`'s medians; with `decode_costs`'s
  `costs`, those and the per-position slope of AR and of the tick."""
  r = model.config.recurrence
  g = r // d1
  t1 = res["step_seconds"][1]
  tg = res["step_seconds"][g]
  tpt = pipeline_tokens_per_tick(new_tokens, g)
  out = {
      "model": name,
      "recurrence": r,
      "d1": d1,
      "groups": g,
      "ar_token_ms": 1e3 * res["ar_token_seconds"],
      "ar_core_ms": 1e3 * r * t1,  # R core steps on one row: the part of an AR token the tick replaces
      "tick_core_floor_ms": 1e3 * d1 * tg,
      "row_step_cost_vs_one_row": tg / (g * t1),
      "ideal_tokens_per_tick": tpt,
      "bound_at_one_token_per_tick": ratio_bound(res["ar_token_seconds"], tg, d1),
      "bound_no_rejection": ratio_bound(res["ar_token_seconds"], tg, d1, tpt),
  }
  if costs:
    out["decode_costs"] = costs
    out["ar_slope_s_per_position"] = slope_per_position(costs, "ar")
    out["tick_slope_s_per_position"] = slope_per_position(costs, "loopspec")
  return out


def decode_costs(model, d1: int, contexts: list, new_tokens: int, repeats: int, seed: int = 0) -> dict:
  """Per cache length T: AR seconds per token and LoopSpec (single proposal at d1) seconds per tick of one
  random prompt of T - N tokens, N = new_tokens (`generate`'s decode time after prefill; medians of
  `repeats` interleaved rounds after a compiling one). The LoopSpec cache holds one more position."""
  rng = np.random.RandomState(seed)
  prompts = {t: random_prompt(model, t, new_tokens, rng) for t in contexts}
  runs = {"ar": dict(method="ar"), "loopspec": dict(method="loopspec", d1=d1)}
  once = lambda t, kw: seconds_per_step(model, prompts[t], new_tokens, **kw)
  calls = {(t, m): functools.partial(once, t, kw) for t in contexts for m, kw in runs.items()}
  med = timing.medians(timing.interleaved(calls, repeats))
  return {t: {m: med[t, m] for m in runs} for t in contexts}


def slope_per_position(costs: dict, method: str) -> float:
  """Least-squares seconds per cache position of `method`'s step cost over the measured T."""
  ts = sorted(costs)
  if len(ts) < 2:
    return float("nan")
  return float(np.polyfit(ts, [costs[t][method] for t in ts], 1)[0])


def tables(per_model: list, new_tokens: int) -> str:
  """Markdown: the row-cost table of every model, the bound table, and the tick against AR per cache length."""
  out = [
      "| model | rows M | ms per core step | ms per row-step | row-step cost vs one row |",
      "|---|---|---|---|---|",
  ]
  for name, res, _ in per_model:
    t1 = res["step_seconds"][1]
    for m, t in res["step_seconds"].items():
      out.append(f"| {name} | {m} | {1e3 * t:.3f} | {1e3 * t / m:.4f} | {t / (m * t1):.2f} |")
  out += [
      "",
      "| model | AR ms/token | of which R core steps (R t(1)) | d1, G | tick's core steps d1 t(G) | "
      "row-step cost at G vs one row | bound: 1 token/tick | bound: "
      f"{new_tokens} tokens without a rejection |",
      "|---|---|---|---|---|---|---|---|",
  ]
  for name, _, s in per_model:
    out.append(
        f"| {name} | {s['ar_token_ms']:.2f} | {s['ar_core_ms']:.2f} | {s['d1']}, {s['groups']} | "
        f"{s['tick_core_floor_ms']:.2f} | {s['row_step_cost_vs_one_row']:.2f} | "
        f"{s['bound_at_one_token_per_tick']:.2f}x | {s['bound_no_rejection']:.2f}x "
        f"({s['ideal_tokens_per_tick']:.3f} tokens/tick) |"
    )
  out += [
      "",
      "| model | cache positions T | AR ms/token | LoopSpec ms/tick (d1, -) | tick / AR token | AR / tick x "
      f"{new_tokens}-token pipeline (the bound with the whole tick) |",
      "|---|---|---|---|---|---|",
  ]
  for name, _, s in per_model:
    for t, c in s.get("decode_costs", {}).items():
      rel = c["loopspec"] / c["ar"]
      out.append(
          f"| {name} | {t} | {1e3 * c['ar']:.2f} | {1e3 * c['loopspec']:.2f} | {rel:.2f} | "
          f"{s['ideal_tokens_per_tick'] / rel:.2f}x |"
      )
    if len(s.get("decode_costs", {})) > 1:
      out.append(
          f"| {name} | per 100 positions | {1e5 * s['ar_slope_s_per_position']:.3f} | "
          f"{1e5 * s['tick_slope_s_per_position']:.3f} | | |"
      )
  return "\n".join(out)
