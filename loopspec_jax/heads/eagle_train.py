"""Training an EAGLE head on a frozen target (`loopspec-train --config=train/tiny_raven_eagle.py`).

The resumable counterpart of experiments/train_eagle.py (which records a feature bank once and samples crops
from it, the bundled head's recipe): here batch k is the target corpus's `data.batch_at(corpus, k)` (the
head trainers' shared data and checkpoints, `head_train.py`), the frozen target's features of the batch are
computed per step (full depth R, stop_gradient) and the feature noise is keyed by (seed, k), so a run stopped
after N steps and restarted from its orbax checkpoint ends where one uninterrupted run ends. The loss is the
head's own (`eagle.loss`: SmoothL1 on the next feature + 0.1 x cross-entropy against the target's
distribution, unrolled `config.unroll` steps). `export` saves the artefact with a model card holding held-out
top-1 accuracy per draft level.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.heads import artefact
from loopspec_jax.heads import eagle as E
from loopspec_jax.heads import head_train

CHECK_WINDOWS = 2  # the first held-out windows, whose figures a test can recompute


def features(tparams, tokens, config: dict, cfg):
  """(raw feature [B, T, F] the head reads, final hidden [B, T, E]) of the frozen target over tokens."""
  tparams = jax.lax.stop_gradient(tparams)
  lengths = jnp.full((tokens.shape[0],), tokens.shape[1], jnp.int32)
  hidden, states = E.target_features(tparams, tokens, lengths, cfg, tuple(config["depths"]))
  return jax.lax.stop_gradient(E.raw_feature(config, hidden, states)), jax.lax.stop_gradient(hidden)


def make_step(cfg, opt, config: dict):
  def step(state, tparams, tokens, key):
    raw, hidden = features(tparams, tokens, config, cfg)
    n = jnp.full((tokens.shape[0],), tokens.shape[1], jnp.int32)
    grad_fn = jax.value_and_grad(E.loss, has_aux=True)
    (l, m), g = grad_fn(state["params"], tparams, config, tokens, raw, hidden, n, key, cfg)
    upd, opt_state = opt.update(g, state["opt_state"], state["params"])
    params = jax.tree_util.tree_map(lambda p, u: p + u, state["params"], upd)
    return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, dict(m, loss=l)

  return jax.jit(step, donate_argnums=(0,))


class EagleTrainer(head_train.HeadTrainer):
  """An EAGLE head training run described by a configs/train/*_eagle.py ConfigDict; resumes from workdir."""

  def __init__(self, config, workdir: Optional[str] = None, model=None, corpus=None):
    super().__init__(config, workdir, model, corpus)
    c = self.config
    depths = tuple(c.depths) if c.get("depths") else None
    self.head_config = E.head_config(self.cfg, c.feature, depths, noise=float(c.noise), unroll=int(c.unroll))
    self.step_fn = make_step(self.cfg, self.opt, self.head_config)

  def init_state(self):
    hp = E.init_params(self.head_config, jax.random.PRNGKey(int(self.config.seed)))
    return {"params": hp, "opt_state": self.opt.init(hp), "step": jnp.int32(0)}

  def update(self, state, step: int):
    return self.step_fn(state, self.model.params, jnp.asarray(self.batch(step)), self.step_key(step))

  def heads(self, state) -> artefact.Heads:
    hp = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), jax.device_get(state["params"]))
    return artefact.Heads(E.KIND, hp, self.head_config, artefact.target_signature(self.model))

  def level_accuracy(self, heads: artefact.Heads, windows) -> list:
    """Held-out top-1 accuracy per draft level 1..config.levels (`eagle.level_accuracy`), window by window."""
    cfg, config, levels = self.cfg, heads.config, int(self.config.levels)
    n_of = lambda t: jnp.full((t.shape[0],), t.shape[1], jnp.int32)
    fn = jax.jit(lambda hp, t, r, h: E.level_accuracy(hp, self.model.params, config, t, r, h, n_of(t), levels, cfg))
    hits, counts = 0, 0
    for w in np.asarray(windows):
      tok = jnp.asarray(w[None])
      raw, hidden = features(self.model.params, tok, config, cfg)
      a, c = fn(heads.params, tok, raw, hidden)
      hits, counts = hits + np.asarray(a), counts + np.asarray(c)
    return (hits / np.maximum(counts, 1)).tolist()

  def export(self, state, out_dir: str, command: str = "", seconds: Optional[float] = None) -> dict:
    c = self.config
    h = self.heads(state)
    w = head_train.heldout_windows(self.model, c.seq_len, c.card_eval_windows)
    ev = {"windows": int(len(w)), "seq_len": int(c.seq_len), "level_top1": self.level_accuracy(h, w)}
    ev.update(check_windows=CHECK_WINDOWS, check_top1=self.level_accuracy(h, w[:CHECK_WINDOWS]))
    ev.update(steps=int(state["step"]), train_seconds=seconds)
    artefact.save(out_dir, h, card=model_card(c, self.cfg, h.config, ev, command))
    with open(os.path.join(out_dir, "eval.json"), "w") as f:
      json.dump(ev, f, indent=1)
    return ev


def model_card(c, cfg, config: dict, ev: dict, command: str) -> str:
  feature = config["feature"] + (f" (depths {config['depths']})" if config["depths"] else " (post-coda final state)")
  rows = "\n".join(f"| {k + 1} | {a:.2%} |" for k, a in enumerate(ev["level_top1"]))
  wall = f", {ev['train_seconds'] / 60:.1f} min wall" if ev.get("train_seconds") else ""
  return f"""# {c.name}

An EAGLE head (loopspec_jax/heads/eagle.py) for `{c.target}` ({cfg.family}, hidden {cfg.hidden_size}, vocab
{cfg.vocab_size}, R = {cfg.recurrence}), feature {feature}. Trained by `loopspec-train` (loopspec_jax/heads/
eagle_train.py): the target's own corpus, batch k = data.batch_at(corpus, k, seed {c.seed}), {ev["steps"]} steps
x batch {c.batch_size} x {c.seq_len + 1} tokens, AdamW lr {c.lr}, noise {config["noise"]}, unroll
{config["unroll"]}{wall}. Command: `{command}`.

## Held-out top-1 accuracy per draft level
{ev["windows"]} held-out Shakespeare windows of {ev["seq_len"] + 1} tokens:

| level | top-1 |
|---|---|
{rows}

First {ev["check_windows"]} windows: {", ".join(f"{a:.4%}" for a in ev["check_top1"])}.
"""
