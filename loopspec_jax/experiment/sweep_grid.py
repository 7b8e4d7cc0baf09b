"""What a sweep covers, and the files it reads beside its own rows.

The grid (`method_specs`: the LoopSpec (d1, d2) pairs, chain at one draft depth, the draft model and prompt
lookup, as `loopspec_jax.methods` objects), each row's label and grid coordinates, and the inputs every table
is recomputed from rather than stored: the depth analysis's summary (`load_depth_summary`, from
loopspec-measure-depths), Theorem 2's prediction from it (`load_prediction`) and the accelerator projection
(`load_projection`, written by `sweep.project_costs`). Shared by the engine sweep (sweep.py), the greedy replay
(sweep_replay.py) and the tables (sweep_report.py).
"""

from __future__ import annotations

import json
import os
from typing import List, Optional, Tuple

from absl import logging

from loopspec_jax import methods
from loopspec_jax.analysis import theory
from loopspec_jax.decoding.tree import head_method
from loopspec_jax.experiment import settings


def ints(text) -> List[int]:
  """'1,2,4' -> [1, 2, 4]."""
  return [int(x) for x in settings.split_list(text)]


def gammas(text) -> list:
  """'4,auto' -> [4, 'auto'] (draft lengths of the draft-model and lookup rows)."""
  return [g if g == "auto" else int(g) for g in settings.split_list(text)]


def loopspec_grid(cfg, r: int) -> List[Tuple[int, Optional[int]]]:
  """The (d1, d2) pairs to sweep: an explicit 'd1,d2;...' list, or the feasible grid restricted by d1s/d2s."""
  if cfg.get("configs"):
    out = []
    feasible = set(theory.feasible_configs(r, include_single=True))
    for item in str(cfg.configs).split(";"):
      a, b = (x.strip() for x in item.split(","))
      pair = (int(a), settings.parse_optional_int(b))
      if pair not in feasible:
        raise ValueError(f"configuration {pair} is not feasible for R={r}")
      out.append(pair)
    return out
  d1s, d2s = set(ints(cfg.get("d1s", ""))), set(ints(cfg.get("d2s", "")))
  out = []
  for d1, d2 in theory.feasible_configs(r, include_single=cfg.include_single):
    if d1s and d1 not in d1s:
      continue
    if d2s and d2 is not None and d2 not in d2s:
      continue
    out.append((d1, d2))
  return out


def method_specs(cfg, r: int, drafter=None) -> List[methods.Method]:
  """The method of every row but AR: the LoopSpec grid (at the config's `lane_capacity`), chain, the draft
  model, prompt lookup and the config's `extra_methods` (';'-separated specs: tree, lookahead, medusa, eagle,
  mtp, ...).

  A draft row's `Method` holds `drafter` (the loaded draft model; None where only labels or grid
  coordinates are needed, e.g. the projection); its label names the drafter by the config's `draft_model`."""
  cap = cfg.get("lane_capacity") or None
  specs = [methods.LoopSpec(d1=d1, d2=d2, lane_capacity=cap) for d1, d2 in loopspec_grid(cfg, r)]
  if cfg.get("chain_d1"):
    specs += [methods.Chain(d1=int(cfg.chain_d1), gamma=g) for g in ints(cfg.chain_gammas)]
  if cfg.get("draft_model"):
    specs += [methods.Draft(draft_model=drafter, gamma=g) for g in gammas(cfg.draft_gammas)]
  if cfg.get("lookup_ngram"):
    specs += [methods.Lookup(ngram=int(cfg.lookup_ngram), gamma=g) for g in gammas(cfg.lookup_gammas)]
  if cfg.get("extra_methods"):  # any further rows by spec: the tree methods ('tree:...', 'lookahead:...')
    specs += methods.parse_list(cfg.extra_methods)
  return specs


def drafter_name(cfg, m: methods.Method) -> Optional[str]:
  """The config's name of the row's draft model (None for a method without one)."""
  return str(cfg.draft_model) if "draft_model" in m.positional else None


