"""Medusa-1 heads (Cai et al., 2024) on a frozen looped target: parameters, forward, loss, features, artefact.

k heads read the target's final feature h_t at position t: the vector its LM head multiplies (post-coda and
post final norm for Raven / Huginn, `looped.readout_features`; Ouro: the final normed state), at full depth
R. The LM head itself predicts token t + 1 from h_t; head i (0-based) predicts token t + i + 2. Each head is a
residual SiLU block and a vocabulary projection:

    z_i = h + silu(h @ W_i + b_i),    logits_i = z_i @ P_i,

with W_i, b_i zero-initialised (so z_i = h) and P_i initialised from the target's LM head (`init_params`), as
in FasterDecoding/Medusa. Training (`loss`): the sum over heads of the mean cross-entropy of head i against
the token i + 2 ahead, on the target's own corpus, the backbone frozen (its features are computed once per
batch, under stop_gradient, by `features`).

Artefact config (heads_config.json "config"): {"num_heads": k, "hidden_size": E, "vocab_size": V}.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loopspec_jax.config import ModelConfig
from loopspec_jax.heads import artefact
from loopspec_jax.models import layers
from loopspec_jax.models import looped as M

KIND = "medusa"


def config_of(cfg: ModelConfig, num_heads: int) -> dict:
  return {"num_heads": int(num_heads), "hidden_size": int(cfg.hidden_size), "vocab_size": int(cfg.vocab_size)}


def abstract_params(config: dict):
  """ShapeDtypeStructs of a Medusa head stack: {"w": [k, E, E], "b": [k, E], "proj": [k, E, V]} float32."""
  k, e, v = int(config["num_heads"]), int(config["hidden_size"]), int(config["vocab_size"])
  f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  return {"w": f(k, e, e), "b": f(k, e), "proj": f(k, e, v)}


artefact.register(KIND, abstract_params)


def init_params(target_params, cfg: ModelConfig, num_heads: int, key=None, scale: float = 0.0):
  """Medusa's initialisation: W = 0, b = 0, every projection a copy of the target's LM head. `scale` > 0
  (with `key`) draws W ~ N(0, scale^2 / E) and perturbs the projections by N(0, scale^2 / E): a randomly
  initialised head for tests whose drafts are neither trivial nor all equal."""
  e = cfg.hidden_size
  head = jnp.asarray(M.head_matrix(target_params, cfg), jnp.float32)
  w = jnp.zeros((num_heads, e, e), jnp.float32)
  proj = jnp.broadcast_to(head, (num_heads,) + head.shape)
  if scale:
    kw, kp = jax.random.split(key)
    w = scale * jax.random.normal(kw, w.shape) / np.sqrt(e)
    proj = proj + scale * jax.random.normal(kp, proj.shape) / np.sqrt(e)
  return {"w": w, "b": jnp.zeros((num_heads, e), jnp.float32), "proj": jnp.asarray(proj)}


def make_heads(model, num_heads: int, key=None, scale: float = 0.0) -> artefact.Heads:
  """A `Heads` artefact for `model` (initialised by `init_params`), bound to the model's signature."""
  params = init_params(model.params, model.config, num_heads, key, scale)
  return artefact.Heads(KIND, params, config_of(model.config, num_heads), artefact.target_signature(model))


def head_logits(hp, feature):
  """float32 logits [..., k, V] of every head from final features [..., E]."""
  x = feature.astype(jnp.float32)
  z = x[..., None, :] + jax.nn.silu(jnp.einsum("...e,kef->...kf", x, hp["w"]) + hp["b"])
  return jnp.einsum("...ke,kev->...kv", z, hp["proj"])


def features(params, tokens, cfg: ModelConfig):
  """Final features [B, T, E] at depth R of a full-sequence forward of tokens [B, T] (zero initial state, the
  decoders' default), under stop_gradient: the frozen backbone."""
  params = jax.lax.stop_gradient(params)
  b, t = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = M.causal_mask(jnp.full((b,), t, jnp.int32), t)
  none = layers.no_context
  e, _, _ = M.pre(params, tokens, pos, mask, none, cfg)
  step = lambda _, s: M.core_step(params, s, e, pos, mask, none, cfg)[0]
  s = jax.lax.fori_loop(0, cfg.recurrence, step, M.initial_state(e, cfg))
  x, _, _ = M.readout_features(params, s, pos, mask, none, cfg)
  return jax.lax.stop_gradient(x.astype(jnp.float32))


def per_head_xent(hp, feats, tokens):
  """Mean cross-entropy [k] of head i at positions t = 0..T-i-3 against tokens[t + i + 2]. feats [B, T, E]
  are the features of tokens [B, T]."""
  logits = head_logits(hp, feats)  # [B, T, k, V]
  k, t = logits.shape[2], tokens.shape[1]
  out = []
  for i in range(k):
    n = t - i - 2
    lg, tg = logits[:, :n, i], tokens[:, i + 2 :]
    out.append(jnp.mean(optax.softmax_cross_entropy_with_integer_labels(lg, tg)))
  return jnp.stack(out)


def loss(hp, feats, tokens):
  """Medusa-1's training loss: the sum of the per-head cross-entropies (`per_head_xent`)."""
  xent = per_head_xent(hp, feats, tokens)
  return jnp.sum(xent), xent


def top1_hits(hp, feats, tokens):
  """(hits [k], counts [k]): positions where head i's argmax equals tokens[t + i + 2]."""
  pred = jnp.argmax(head_logits(hp, feats), axis=-1)  # [B, T, k]
  k, t = pred.shape[2], tokens.shape[1]
  hits = [jnp.sum(pred[:, : t - i - 2, i] == tokens[:, i + 2 :]) for i in range(k)]
  return jnp.stack(hits), jnp.asarray([tokens.shape[0] * (t - i - 2) for i in range(k)])


_features = jax.jit(features, static_argnames=("cfg",))
_top1 = jax.jit(top1_hits)


def heldout_accuracy(heads: artefact.Heads, model, windows) -> list:
  """Per-head top-1 accuracy on token windows [n, T] (each window's own features, one at a time), and the
  LM head's next-token accuracy first: [lm, head 0, ..., head k-1]."""
  hits, counts = 0, 0
  for w in np.asarray(windows):
    toks = jnp.asarray(w[None])
    f = _features(model.params, toks, model.config)
    h, c = _top1(heads.params, f, toks)
    lm = jnp.argmax(M.lm_head(model.params, f, model.config), axis=-1)[:, :-1] == toks[:, 1:]
    hits = hits + np.concatenate([[int(jnp.sum(lm))], np.asarray(h)])
    counts = counts + np.concatenate([[toks.shape[1] - 1], np.asarray(c)])
  return (np.asarray(hits) / np.asarray(counts)).tolist()
