"""How close each depth's readout is to depth R along decoded text, and the theory built on it.

`measure_depths` decodes every prompt at full depth (AR `generate`), then runs ONE jitted full-sequence
forward of prompt + generated tokens that reads out every depth 1..R (the same computation as
`api.readouts`) and, at the positions that predicted the generated tokens, compares p_r with p_R after the
same `sampling.process_logits` the decoders use: greedy agreement (argmax equality), TV(p_r, p_R) and
KL(p_R || p_r). Per-prompt sums go to a JSONL file one complete line at a time, so a killed run resumes.
`summarize_depths` turns them into per-depth means, the power-law fits of Theorem 2 and the predicted
(d1, d2); `depth_plots.plot_depths` draws them. The JSONL helpers and chain / cost-identity helpers here are
shared with experiments/sweep*.py, experiments/evaluate.py and notebooks/sweep_analysis.ipynb.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Dict, Iterable, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax import api
from loopspec_jax import prompts as prompt_sets
from loopspec_jax.models import layers
from loopspec_jax.models import looped as M
from loopspec_jax.decoding import sampling as S
from loopspec_jax.analysis import theory

TV_FLOOR = 1e-6  # mean TVs at or below this are float32 round-off, left out of the power-law fits
KL_EPS = 1e-9  # floor on p_r inside KL(p_R || p_r): a token p_r filtered out costs -log(KL_EPS) ~ 20.7 nats
# Bound on one lax.map chunk of readouts (depths x positions x vocab floats) to keep memory flat for long prompts.
_CHUNK_FLOATS = 64 * 1024 * 1024

__all__ = [
    "KL_EPS",
    "TV_FLOOR",
    "read_jsonl",
    "append_jsonl",
    "run_key",
    "prepare_prompts",
    "depth_metrics",
    "measure_depths",
    "summarize_depths",
    "predicted_loopspec",
    "fit_chain_acceptance",
    "implied_chain_acceptance",
    "ratio_standard_error",
    "greedy_agreement",
    "replay_loopspec_counts",
    "replay_chain_counts",
]


# ----------------------------------------------------------------------------------------------------------
# Crash-safe JSONL (one complete line per append)
# ----------------------------------------------------------------------------------------------------------
def read_jsonl(path: str, repair: bool = True) -> List[dict]:
  """All complete JSON lines of `path` ([] if missing). A torn last line (a killed writer) is dropped and,
  with repair=True, the file is rewritten atomically without it, so later appends start on a fresh line."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    text = f.read()
  rows, bad = [], False
  for line in text.split("\n"):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      bad = True
  if repair and (bad or (text and not text.endswith("\n"))):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write("".join(json.dumps(r, default=_json_default) + "\n" for r in rows))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  return rows


