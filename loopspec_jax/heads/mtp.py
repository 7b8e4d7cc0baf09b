"""DeepSeek-V3-style multi-token prediction (MTP): one module that predicts the token after next.

At position i the target's final feature h_i (the coda's output before the final norm: what the LM head reads
after `final_norm`) and the embedding of the next token t_{i+1} (the target's own, shared, embedding) give

    h'_i = Block(W [RMSNorm(h_i); RMSNorm(emb(t_{i+1}))]),    logits_i = LM head(RMSNorm(h'_i))  ~ t_{i+2}

with the target's (shared) LM head. The model is trained from the start with this module (the trainer's
`mtp_weight`, loopspec_jax/train/trainer.py); at decode time the module drafts (`method="mtp"`).

One simplification against DeepSeek-V3 (ours, said here): the block's attention sees its own position only
(a diagonal mask), so drafting needs no second KV cache; the sequence context reaches the module through
h_i, which already attends to the whole prefix. With one key per query, attention reduces to v @ wo.

Parameters: {"norm_h": [E], "norm_e": [E], "proj": [2E, E], "block": one block of the target's family
(looped.layer_shapes), "norm_out": [E]}. The head config holds the target's model config (`model`) and the
training loss weight (`loss_weight`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loopspec_jax.config import ModelConfig, from_config_dict
from loopspec_jax.heads import artefact
from loopspec_jax.models import layers
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import heads as layout

KIND = "mtp"
FIRST_WINDOWS = 4  # eval.json also holds the figures of the first few held-out windows (tests reproduce them)


def param_shapes(cfg: ModelConfig) -> dict:
  e = cfg.hidden_size
  return {"norm_h": (e,), "norm_e": (e,), "proj": (2 * e, e), "block": M.layer_shapes(cfg), "norm_out": (e,)}


def init_params(cfg: ModelConfig, key) -> dict:
  """Norm weights 1, matrices N(0, 1/fan_in) (the block's own norms as looped.init_params sets them)."""
  shapes = param_shapes(cfg)
  leaves, treedef = jax.tree_util.tree_flatten(shapes, is_leaf=M._is_shape)
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(shapes, is_leaf=M._is_shape)[0]]
  out = []
  for path, shape, k in zip(paths, leaves, jax.random.split(key, len(leaves))):
    if "norm" in path and "qk" not in path:
      val = jnp.ones(shape, jnp.float32)
    elif "qk_bias" in path:
      val = jnp.zeros(shape, jnp.float32)
    else:
      val = jax.random.normal(k, shape, jnp.float32) / math.sqrt(shape[-2] if len(shape) >= 2 else shape[-1])
    out.append(val)
  return jax.tree_util.tree_unflatten(treedef, out)


def init_params_abstract(cfg: ModelConfig):
  return jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))


