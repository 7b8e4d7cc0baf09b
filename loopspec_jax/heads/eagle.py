"""EAGLE draft head on a looped target (Li et al., 2024; SafeAILab/EAGLE): parameters, forward, losses.

The head reads a feature g_j of the frozen target at position j and the embedding of the next token x_{j+1}:
    h_{j+1} = Block(fc([embed(x_{j+1}); g_j]))        (fc: 2E -> E, one transformer block of the target's own
    logits  = lm_head(final_norm(h_{j+1}))             block code, its own key/value cache over positions)
and h_{j+1} predicts the target's final hidden state f_{j+1} (the coda's output before the final norm), so
the target's frozen final norm and LM head read it out and it can be fed back as the next level's feature.

Two feature choices (`config["feature"]`):
- 'final': g_j = f_j, the post-coda final state (EAGLE-1);
- 'fused': g_j = fuse([s_{d_1}; s_{d_2}; s_{d_3}]_j), the recurrent states at three depths (default 2, R/2, R)
  fused by fc(3E -> E) (EAGLE-3 style); the drafted levels after the first feed back h as g.
Both features come out of the verify pass for free (its nodes run all R steps), so drafting costs no core
steps: each level is one transformer block (half a tiny-raven core step: n_core = 2 blocks) plus the LM head.

Training (`loss`): SmoothL1 on the next feature (weight 1.0) plus cross-entropy against the target's
distribution at the next position (weight 0.1), teacher features perturbed by uniform noise as EAGLE does;
`unroll` > 1 also trains the head on its own fed-back features (EAGLE-3's training-time test), step k of row j
attending to the teacher entries at positions <= j and to its own chain, exactly what a drafted level sees.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.heads import artefact
from loopspec_jax.models import layers
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import heads as layout

KIND = "eagle"
FEATURES = ("final", "fused")


def head_config(cfg: ModelConfig, feature: str = "final", depths=None, noise: float = 0.2, unroll: int = 2) -> dict:
  """The head's hyper-parameters (a plain dict, saved in heads_config.json) for target config `cfg`."""
  if feature not in FEATURES:
    raise ValueError(f"EAGLE feature must be one of {FEATURES}, got {feature!r}")
  r = cfg.recurrence
  depths = tuple(depths) if depths is not None else (min(2, r), max(r // 2, 1), r)
  if feature == "fused" and (len(depths) != 3 or not all(1 <= d <= r for d in depths)):
    raise ValueError(f"the fused EAGLE feature reads three depths in [1, {r}], got {depths}")
  shapes = {k: list(v) for k, v in M.layer_shapes(cfg).items()}
  return {
      "feature": feature,
      "depths": list(depths) if feature == "fused" else [],
      "hidden_size": int(cfg.hidden_size),
      "layer_shapes": shapes,
      "noise": float(noise),
      "unroll": int(unroll),
  }


def param_shapes(config: dict) -> dict:
  e = config["hidden_size"]
  tree = {"fc": (2 * e, e), "fc_b": (e,), "layer": {k: tuple(v) for k, v in config["layer_shapes"].items()}}
  if config["feature"] == "fused":
    tree.update(fuse=(3 * e, e), fuse_b=(e,))
  return tree


def abstract_params(config: dict):
  is_shape = lambda x: isinstance(x, tuple) and all(isinstance(i, int) for i in x)
  return jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), param_shapes(config), is_leaf=is_shape)


artefact.register(KIND, abstract_params)


