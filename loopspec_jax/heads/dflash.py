"""DFlash block drafter on a looped target (Chen et al. 2026, "DFlash: Block Diffusion for Flash Speculative
Decoding"; z-lab/dflash): parameters, context features, the one-pass block draft, and its training objective.

The drafter reads the frozen target's recurrent states at three depths (default d = 1, R/2, R: the looped
analogue of DFlash's target layers spread from shallow to deep; depth 1 carries the token-local signal, R/2
the half-refined one and R the state the coda reads out, and all three come out of the verify pass for free,
which runs every depth anyway), fused into one context feature per committed position:
    c_j = RMSNorm(fc([s_{d1}; s_{d2}; s_{d3}]_j))                  (fc: 3E -> E, no bias, as DFlash)
Each of its `layers` (1-2) transformer blocks (the target's own block code, its own weights) projects c_j with
its own key / value weights into a small KV cache over the committed positions (`context_kv`: the drafter's
cache, written once per committed position). A block draft is ONE forward pass over gamma + 1 positions
p0 .. p0 + gamma holding [embed(x_{p0}) (the last committed token, through the target's embedding), m x gamma]
(m a learned mask embedding): every position attends to the context entries of positions < p0 and,
bidirectionally, to the whole block; slot i >= 1 is read out by the target's LM head (after the drafter's
own output norm) as q_i, the drafter's distribution for x_{p0+i}. The slots do not see each other's drafts,
so drafting x_i ~ q_i independently is a valid chain proposal (q_i conditioned on x_<i is q_i itself).

Training (`loss`, DFlash's objective): random anchors a in every window, one block [x_a, m x gamma] per anchor
over the context c_{<a}; slot i is trained by cross-entropy against the frozen target's distribution at
position a + i (its next-token distribution after the true x_{<=a+i-1}), weighted by exp(-(i - 1) / decay):
early slots matter most, since a rejected slot i voids every later one. DFlash uses the ground-truth token of
target-generated text; distilling the target's distribution on the corpus is its expectation.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.heads import artefact
from loopspec_jax.heads import eagle
from loopspec_jax.models import kvcache
from loopspec_jax.models import layers
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import heads as layout

KIND = "dflash"


def default_depths(r: int) -> tuple:
  """d1, R/2, R (module docstring)."""
  return (1, max(r // 2, 1), r)


def head_config(cfg: ModelConfig, depths=None, n_layers: int = 2, gamma: int = 6, decay: float = 4.0) -> dict:
  """The drafter's hyper-parameters (a plain dict, saved in heads_config.json) for target config `cfg`.
  `gamma`: the block it is trained for (decoding may draft fewer); `decay`: the loss weight's decay."""
  r = cfg.recurrence
  depths = tuple(depths) if depths else default_depths(r)
  if not depths or not all(isinstance(d, int) and 1 <= d <= r for d in depths):
    raise ValueError(f"the DFlash drafter reads depths in [1, {r}], got {depths}")
  if not 1 <= int(n_layers) <= 4:
    raise ValueError(f"the DFlash drafter has 1 to 4 layers, got {n_layers}")
  if int(gamma) < 1 or float(decay) <= 0:
    raise ValueError(f"the DFlash drafter needs gamma >= 1 and decay > 0, got {gamma}, {decay}")
  return {
      "depths": list(depths),
      "hidden_size": int(cfg.hidden_size),
      "layers": int(n_layers),
      "layer_shapes": {k: list(v) for k, v in M.layer_shapes(cfg).items()},
      "gamma": int(gamma),
      "decay": float(decay),
  }


def param_shapes(config: dict) -> dict:
  e, n = config["hidden_size"], config["layers"]
  return {
      "fc": (len(config["depths"]) * e, e),
      "ctx_norm": (e,),
      "mask": (e,),
      "out_norm": (e,),
      "layers": {k: (n,) + tuple(v) for k, v in config["layer_shapes"].items()},
  }


def abstract_params(config: dict):
  is_shape = lambda x: isinstance(x, tuple) and all(isinstance(i, int) for i in x)
  return jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), param_shapes(config), is_leaf=is_shape)


artefact.register(KIND, abstract_params)