def head_config(cfg: ModelConfig, loss_weight: float) -> dict:
  return {"model": {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, "loss_weight": float(loss_weight)}


def _abstract(config: dict):
  return init_params_abstract(from_config_dict(config["model"]))


artefact.register(KIND, _abstract)


def make_heads(model, params, loss_weight: float) -> artefact.Heads:
  return artefact.Heads(KIND, params, head_config(model.config, loss_weight), artefact.target_signature(model))


def hidden(mp, target_params, feature, next_tokens, cfg: ModelConfig):
  """h' [B, S, E] from the target feature [B, S, E] and the next tokens [B, S] (positions independent)."""
  eps = cfg.norm_eps
  emb = M.embed(target_params, next_tokens, cfg).astype(feature.dtype)
  x = jnp.concatenate([layers.rms_norm(feature, mp["norm_h"], eps), layers.rms_norm(emb, mp["norm_e"], eps)], -1)
  x = x @ mp["proj"].astype(x.dtype)
  s = x.shape[1]
  own = jnp.broadcast_to(jnp.eye(s, dtype=bool), (x.shape[0], s, s))
  pos = jnp.zeros(x.shape[:2], jnp.int32)  # a diagonal mask: RoPE cancels, any position will do
  return layers.block(mp["block"], x, pos, own, [], layout.base_config(cfg))[0]  # unpadded: see eagle.step


def readout(mp, target_params, h, cfg: ModelConfig):
  """float32 logits of h' [B, S, E]: the module's norm and the target's LM head."""
  h = layers.rms_norm(h, mp["norm_out"], cfg.norm_eps)
  return jnp.einsum("...e,ev->...v", h, M.head_matrix(target_params, cfg), preferred_element_type=jnp.float32)


def logits(mp, target_params, feature, next_tokens, cfg: ModelConfig):
  """float32 [B, S, V] logits for the token after `next_tokens`, with the target's LM head."""
  return readout(mp, target_params, hidden(mp, target_params, feature, next_tokens, cfg), cfg)


def loss(mp, target_params, feature, tgt, cfg: ModelConfig):
  """Mean cross-entropy of t_{i+2} at positions i = 0..T-2 (feature [B, T, E] at the inputs, tgt [B, T] the
  next tokens) and the top-1 accuracy."""
  lg = logits(mp, target_params, feature[:, :-1], tgt[:, :-1], cfg)
  nll = optax.softmax_cross_entropy_with_integer_labels(lg, tgt[:, 1:])
  return jnp.mean(nll), jnp.mean(jnp.argmax(lg, -1) == tgt[:, 1:])


# ---------------------------------------------------------------------------------------------------
# Held-out evaluation and export (called by the trainer when it trained a module)
# ---------------------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("cfg",))
def _eval_batch(params, mp, w, cfg: ModelConfig):
  """Sums over one batch at depth R from a zero state: main nll, MTP nll, MTP top-1 against the data and
  against the main head's argmax at the next position (what a 1-token MTP draft needs to be accepted)."""
  none = layers.no_context
  inp, tgt = w[:, :-1], w[:, 1:]
  b, t = inp.shape
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = M.causal_mask(jnp.full((b,), t, jnp.int32), t)
  e = M.pre(params, inp, pos, mask, none, cfg)[0]
  step = lambda _, s: M.core_step(params, s, e, pos, mask, none, cfg)[0]
  s = jax.lax.fori_loop(0, cfg.recurrence, step, M.initial_state(e, cfg))
  f = M.coda_hidden(params, s, pos, mask, none, cfg)[0]
  main = M.readout_logits(params, f, cfg)
  lg = logits(mp, params, f[:, :-1], tgt[:, :-1], cfg)
  nll = lambda x, y: jnp.sum(optax.softmax_cross_entropy_with_integer_labels(x, y))
  top = jnp.argmax(lg, -1)
  return jnp.stack(
      [
          nll(main, tgt),
          nll(lg, tgt[:, 1:]),
          jnp.sum(top == tgt[:, 1:]),
          jnp.sum(top == jnp.argmax(main[:, 1:], -1)),
      ]
  )


def evaluate(params, mp, windows, cfg: ModelConfig, batch_size: int = 4) -> dict:
  """Held-out figures of a model and its MTP module over [n, T + 1] windows (see `_eval_batch`)."""
  tot = np.zeros(4)
  for i in range(0, len(windows), batch_size):
    tot += np.asarray(_eval_batch(params, mp, jnp.asarray(windows[i : i + batch_size]), cfg), np.float64)
  n, t = windows.shape[0], windows.shape[1] - 1
  return {
      "windows": int(n),
      "main_loss": tot[0] / (n * t),
      "mtp_loss": tot[1] / (n * (t - 1)),
      "mtp_top1": tot[2] / (n * (t - 1)),
      "mtp_agreement": tot[3] / (n * (t - 1)),
  }


def card(ev: dict, c, steps: int, command: str) -> str:
  """The MTP section of the model card (and the head artefact's card)."""
  return f"""
## MTP module (DeepSeek-V3 style; `loopspec_jax/heads/mtp.py`, bundled as head `{c.name}`)
h' = Block(W [RMSNorm(h); RMSNorm(emb(t+1))]), logits = LM head(RMSNorm(h')), with the model's embedding and LM
head; h is the coda output before the final norm at the training depth r; the block's attention sees its own
position only (no second KV cache when drafting). Trained jointly from step 0: loss = main + aux + lambda * MTP
cross-entropy of t+2, lambda = {c.mtp_weight} (DeepSeek-V3's early value), gradients into the backbone;
{steps} steps, command `{command}`.

Held-out Shakespeare ({ev["windows"]} windows of {c.seq_len}) at depth R = {c.model.recurrence}, zero initial state:

| figure | value |
|---|---|
| main head loss (nats/token) | {ev["main_loss"]:.4f} |
| MTP loss of t+2 (nats/token) | {ev["mtp_loss"]:.4f} |
| MTP top-1 accuracy against the data | {ev["mtp_top1"]:.2%} |
| MTP top-1 agreement with the main head's greedy t+2 | {ev["mtp_agreement"]:.2%} |
"""


def export(model, head_params, c, windows, steps: int, command: str) -> str:
  """Saves the head artefact to c.heads_export_dir (relative: from the checkout root) with its card; returns
  the card section (the trainer appends it to the model's card)."""
  ev = evaluate(model.params, head_params, windows, model.config)
  text = card(ev, c, steps, command)
  if c.get("heads_export_dir"):
    out = c.heads_export_dir
    if not os.path.isabs(out):
      out = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), out)
    artefact.save(out, make_heads(model, head_params, c.mtp_weight), card=f"# {c.name} (MTP head)\n" + text)
    first = evaluate(model.params, head_params, windows[:FIRST_WINDOWS], model.config)  # what a test reproduces
    with open(os.path.join(out, "eval.json"), "w") as f:
      json.dump(dict(ev, first_windows=first), f, indent=1)
  return text