def row_label(m: methods.Method, drafter: Optional[str] = None) -> str:
  """A row's label and the method of its key: the method's positional arguments, None included, the draft
  model by its config name `drafter`: 'ar', 'loopspec(d1=2,d2=None)', 'draft(draft_model=tiny-raven-draft,
  gamma=4)'. Rows were keyed so before methods were objects (`Method.label` leaves out None and the drafter),
  and a resumed sweep finds the rows of results/ by these keys."""
  args = {k: (drafter if k == "draft_model" else getattr(m, k)) for k in m.positional}
  if "heads" in args:  # a head method: its head by name (a bundled head's, or its directory's basename)
    args["heads"] = os.path.basename(head_method.heads_name(args["heads"]) or "none")
  return m.name + ("(" + ",".join(f"{k}={v}" for k, v in args.items()) + ")" if args else "")


def grid_fields(m: methods.Method) -> dict:
  """The row's place in the grid: d1 (LoopSpec, chain), d2 (LoopSpec), draft_len (chain, draft, lookup)."""
  return {"d1": getattr(m, "d1", None), "d2": getattr(m, "d2", None), "draft_len": getattr(m, "gamma", None)}


def is_separate_drafter(method_name: str) -> bool:
  """Whether rows of this method draft from outside the target's depths (`Method.separate_drafter`)."""
  return methods.method_class(method_name).separate_drafter


# ----------------------------------------------------------------------------------------------------------
# The files read beside the rows
# ----------------------------------------------------------------------------------------------------------
def load_depth_summary(cfg, task: str, samp: str, r: int) -> Optional[dict]:
  """The depth-analysis JSON of this (task, sampling) (`depths_json` pattern), or None if absent / other R."""
  pattern = cfg.get("depths_json") or ""
  if not pattern:
    return None
  path = pattern.format(task=task, sampling=samp)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    s = json.load(f)
  if s.get("recurrence") != r:
    logging.warning("%s has R=%s, not %d: ignored", path, s.get("recurrence"), r)
    return None
  s["path"] = path
  return s


def load_prediction(cfg, task: str, samp: str, r: int) -> Optional[dict]:
  """Theorem 2's prediction from the depth JSON of this (task, sampling), or None."""
  s = load_depth_summary(cfg, task, samp, r)
  env = None if s is None else (s.get("fits") or {}).get("envelope")
  if not env or env["alpha"] <= 0:
    return None
  path = s["path"]
  beta, alpha = env["beta"], env["alpha"]
  swept = loopspec_grid(cfg, r)
  best = theory.best_feasible_depths(r, beta, alpha, include_single=cfg.include_single)
  tie = lambda p: (p[0], r if p[1] is None else p[1])
  best_swept = min(swept, key=lambda p: (theory.cost_bound(r, p[0], p[1], beta, alpha),) + tie(p)) if swept else None
  out = {
      "path": path,
      "beta": beta,
      "alpha": alpha,
      "optimal_continuous": list(theory.optimal_depths(r, beta, alpha)),
      "best_feasible": list(best),
      "best_swept": list(best_swept) if best_swept else None,
      "best_feasible_two_proposal": (s.get("theorem2") or {}).get("best_feasible_two_proposal"),
  }
  ls = s["fits"].get("least_squares")
  if ls:  # the pair the fitted curve's point estimate of gamma prefers (not Theorem 2's bound)
    feas = theory.feasible_configs(r, include_single=cfg.include_single)
    key = lambda p: (-theory.curve_gamma(r, p[0], p[1], ls["beta"], ls["alpha"]),) + tie(p)
    out["best_fit"] = list(min(feas, key=key))
  return out


def projection_path(cfg) -> str:
  return cfg.get("projection_json") or os.path.join(cfg.out_dir, "projection.json")


def load_projection(cfg) -> Optional[dict]:
  """projection.json of `sweep.project_costs` (roofline seconds per loop iteration at a real shape), or None."""
  path = projection_path(cfg)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)
