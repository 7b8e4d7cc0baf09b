"""Draft heads as artefacts, like models: parameters saved with orbax, a `heads_config.json` that says what
kind of head it is, its own hyper-parameters and the target it was trained for, and a model card.

A head reads the target's hidden features and drafts with the target's vocabulary, so it is bound to one
target: `check_target` refuses (ValueError naming the mismatch, before anything compiles) a head trained
for another family, hidden size, vocabulary, recurrence or tokenizer.

Layout of a head directory:
    heads_config.json   {"kind": "medusa" | "eagle" | ..., "config": {...}, "target": {...}}
    params/             orbax StandardCheckpointer tree of the head's parameters
    MODEL_CARD.md       training command, data, steps, wall time, held-out accuracy
Bundled heads live under `loopspec_jax/assets/heads/<name>/` and load by name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from typing import Any, Callable, Optional

import orbax.checkpoint as ocp

HEADS_CONFIG = "heads_config.json"
ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "heads")


@dataclasses.dataclass(frozen=True)
class Heads:
  """A loaded head artefact: `kind` ('medusa', 'eagle', ...), its `params` pytree, its hyper-parameters
  `config` (a plain dict, the kind's own fields) and the `target` signature it was trained for."""

  kind: str
  params: Any
  config: dict
  target: dict
  source: Optional[str] = None


def tokenizer_digest(tokenizer) -> Optional[str]:
  """sha256 of a tokenizers.Tokenizer's JSON (vocabulary, merges, normalisation), or None without one."""
  if tokenizer is None:
    return None
  return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def target_signature(model) -> dict:
  """What a head must match in its target `LoopedModel`."""
  cfg = model.config
  return {
      "family": cfg.family,
      "hidden_size": int(cfg.hidden_size),
      "vocab_size": int(cfg.vocab_size),
      "recurrence": int(cfg.recurrence),
      "tokenizer_sha256": tokenizer_digest(model.tokenizer),
  }


def check_target(heads: Heads, model) -> None:
  """ValueError naming every field where `heads` was trained for another target than `model`."""
  if not isinstance(heads, Heads):
    raise ValueError(f"heads must be a loaded head artefact (lj.load_heads(...)), got {type(heads).__name__}")
  want = target_signature(model)
  bad = [f"{k}: head {heads.target.get(k)!r}, model {v!r}" for k, v in want.items() if heads.target.get(k) != v]
  if bad:
    where = heads.source or heads.kind
    raise ValueError(f"the {heads.kind} head {where} was trained for another target ({'; '.join(bad)})")


def save(path: str, heads: Heads, card: Optional[str] = None) -> None:
  """Writes `heads` under `path` (params with orbax, heads_config.json, MODEL_CARD.md if `card`)."""
  path = os.path.abspath(path)
  os.makedirs(path, exist_ok=True)
  target = os.path.join(path, "params")
  if os.path.exists(target):
    shutil.rmtree(target)
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(target, heads.params)
  ckpt.wait_until_finished()
  with open(os.path.join(path, HEADS_CONFIG), "w") as f:
    json.dump({"kind": heads.kind, "config": heads.config, "target": heads.target}, f, indent=1, sort_keys=True)
  if card is not None:
    with open(os.path.join(path, "MODEL_CARD.md"), "w") as f:
      f.write(card)


def bundled_heads() -> list:
  """Names of the heads shipped inside the package (loadable with `load(name)`)."""
  if not os.path.isdir(ASSETS):
    return []
  return sorted(d for d in os.listdir(ASSETS) if os.path.exists(os.path.join(ASSETS, d, HEADS_CONFIG)))


# kind -> fn(config dict) -> abstract params pytree (jax.ShapeDtypeStruct leaves); each head module registers
ABSTRACT_PARAMS: dict = {}


def register(kind: str, abstract_params: Callable[[dict], Any]) -> None:
  """Declares a head kind: `abstract_params(config)` gives the shapes `load` restores into."""
  ABSTRACT_PARAMS[kind] = abstract_params


def load(path: str) -> Heads:
  """A head artefact from a directory or a bundled name; its kind must be registered (import its module)."""
  if not os.path.isdir(path) and path in bundled_heads():
    path = os.path.join(ASSETS, path)
  meta_path = os.path.join(path, HEADS_CONFIG)
  if not os.path.exists(meta_path):
    raise FileNotFoundError(f"no head directory or bundled head named {path!r} (bundled: {bundled_heads()})")
  with open(meta_path) as f:
    meta = json.load(f)
  kind = meta["kind"]
  if kind not in ABSTRACT_PARAMS:
    raise ValueError(f"{path} holds a {kind!r} head; known kinds: {sorted(ABSTRACT_PARAMS)}")
  abstract = ABSTRACT_PARAMS[kind](meta["config"])
  params = ocp.StandardCheckpointer().restore(os.path.abspath(os.path.join(path, "params")), abstract)
  return Heads(kind, params, meta["config"], meta["target"], source=os.path.abspath(path))