def append_jsonl(path: str, row: dict):
  """Appends one row as a single write of a complete line, then flushes and fsyncs it."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  line = json.dumps(row, default=_json_default) + "\n"
  with open(path, "a", encoding="utf-8") as f:
    f.write(line)
    f.flush()
    os.fsync(f.fileno())


def _json_default(x):
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, np.floating):
    return float(x)
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(type(x))


def run_key(**fields) -> str:
  """Canonical string of the settings that identify a measurement (rows with another key are not reused)."""
  return json.dumps(fields, sort_keys=True, default=_json_default)


# ----------------------------------------------------------------------------------------------------------
# Prompts as token ids
# ----------------------------------------------------------------------------------------------------------
def prepare_prompts(
    task: str,
    model,
    num: int,
    *,
    max_new_tokens: int,
    prompt_len: int = 32,
    seed: int = 0,
    max_prompt_tokens: Optional[int] = None,
) -> List[List[int]]:
  """Token-id prompts: 'random' draws `prompt_len` uniform ids per prompt (seeded); other tasks come from
  `loopspec_jax.prompts` encoded with the model's tokenizer and left-truncated (keeping the end) to fit
  max_prompt_tokens and the context with max_new_tokens."""
  cfg = model.config
  if task == "random":
    rng = np.random.RandomState(seed)
    return [rng.randint(0, cfg.vocab_size, prompt_len).tolist() for _ in range(num)]
  keep = cfg.max_len - max_new_tokens
  if max_prompt_tokens:
    keep = min(keep, int(max_prompt_tokens))
  if keep < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in {cfg.max_len} positions")
  return [model.encode(t)[-keep:] for t in prompt_sets.load_prompts(task, num)]


# ----------------------------------------------------------------------------------------------------------
# Per-depth metrics in one jitted forward
# ----------------------------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("cfg", "n_pos"))
def _depth_metrics(params, tokens, length, start, n_valid, temperature, top_k, top_p, *, cfg, n_pos):
  """[R, n_pos] agreement / TV / KL of p_r against p_R at positions start .. start + n_pos - 1 (masked).

  The temperature is traced (0 gives process_logits' one-hot argmax), so greedy and sampling settings share
  one compiled program.
  """
  b, t = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = M.causal_mask(length[None], t)
  none = layers.no_context
  e, _, _ = M.pre(params, tokens, pos, mask, none, cfg)
  s = M.initial_state(e, cfg, None)
  r = cfg.recurrence

  def step(s, _):
    s, _, _ = M.core_step(params, s, e, pos, mask, none, cfg)
    return s, s

  _, states = jax.lax.scan(step, s, None, length=r)  # states[i] = s_{i+1}: [R, 1, T, E]
  idx = jnp.clip(start + jnp.arange(n_pos), 0, t - 1)

  def readout(state):
    logits, _, _ = M.post(params, state, pos, mask, none, cfg)
    return logits[0, idx]  # [n_pos, V]

  process = functools.partial(S.process_logits, greedy=False, temperature=temperature, top_k=top_k, top_p=top_p)
  logits_r = readout(states[r - 1])
  p_r = process(logits_r)
  top_r = jnp.argmax(logits_r, axis=-1)

  def metrics(state):
    logits = readout(state)
    p = process(logits)
    agree = (jnp.argmax(logits, axis=-1) == top_r).astype(jnp.float32)
    tv = 0.5 * jnp.sum(jnp.abs(p - p_r), axis=-1)
    kl = jnp.sum(
        jnp.where(p_r > 0, p_r * (jnp.log(jnp.maximum(p_r, KL_EPS)) - jnp.log(jnp.maximum(p, KL_EPS))), 0.0), axis=-1
    )
    return agree, tv, jnp.maximum(kl, 0.0)

  valid = (jnp.arange(n_pos) < n_valid).astype(jnp.float32)[None]
  exact = (valid, jnp.zeros_like(valid), jnp.zeros_like(valid))  # depth R against itself, exactly
  if r == 1:
    return exact
  chunk = max(1, _CHUNK_FLOATS // max(n_pos * cfg.vocab_size, 1))
  shallow = jax.lax.map(metrics, states[:-1], batch_size=min(chunk, r - 1))
  return tuple(jnp.concatenate([x * valid, y], axis=0) for x, y in zip(shallow, exact))


def _bucket(x: int, m: int) -> int:
  return ((x + m - 1) // m) * m


def depth_metrics(
    model, prompt: Sequence[int], generated: Sequence[int], sampling: Optional[dict] = None, n_pos: Optional[int] = None
) -> Dict[str, np.ndarray]:
  """Per-depth [R, n] agreement, TV and KL at the positions that predicted `generated` (after `prompt`).

  The sequence is padded to a multiple of 32 and the positions to n_pos (default len(generated)) so that
  prompts of similar lengths share one compiled program; padded positions are cut from the result.
  """
  cfg = model.config
  sampling = dict(sampling or {})
  temperature = float(sampling.get("temperature", 0.0))
  ids = list(prompt) + list(generated)
  n = len(generated)
  if n < 1:
    raise ValueError("no generated tokens to measure")
  n_pos = max(n, int(n_pos or n))
  t = min(_bucket(len(ids), 32), cfg.max_len)
  arr = np.zeros((1, t), np.int32)
  arr[0, : len(ids)] = ids
  out = _depth_metrics(
      model.params,
      jnp.asarray(arr),
      jnp.int32(len(ids)),
      jnp.int32(len(prompt) - 1),
      jnp.int32(n),
      jnp.float32(temperature),
      jnp.int32(sampling.get("top_k", 0)),
      jnp.float32(sampling.get("top_p", 1.0)),
      cfg=cfg,
      n_pos=n_pos,
  )
  agree, tv, kl = (np.asarray(x, np.float64)[:, :n] for x in out)
  return {"agree": agree, "tv": tv, "kl": kl}


# ----------------------------------------------------------------------------------------------------------
# The measurement loop (resumable) and its summary
# ----------------------------------------------------------------------------------------------------------
def measure_depths(
    model,
    prompts: List[List[int]],
    *,
    sampling: Optional[dict] = None,
    max_new_tokens: int,
    seed: int = 0,
    eos_id: Optional[int] = None,
    out_jsonl: Optional[str] = None,
    key: str = "",
    progress: bool = True,
) -> List[dict]:
  """Decodes each prompt with AR at full depth and records per-depth sums; returns one record per prompt.

  Records already in `out_jsonl` under the same `key` are reused (skipped); new ones are appended as they
  finish. Prompt i decodes with request id i and `seed`, as experiments/sweep.py does, so sampled AR
  trajectories are the same in both.
  """
  from tqdm import tqdm

  sampling = {k: v for k, v in dict(sampling or {}).items() if k in ("temperature", "top_k", "top_p")}
  done = {}
  if out_jsonl:
    for rec in read_jsonl(out_jsonl):
      if rec.get("key") == key:
        done[rec["index"]] = rec
  records = []
  for i in tqdm(range(len(prompts)), desc="depths", disable=not progress):
    if i in done and done[i]["prompt"] == list(prompts[i]):
      records.append(done[i])
      continue
    res = api.generate(
        model,
        [prompts[i]],
        max_new_tokens=max_new_tokens,
        method="ar",
        seed=seed,
        eos_id=eos_id,
        request_ids=[i],
        **sampling,
    )
    gen = res.tokens[0]
    m = depth_metrics(model, prompts[i], gen, sampling, n_pos=max_new_tokens)
    rec = {
        "key": key,
        "index": i,
        "prompt": list(prompts[i]),
        "tokens": gen,
        "n": len(gen),
        "agree": m["agree"].sum(1).tolist(),
        "tv_sum": m["tv"].sum(1).tolist(),
        "kl_sum": m["kl"].sum(1).tolist(),
        "tv_max": m["tv"].max(1).tolist(),
    }
    if out_jsonl:
      append_jsonl(out_jsonl, rec)
    records.append(rec)
  return records


def summarize_depths(
    records: List[dict],
    recurrence: int,
    include_single: bool = True,
    meta: Optional[dict] = None,
    tv_floor: float = TV_FLOOR,
) -> dict:
  """Per-depth means over all measured positions, the power-law fits and Theorem 2's predictions.

  Fits use depths 1..R-1 whose mean exceeds `tv_floor` (depth R is 0 by definition; below the floor a TV is
  float32 round-off between equal distributions and would drag the slope); the envelope is
  `theory.fit_power_law(envelope=True)`, which Theorem 2 and `theory.best_feasible_depths` use. With fewer
  than two depths above the floor the fits are None (the readouts are already exact at shallow depths).
  """
  r = int(recurrence)
  n = sum(rec["n"] for rec in records)
  if n == 0:
    raise ValueError("no measured positions")
  col = lambda k: np.sum([rec[k] for rec in records], axis=0)
  agree, tv, kl = col("agree") / n, col("tv_sum") / n, col("kl_sum") / n
  counts = [rec["n"] for rec in records]
  depths = list(range(1, r + 1))
  out = {
      "recurrence": r,
      "positions": int(n),
      "prompts": len(records),
      "depths": depths,
      "agreement": agree.tolist(),
      "disagreement": (1.0 - agree).tolist(),
      "mean_tv": tv.tolist(),
      "mean_kl": kl.tolist(),
      "max_tv": np.max([rec["tv_max"] for rec in records], axis=0).tolist(),
      # Standard errors across prompts (positions along one text are correlated, prompts are not).
      "agreement_se": ratio_standard_error([rec["agree"] for rec in records], counts).tolist(),
      "mean_tv_se": ratio_standard_error([rec["tv_sum"] for rec in records], counts).tolist(),
      "mean_kl_se": ratio_standard_error([rec["kl_sum"] for rec in records], counts).tolist(),
      "fits": {"least_squares": None, "envelope": None, "disagreement_envelope": None},
      "theorem2": None,
      "meta": meta or {},
  }
  out["tv_floor"] = tv_floor
  out["fits"] = _power_law_fits(np.asarray(depths[:-1], float), tv[:-1], 1.0 - agree[:-1], tv_floor)
  env = out["fits"]["envelope"]
  if env is not None and env["alpha"] > 0 and env["beta"] > 0:
    out["theorem2"] = _theorem2(r, tv, env, out["fits"]["least_squares"], include_single)
  return out


def _power_law_fits(d: np.ndarray, tv: np.ndarray, disagreement: np.ndarray, tv_floor: float) -> dict:
  """The least-squares fit and envelope of mean TV by depth d (depths 1..R-1), and the envelope of greedy
  disagreement, each over the depths above `tv_floor` (None where fewer than two remain)."""
  fits = {"least_squares": None, "envelope": None, "disagreement_envelope": None}
  for name, y, env in (
      ("least_squares", tv, False),
      ("envelope", tv, True),
      ("disagreement_envelope", disagreement, True),
  ):
    keep = y > tv_floor
    try:
      beta, alpha = theory.fit_power_law(d[keep], y[keep], envelope=env)
      fits[name] = {"beta": beta, "alpha": alpha, **theory.power_law_fit_quality(d[keep], y[keep], beta, alpha)}
    except ValueError:
      pass
  return fits


def _theorem2(r: int, tv: np.ndarray, env: dict, ls: Optional[dict], include_single: bool) -> dict:
  """Theorem 2 from the TV envelope `env` (beta, alpha): the continuous optimum, the best feasible pairs, and
  every feasible pair's cost bound and predicted gamma (the guaranteed R / J, and point estimates from the
  measured curve `tv` [R] and from the least-squares fit `ls`)."""
  beta, alpha = env["beta"], env["alpha"]
  d1s, d2s = theory.optimal_depths(r, beta, alpha)
  two = theory.best_feasible_depths(r, beta, alpha) if theory.feasible_configs(r) else None
  best = theory.best_feasible_depths(r, beta, alpha, include_single=include_single)
  feas = theory.feasible_configs(r, include_single=True)
  out = {
      "optimal_continuous": [d1s, d2s],
      "best_feasible_two_proposal": None if two is None else list(two),
      "best_feasible": list(best),
      "include_single": include_single,
      "predicted_gamma_bound": theory.predicted_gamma_bound(r, best[0], best[1], beta, alpha),
      "cost_bound": {f"{c[0]},{c[1]}": theory.cost_bound(r, c[0], c[1], beta, alpha) for c in feas},
  }
  # The guaranteed R / J, and the cost identity at P(reject x1) = E[TV_d1], P(restart) = E[TV_d2] of the curve.
  out["gamma_bound"] = {f"{a},{b}": r / out["cost_bound"][f"{a},{b}"] for a, b in feas}
  p = lambda d: min(float(tv[d - 1]), 1.0)
  out["gamma_curve"] = {
      f"{a},{b}": theory.expected_gamma(r, a, b, p(a), None if b is None else min(p(b), p(a))) for a, b in feas
  }
  if ls is not None:
    out["gamma_fit"] = {f"{a},{b}": theory.curve_gamma(r, a, b, ls["beta"], ls["alpha"]) for a, b in feas}
  return out


def ratio_standard_error(sums: Sequence[Sequence[float]], counts: Sequence[int]) -> np.ndarray:
  """Standard error of the pooled rate sum(x_i) / sum(n_i) across prompts i (a ratio estimator, clustered by prompt).

  x_i are one prompt's per-depth sums and n_i its positions. Positions along one text are correlated, so the
  binomial sqrt(p (1 - p) / n) understates the error; this treats prompts as the independent units:
  se = sqrt(k / (k - 1) * sum_i (x_i - m n_i)^2) / sum_i n_i with m the pooled rate and k prompts (0 for k < 2).
  """
  x = np.asarray(sums, np.float64)
  n = np.asarray(counts, np.float64)
  k = len(n)
  if k < 2 or n.sum() <= 0:
    return np.zeros(x.shape[1:] if x.ndim > 1 else ())
  m = x.sum(0) / n.sum()
  resid = x - m * n.reshape((-1,) + (1,) * (x.ndim - 1))
  return np.sqrt(k / (k - 1) * np.sum(resid**2, axis=0)) / n.sum()


# ----------------------------------------------------------------------------------------------------------
# Cost identity and chain helpers for sweep rows
# ----------------------------------------------------------------------------------------------------------
def predicted_loopspec(recurrence: int, d1: int, d2: Optional[int], n: int, reject_first: int, restart: int) -> dict:
  """C and gamma = R / C predicted by the cost identity from measured rates (counts / N commits)."""
  p1 = reject_first / n
  pr = restart / n
  c = theory.expected_cost(recurrence, d1, d2, min(p1, 1.0), None if d2 is None else min(pr, 1.0))
  return {"p_reject_first": p1, "p_restart": pr, "predicted_cost": c, "predicted_gamma": recurrence / c}


def fit_chain_acceptance(draft_lens: Iterable[int], tokens_per_round: Iterable[float]) -> float:
  """One i.i.d. acceptance rate a fitted (least squares, grid + refinement) to the measured tokens per
  verify pass of chain rows with several draft lengths, using (1 - a^(g+1)) / (1 - a)."""
  g = np.asarray(list(draft_lens), float)
  y = np.asarray(list(tokens_per_round), float)
  if g.size == 0:
    raise ValueError("no chain rows")
  lo, hi = 0.0, 1.0
  for _ in range(4):
    grid = np.linspace(lo, hi, 201)
    err = [np.sum((theory.chain_expected_tokens(a, g) - y) ** 2) for a in grid]
    best = grid[int(np.argmin(err))]
    step = (hi - lo) / 200
    lo, hi = max(0.0, best - step), min(1.0, best + step)
  return float(best)


def implied_chain_acceptance(draft_len: int, tokens_per_round: float) -> float:
  """The a with (1 - a^(g+1)) / (1 - a) equal to the measured tokens per round (bisection; clipped)."""
  return fit_chain_acceptance([draft_len], [tokens_per_round])


# ----------------------------------------------------------------------------------------------------------
# Greedy replay: the commits greedy LoopSpec and chain make, from the per-depth agreement along AR's text
# ----------------------------------------------------------------------------------------------------------
def greedy_agreement(model, prompt: Sequence[int], generated: Sequence[int]) -> np.ndarray:
  """bool [R, n]: whether argmax p_r equals argmax p_R at the position that predicts generated token i.

  Along the greedy AR continuation, greedy LoopSpec proposes argmax p_d1 (and argmax p_d2) of exactly these
  readouts (a lane at depth k attends to its ancestors' keys and values at depth k, as the full-sequence
  forward does), so these bits determine every commit's source; see replay_loopspec_counts.
  """
  return depth_metrics(model, prompt, generated, {"temperature": 0.0})["agree"] > 0.5


def replay_loopspec_counts(agree: np.ndarray, d1: int, d2: Optional[int]) -> Dict[str, int]:
  """Commit sources of greedy LoopSpec at (d1, d2) from `greedy_agreement` bits: a token is a first-proposal
  commit where depth d1 agrees with depth R, else a second-proposal commit where d2 agrees (the gate is open
  there, since argmax p_d2 = argmax p_R differs from the rejected argmax p_d1), else a restart.

  Assumes every spawn is granted (no skipped spawns at the lane capacity); then reject_first = second + restart.
  """
  a = np.asarray(agree, bool)
  first = a[d1 - 1]
  second = np.zeros_like(first) if d2 is None else (~first & a[d2 - 1])
  n = int(first.size)
  c = {"first": int(first.sum()), "second": int(second.sum())}
  c["restart"] = n - c["first"] - c["second"]
  c["n"] = n
  c["reject_first"] = n - c["first"]
  return c


def replay_chain_counts(agree: np.ndarray, d1: int, draft_len: int) -> Dict[str, int]:
  """Rounds and accepted drafts of greedy chain self-speculation (draft depth d1, `draft_len` drafts per round)
  from `greedy_agreement` bits: a round at committed length i accepts drafts while depth d1 agrees and commits
  them plus one token, cut at the budget (a draft counts as accepted only if it is committed)."""
  match = np.asarray(agree, bool)[d1 - 1]
  n = int(match.size)
  i = accepted = rounds = 0
  while i < n:
    k = 0
    while k < draft_len and i + k < n and match[i + k]:
      k += 1
    rounds += 1
    accepted += k
    i += min(k + 1, n - i)
  return {"n": n, "rounds": rounds, "accepted": accepted}