def init_params(config: dict, key):
  """Random drafter parameters: fc the mean of the depths' states plus a small random part, norms at one,
  the mask embedding at zero, each block like the target's own initialisation."""
  e, nd = config["hidden_size"], len(config["depths"])
  k_fc, k_layer = jax.random.split(key)
  fc = jnp.concatenate([jnp.eye(e)] * nd) / nd + jax.random.normal(k_fc, (nd * e, e)) / math.sqrt(nd * e) * 0.1
  stack = {}
  for i, (name, shape) in enumerate(sorted(config["layer_shapes"].items())):
    shape = (config["layers"],) + tuple(shape)
    if "norm" in name and "qk" not in name:
      stack[name] = jnp.ones(shape)
    elif name == "qk_bias":
      stack[name] = jnp.zeros(shape)
    else:
      stack[name] = jax.random.normal(jax.random.fold_in(k_layer, i), shape) / math.sqrt(shape[-2]) * 0.5
  return {"fc": fc, "ctx_norm": jnp.ones((e,)), "mask": jnp.zeros((e,)), "out_norm": jnp.ones((e,)), "layers": stack}


def layer(hp, l: int):
  """The parameters of block l."""
  return jax.tree_util.tree_map(lambda x: x[l], hp["layers"])


# ---------------------------------------------------------------------------------------------------
# Context features and the drafter's cache
# ---------------------------------------------------------------------------------------------------
def raw_feature(states):
  """[len(depths), .., E] states of the target -> the raw feature [.., len(depths) * E]."""
  return jnp.concatenate(list(states), axis=-1)


def context(hp, raw, cfg: ModelConfig):
  """c = RMSNorm(fc(raw)) [.., E] from the raw feature [.., F]."""
  return layers.rms_norm(raw.astype(jnp.float32) @ hp["fc"], hp["ctx_norm"], cfg.norm_eps)


def context_kv(hp, c, pos, cfg: ModelConfig):
  """Every block's key / value entries of context features c [B, N, E] at positions pos [B, N]:
  (k, v) [L, B, KV, N, D] (heads before positions, as a cache segment). Each block projects c with its own
  key / value weights (its q / k norm, bias and RoPE as the family does; the attention itself is skipped)."""
  bcfg = layout.base_config(cfg)
  skip = lambda q, k, v: jnp.zeros(q.shape[:2] + (q.shape[2] * q.shape[3],), q.dtype)
  ks, vs = [], []
  for l in range(hp["layers"]["wk"].shape[0]):
    _, (k, v) = layers.attention_sublayer(layer(hp, l), c, pos, None, skip, bcfg)
    ks.append(k.transpose(0, 2, 1, 3))
    vs.append(v.transpose(0, 2, 1, 3))
  return jnp.stack(ks), jnp.stack(vs)


def draft_logits(hp, tparams, anchor, p0, ck, cv, ctx_mask, gamma: int, cfg: ModelConfig):
  """The block draft: ONE pass over [x_{p0}, m x gamma] at positions p0 .. p0 + gamma.

  anchor [B] (the last committed token), p0 [B] its position, ck / cv [L, B, KV, T, D] the drafter's cache,
  ctx_mask [B, T] which cache entries the block sees (positions < p0). Returns float32 logits [B, gamma, V]:
  slot i's distribution for x_{p0+i}."""
  b = anchor.shape[0]
  x0 = M.embed(tparams, anchor[:, None], cfg).astype(jnp.float32)  # [B, 1, E]
  x = jnp.concatenate([x0, jnp.broadcast_to(hp["mask"], (b, gamma, x0.shape[-1]))], axis=1)
  pos = p0[:, None] + jnp.arange(gamma + 1)[None, :]
  full = jnp.ones((b, gamma + 1, gamma + 1), bool)  # bidirectional within the block
  mask = jnp.broadcast_to(ctx_mask[:, None, :], (b, gamma + 1, ctx_mask.shape[-1]))
  bcfg = layout.base_config(cfg)
  for l in range(ck.shape[0]):
    ctx = [(kvcache.stored(ck[l], like=ck), kvcache.stored(cv[l], like=cv), mask)]  # read in the cache's layout
    x, _ = layers.block(layer(hp, l), x, pos, full, ctx, bcfg)
  out = layers.rms_norm(x[:, 1:], hp["out_norm"], cfg.norm_eps)
  return M.lm_head(tparams, out, cfg)


# ---------------------------------------------------------------------------------------------------
# Training: blocks at random anchors of full windows
# ---------------------------------------------------------------------------------------------------
def window_features(tparams, tokens, config: dict, cfg: ModelConfig):
  """(raw feature [B, N, F] at the drafter's depths, the target's full-depth logits [B, N, V]) of windows
  tokens [B, N] (a full causal forward of the frozen target, no cache)."""
  lengths = jnp.full((tokens.shape[0],), tokens.shape[1], jnp.int32)
  hidden, states = eagle.target_features(tparams, tokens, lengths, cfg, tuple(config["depths"]))
  return raw_feature(states), M.readout_logits(tparams, hidden, cfg)