def init_params(config: dict, key):
  """Random head parameters: fc passes the feature half through (identity) plus a small random part, the
  fusion starts as the mean of the three states, the block like the target's own initialisation."""
  e = config["hidden_size"]
  k_fc, k_layer, k_fuse = jax.random.split(key, 3)
  fc = jax.random.normal(k_fc, (2 * e, e)) / math.sqrt(2 * e)
  fc = fc.at[e:].add(jnp.eye(e))
  layer = {}
  for i, (name, shape) in enumerate(sorted(config["layer_shapes"].items())):
    k = jax.random.fold_in(k_layer, i)
    if "norm" in name and "qk" not in name:
      layer[name] = jnp.ones(shape)
    elif name == "qk_bias":
      layer[name] = jnp.zeros(shape)
    else:
      layer[name] = jax.random.normal(k, shape) / math.sqrt(shape[-2]) * 0.5
  params = {"fc": fc, "fc_b": jnp.zeros((e,)), "layer": layer}
  if config["feature"] == "fused":
    eye = jnp.concatenate([jnp.eye(e)] * 3) / 3.0
    params["fuse"] = eye + 0.01 * jax.random.normal(k_fuse, (3 * e, e))
    params["fuse_b"] = jnp.zeros((e,))
  return params


def feature_width(config: dict) -> int:
  """Width of the raw feature the target provides per position: E ('final') or 3E ('fused')."""
  return config["hidden_size"] * (3 if config["feature"] == "fused" else 1)


# ---------------------------------------------------------------------------------------------------
# The target's features
# ---------------------------------------------------------------------------------------------------
def target_features(tparams, tokens, lengths, cfg: ModelConfig, depths=(), noise=None):
  """A full-sequence causal forward of the target: (final hidden [B, T, E], states [len(depths), B, T, E] at
  the recurrent depths `depths`). No cache."""
  b, t = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = M.causal_mask(lengths, t)
  none = layers.no_context
  e, _, _ = M.pre(tparams, tokens, pos, mask, none, cfg)
  s0 = M.initial_state(e, cfg, noise)

  def step(s, _):
    s, _, _ = M.core_step(tparams, s, e, pos, mask, none, cfg)
    return s, s

  _, states = jax.lax.scan(step, s0, None, length=cfg.recurrence)  # states[i] = s_{i+1}
  _, _, _, hidden = M.post_hidden(tparams, states[-1], pos, mask, none, cfg)
  picked = jnp.stack([states[d - 1] for d in depths]) if depths else jnp.zeros((0, b, t, cfg.hidden_size))
  return hidden, picked


def raw_feature(config: dict, hidden, states):
  """The per-position raw feature [.., F] a head of `config` reads, from (hidden, states at its depths)."""
  if config["feature"] == "final":
    return hidden
  return jnp.concatenate(list(states), axis=-1)


# ---------------------------------------------------------------------------------------------------
# The head
# ---------------------------------------------------------------------------------------------------
def first_feature(hp, config: dict, raw):
  """g_j from the raw feature [.., F] (the fusion for 'fused', as is for 'final')."""
  if config["feature"] == "fused":
    return raw @ hp["fuse"] + hp["fuse_b"]
  return raw


def step(hp, tparams, tokens, feature, pos, self_mask, ctx, cfg: ModelConfig):
  """One head application: h = Block(fc([embed(tokens); feature])). tokens [B, S], feature [B, S, E].
  Returns (h [B, S, E], k, v [B, S, KV, D] the head's cache entries at `pos`). The head's block keeps the
  target's trained head layout (`layout.base_config`) when the target is laid out for a mesh (padded / repeated
  attention heads): the head's parameters are replicated, never padded."""
  x = jnp.concatenate([M.embed(tparams, tokens, cfg), feature.astype(jnp.float32)], axis=-1)
  x = x @ hp["fc"] + hp["fc_b"]
  h, (k, v) = layers.block(hp["layer"], x, pos, self_mask, ctx, layout.base_config(cfg))
  return h, k, v