def sample_anchors(key, b: int, n: int, per_row: int, gamma: int):
  """[B, per_row] distinct anchors in [1, n - gamma - 1] per row (a block's targets stay inside the window)."""
  hi = n - gamma - 1
  if hi < 1:
    raise ValueError(f"a window of {n} tokens holds no DFlash block of gamma={gamma}")
  keys = jax.random.split(key, b)
  pick = lambda k: jax.random.choice(k, hi, (min(per_row, hi),), replace=False) + 1
  return jax.vmap(pick)(keys).astype(jnp.int32)


def block_logits(hp, tparams, tokens, raw, anchors, gamma: int, cfg: ModelConfig):
  """Logits [B, A, gamma, V] of the blocks at anchors [B, A] of windows tokens [B, N] with raw features
  [B, N, F]: block (b, a) sees the context entries of positions < a, exactly what decoding sees."""
  b, n = tokens.shape
  a = anchors.shape[1]
  pos = jnp.broadcast_to(jnp.arange(n), (b, n))
  ck, cv = context_kv(hp, context(hp, raw, cfg), pos, cfg)  # [L, B, KV, N, D]
  rep = lambda x: jnp.repeat(x, a, axis=1)
  flat = anchors.reshape(-1)
  anchor_tok = jnp.take_along_axis(tokens, anchors, axis=1).reshape(-1)
  ctx_mask = jnp.arange(n)[None, :] < flat[:, None]
  logits = draft_logits(hp, tparams, anchor_tok, flat, rep(ck), rep(cv), ctx_mask, gamma, cfg)
  return logits.reshape(b, a, gamma, -1)


def block_targets(target_logits, anchors, gamma: int):
  """The target's logits for slots 1..gamma of each block: position a + i - 1's readout, [B, A, gamma, V]."""
  idx = anchors[:, :, None] + jnp.arange(gamma)[None, None, :]  # a + i - 1 for i = 1..gamma
  b, a, g = idx.shape
  out = jnp.take_along_axis(target_logits, idx.reshape(b, a * g)[:, :, None], axis=1)
  return out.reshape(b, a, g, -1)


def slot_weights(gamma: int, decay: float):
  """exp(-(i - 1) / decay) for slots i = 1..gamma, normalised to sum 1."""
  w = jnp.exp(-jnp.arange(gamma, dtype=jnp.float32) / decay)
  return w / jnp.sum(w)


def loss(hp, tparams, config: dict, tokens, raw, target_logits, anchors, cfg: ModelConfig):
  """(loss, metrics): DFlash's position-weighted cross-entropy of every block slot against the target's
  distribution there; metrics: per-slot top-1 agreement acc{i} and the teacher-forced accepted length."""
  g = config["gamma"]
  logq = jax.nn.log_softmax(block_logits(hp, tparams, tokens, raw, anchors, g, cfg), axis=-1)
  tl = jax.lax.stop_gradient(block_targets(target_logits, anchors, g))
  ce = -jnp.sum(jax.nn.softmax(tl, axis=-1) * logq, axis=-1)  # [B, A, G]
  total = jnp.sum(jnp.mean(ce, axis=(0, 1)) * slot_weights(g, config["decay"]))
  same = jnp.argmax(logq, -1) == jnp.argmax(tl, -1)
  metrics = {f"acc{i + 1}": jnp.mean(same[..., i]) for i in range(g)}
  metrics["accepted"] = jnp.mean(jnp.sum(jnp.cumprod(same.astype(jnp.int32), axis=-1), axis=-1))
  return total, metrics


def block_accuracy(hp, tparams, config: dict, tokens, raw, target_logits, gamma: int, cfg: ModelConfig):
  """Held-out figures of windows tokens [B, N] at EVERY anchor 1..N - gamma - 1 (no sampling): (hits [gamma]
  slot-i argmax equal to the target's, accepted [] sum of teacher-forced greedy accepted prefixes, blocks [])."""
  b, n = tokens.shape
  anchors = jnp.broadcast_to(jnp.arange(1, n - gamma), (b, n - gamma - 1))
  same = jnp.argmax(block_logits(hp, tparams, tokens, raw, anchors, gamma, cfg), -1) == jnp.argmax(
      block_targets(target_logits, anchors, gamma), -1
  )
  acc = jnp.sum(jnp.cumprod(same.astype(jnp.int32), axis=-1))
  return jnp.sum(same, axis=(0, 1)), acc, jnp.int32(anchors.size)