def unrolled(hp, tparams, config: dict, tokens, raw, lengths, levels: int, cfg: ModelConfig, key=None):
  """The head run `levels` steps deep at every row of a full sequence (training and evaluation).

  tokens [B, N] (a window), raw [B, N, F] the target's raw features. Step k (1-based) of row j reads
  embed(x_{j+k}) and (k = 1) the teacher feature g_j, noised when `key` is given, or (k > 1) its own step
  k - 1 output; it sits at position j + k - 1, attends to step 1's entries of rows <= j and to its own
  chain, and predicts f_{j+k}. Returns [h_k [B, N, E] for k = 1..levels] (row j valid iff j + k < length)."""
  b, n = tokens.shape
  if key is not None:
    raw = raw + (jax.random.uniform(key, raw.shape) - 0.5) * config["noise"]
  feat = first_feature(hp, config, raw)
  rows = jnp.arange(n)
  pad = lambda x, k: jnp.concatenate([x[:, k:], jnp.zeros_like(x[:, :k])], axis=1)  # x_{j+k} at row j
  eye = jnp.broadcast_to(jnp.eye(n, dtype=bool), (b, n, n))
  causal = jnp.broadcast_to(rows[None, :] <= rows[:, None], (b, n, n)) & (rows[None, None, :] < lengths[:, None, None])
  outs, chain = [], []
  for k in range(1, levels + 1):
    pos = jnp.broadcast_to(rows + k - 1, (b, n))
    if k == 1:
      h, k1, v1 = step(hp, tparams, pad(tokens, 1), feat, pos, causal, [], cfg)
      first = (k1.transpose(0, 2, 1, 3), v1.transpose(0, 2, 1, 3), causal)
    else:
      ctx = [first] + chain
      h, kk, vv = step(hp, tparams, pad(tokens, k), outs[-1], pos, eye, ctx, cfg)
      chain.append((kk.transpose(0, 2, 1, 3), vv.transpose(0, 2, 1, 3), eye))
    outs.append(h)
  return outs


def smooth_l1(x, y):
  d = jnp.abs(x - y)
  return jnp.mean(jnp.where(d < 1.0, 0.5 * d * d, d - 0.5), axis=-1)


def loss(hp, tparams, config: dict, tokens, raw, hidden, lengths, key, cfg: ModelConfig):
  """(loss, metrics): summed over the unroll steps, SmoothL1(h_k, f_{j+k}) + 0.1 * CE(target p_{j+k}, head)."""
  b, n = tokens.shape
  outs = unrolled(hp, tparams, config, tokens, raw, lengths, config["unroll"], cfg, key)
  total, metrics = 0.0, {}
  for k, h in enumerate(outs, start=1):
    target = jnp.concatenate([hidden[:, k:], jnp.zeros_like(hidden[:, :k])], axis=1)
    valid = (jnp.arange(n)[None, :] + k < lengths[:, None]).astype(jnp.float32)
    denom = jnp.maximum(valid.sum(), 1.0)
    p = jax.nn.softmax(jax.lax.stop_gradient(M.readout_logits(tparams, target, cfg)), axis=-1)
    logq = jax.nn.log_softmax(M.readout_logits(tparams, h, cfg), axis=-1)
    ce = -jnp.sum(p * logq, axis=-1)
    vl = jnp.sum(smooth_l1(h, jax.lax.stop_gradient(target)) * valid) / denom
    pl = jnp.sum(ce * valid) / denom
    acc = jnp.sum((jnp.argmax(logq, -1) == jnp.argmax(p, -1)) * valid) / denom
    total = total + vl + 0.1 * pl
    metrics.update({f"vloss{k}": vl, f"ploss{k}": pl, f"acc{k}": acc})
  return total, metrics


def level_accuracy(hp, tparams, config: dict, tokens, raw, hidden, lengths, levels: int, cfg: ModelConfig):
  """(matches [levels], counts [levels]): at draft level k, rows whose head argmax equals the target's argmax
  at position j + k (teacher-forced tokens, own fed-back features, no noise)."""
  n = tokens.shape[1]
  outs = unrolled(hp, tparams, config, tokens, raw, lengths, levels, cfg)
  hits, counts = [], []
  for k, h in enumerate(outs, start=1):
    target = jnp.concatenate([hidden[:, k:], jnp.zeros_like(hidden[:, :k])], axis=1)
    valid = jnp.arange(n)[None, :] + k < lengths[:, None]
    same = jnp.argmax(M.readout_logits(tparams, h, cfg), -1) == jnp.argmax(M.readout_logits(tparams, target, cfg), -1)
    hits.append(jnp.sum(same & valid))
    counts.append(jnp.sum(valid))
  return jnp.stack(hits), jnp.stack(counts)
