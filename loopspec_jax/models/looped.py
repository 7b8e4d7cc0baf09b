"""The looped model as three pure functions: `pre`, `core_step`, `post` (and their parameters).

Ouro:   s0 = embed(x);  s_{u+1} = norm(Core(s_u));  logits_u = lm_head(s_u).
Raven:  e = Prelude(scale * wte[x]);  s_{i+1} = Core(adapter([s_i, e]));
        logits_r = head(ln_f(Coda(ln_f?(s_r))))  (ln_f before the coda only for Huginn).
Every function takes a `ctx_fn(layer)` giving the cached key/value segments of that layer, and returns the
new key/value entries of the queries, so callers decide where the cache lives (prefix, lanes, nowhere).
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.models import layers
from loopspec_jax.config import ModelConfig


# ---------------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------------
def layer_shapes(cfg: ModelConfig) -> dict:
  """Shapes of one block's parameters ([in, out] layout: y = x @ W)."""
  e, h, kv, d, i = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
  shapes = {
      "wq": (e, h * d),
      "wk": (e, kv * d),
      "wv": (e, kv * d),
      "wo": (h * d, e),
      "w_gate": (e, i),
      "w_up": (e, i),
      "w_down": (i, e),
  }
  for j in range(1, cfg.norms_per_layer + 1):
    shapes[f"norm_{j}"] = (e,)
  if cfg.qk_bias:
    shapes["qk_bias"] = (2, h, d)
  if cfg.qk_norm:
    shapes["q_norm"] = (h * d,)
    shapes["k_norm"] = (kv * d,)
  return shapes


def param_shapes(cfg: ModelConfig) -> dict:
  """The full parameter tree as nested dicts of shape tuples."""
  e, v = cfg.hidden_size, cfg.vocab_size
  ls = layer_shapes(cfg)
  stack = lambda n: {k: (n,) + s for k, s in ls.items()}
  tree = {"embed": (v, e), "core": stack(cfg.n_core), "final_norm": (e,)}
  if cfg.is_raven:
    tree["prelude"] = stack(cfg.n_prelude)
    tree["adapter"] = (2 * e, e)
    tree["coda"] = stack(cfg.n_coda)
  if not cfg.tie_embeddings:
    tree["lm_head"] = (e, v)
  if cfg.has_exit_gate:
    tree["exit_gate"] = {"w": (e, 1), "b": (1,)}
  return tree


def _is_shape(x):
  return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def init_params(cfg: ModelConfig, key, *, contraction: Optional[float] = None, std: float = 0.02):
  """Random parameters. `contraction` (e.g. 0.1) makes the recurrence contract so depths converge.

  Raven: the adapter's state half is scaled by `contraction`; Ouro: the sublayer output norms are set to it.
  """
  shapes = param_shapes(cfg)
  dtype = jnp.dtype(cfg.dtype)
  leaves, treedef = jax.tree_util.tree_flatten(shapes, is_leaf=_is_shape)
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)[0]]
  keys = jax.random.split(key, len(leaves))
  out = []
  for path, shape, k in zip(paths, leaves, keys):
    if "norm" in path and "qk" not in path:
      val = 1.0 + 0.1 * jax.random.normal(k, shape)
    elif "qk_bias" in path or path.endswith("['b']"):
      val = 0.1 * jax.random.normal(k, shape)
    elif "embed" in path:
      val = jax.random.normal(k, shape) * (1.0 / math.sqrt(cfg.hidden_size) if cfg.embed_scale != 1.0 else std * 5)
    else:
      fan_in = shape[-2] if len(shape) >= 2 else shape[-1]
      val = jax.random.normal(k, shape) / math.sqrt(fan_in)
    out.append(val.astype(jnp.float32))
  params = jax.tree_util.tree_unflatten(treedef, out)
  if contraction is not None:
    if cfg.is_raven:
      e = cfg.hidden_size
      params["adapter"] = params["adapter"].at[:e].multiply(contraction)
    else:
      for n in ("norm_2", "norm_4"):
        params["core"][n] = jnp.full_like(params["core"][n], contraction)
  return jax.tree_util.tree_map(lambda x: x.astype(dtype), params)


def abstract_params(cfg: ModelConfig):
  """ShapeDtypeStructs of the parameters, without allocating (jax.eval_shape)."""
  return jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))


def count_params(cfg: ModelConfig) -> int:
  """Unique parameter count (tied heads counted once), from eval_shape."""
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(abstract_params(cfg))))


def cast_params(params, dtype):
  return jax.tree_util.tree_map(lambda x: x.astype(dtype), params)


# ---------------------------------------------------------------------------------------------------
# pre / core_step / post
# ---------------------------------------------------------------------------------------------------
def embed(params, tokens, cfg: ModelConfig):
  x = jnp.take(params["embed"], tokens, axis=0)
  if cfg.embed_scale != 1.0:
    x = x * jnp.asarray(cfg.embed_scale, x.dtype)
  return x


def pre(params, tokens, pos, self_mask, ctx_fn, cfg: ModelConfig):
  """Embedding (+ prelude). Returns (e, k, v): the input injection (Ouro: the embedding itself)."""
  x = embed(params, tokens, cfg)
  if cfg.is_raven and cfg.n_prelude:
    return layers.run_stack(params["prelude"], x, pos, self_mask, ctx_fn, cfg)
  empty = jnp.zeros((0,) + x.shape[:2] + (cfg.num_kv_heads, cfg.head_dim), x.dtype)
  return x, empty, empty


def initial_state(e, cfg: ModelConfig, noise=None):
  """s0: Ouro starts from the embedding; Raven from zeros or `noise` (a truncated normal draw)."""
  if not cfg.is_raven:
    return e
  if noise is None:
    return jnp.zeros_like(e)
  return noise.astype(e.dtype)


def random_state_noise(key, shape, cfg: ModelConfig):
  """Truncated normal N(0, std^2) cut at +-3 std, times embed_scale (the Raven 'like-init' state)."""
  x = jax.random.truncated_normal(key, -3.0, 3.0, shape, jnp.float32) * cfg.init_std
  return x * cfg.embed_scale


def core_step(params, s, e, pos, self_mask, ctx_fn, cfg: ModelConfig):
  """One application of the shared recurrent block (the step index only picks the cache slots)."""
  if cfg.is_raven:
    x = jnp.concatenate([s, e.astype(s.dtype)], axis=-1) @ params["adapter"]
    return layers.run_stack(params["core"], x, pos, self_mask, ctx_fn, cfg)
  x, k, v = layers.run_stack(params["core"], s, pos, self_mask, ctx_fn, cfg)
  return layers.rms_norm(x, params["final_norm"], cfg.norm_eps), k, v


def head_matrix(params, cfg: ModelConfig):
  """The LM head [E, V] (a tied head is the embedding transposed: a copy; `lm_head` avoids it)."""
  return params["embed"].T if cfg.tie_embeddings else params["lm_head"]


def prepare_params(params, cfg: ModelConfig):
  """The decode form of the parameters, built once OUTSIDE a decode loop (loop-invariant layouts).

  Block stacks become per-layer views (`layers.LayerViews`: layers unroll and each reads its own cache
  buffer whole; a layer's weights are sliced where the loop body reads them, which feeds the product in
  place, where slices made here would be loop inputs the TPU compiler copies). A tied LM head stays the embedding [V, E]: `lm_head` contracts its
  E axis in place, where a materialised [E, V] transpose costs a 4 V E-byte copy per call (the whole
  embedding read and written) and streams no faster.
  """
  del cfg
  out = dict(params)
  for name in ("prelude", "core", "coda"):
    if name in params and not isinstance(params[name], (tuple, list, layers.LayerViews)):
      out[name] = layers.LayerViews(params[name])
  return out


def coda_hidden(params, s, pos, self_mask, ctx_fn, cfg: ModelConfig):
  """The final hidden state: the coda's output before the final norm (Raven; Ouro: s itself, already normed
  by `core_step`). Returns (hidden [..., E], k, v) with k/v of the coda (empty for Ouro)."""
  if not cfg.is_raven:
    empty = jnp.zeros((0,) + s.shape[:2] + (cfg.num_kv_heads, cfg.head_dim), s.dtype)
    return s, empty, empty
  x = s
  if cfg.norm_before_coda:
    x = layers.rms_norm(x, params["final_norm"], cfg.norm_eps)
  return layers.run_stack(params["coda"], x, pos, self_mask, ctx_fn, cfg)


def final_features(params, hidden, cfg: ModelConfig):
  """The vector the LM head multiplies: the final norm of `hidden` (Raven), `hidden` itself (Ouro)."""
  return layers.rms_norm(hidden, params["final_norm"], cfg.norm_eps) if cfg.is_raven else hidden


def lm_head(params, x, cfg: ModelConfig):
  """float32 logits [..., V] of final features x [..., E] (a tied head reads the embedding [V, E] as stored)."""
  if cfg.tie_embeddings:
    return jnp.einsum("...e,ve->...v", x, params["embed"], preferred_element_type=jnp.float32)
  return jnp.einsum("...e,ev->...v", x, params["lm_head"], preferred_element_type=jnp.float32)


def readout_logits(params, hidden, cfg: ModelConfig):
  """float32 logits of a final hidden state: the final norm (Raven) and the LM head."""
  return lm_head(params, final_features(params, hidden, cfg), cfg)


def readout_features(params, s, pos, self_mask, ctx_fn, cfg: ModelConfig):
  """The final feature (post-coda AND post final norm: what the LM head reads). Returns (x [..., E], k, v)."""
  hidden, k, v = coda_hidden(params, s, pos, self_mask, ctx_fn, cfg)
  return final_features(params, hidden, cfg), k, v


def post_hidden(params, s, pos, self_mask, ctx_fn, cfg: ModelConfig):
  """`post` plus the final hidden state (`coda_hidden`). Returns (float32 logits, k, v, hidden)."""
  hidden, k, v = coda_hidden(params, s, pos, self_mask, ctx_fn, cfg)
  return readout_logits(params, hidden, cfg), k, v, hidden


def post(params, s, pos, self_mask, ctx_fn, cfg: ModelConfig):
  """Readout: (coda, final norm) and LM head. Returns (float32 logits, k, v) with k/v of the coda."""
  return post_hidden(params, s, pos, self_mask, ctx_fn, cfg)[:3]


# ---------------------------------------------------------------------------------------------------
# Full-sequence forward at every depth (no cache)
# ---------------------------------------------------------------------------------------------------
def causal_mask(lengths, t):
  """[B, T, T] causal mask that also hides padded keys beyond each sequence's length."""
  q = jnp.arange(t)[:, None]
  k = jnp.arange(t)[None, :]
  valid = k[None] < lengths[:, None, None]
  return (k <= q)[None] & valid


def forward_depths(params, tokens, lengths, depths: tuple, cfg: ModelConfig, init_state=None):
  """Logits [len(depths), B, T, V] of a full-sequence forward, read out at each depth in `depths`."""
  b, t = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = causal_mask(lengths, t)
  none = layers.no_context
  e, _, _ = pre(params, tokens, pos, mask, none, cfg)
  s = initial_state(e, cfg, init_state)
  rmax = max(depths)

  def step(s, _):
    s, _, _ = core_step(params, s, e, pos, mask, none, cfg)
    return s, s

  _, states = jax.lax.scan(step, s, None, length=rmax)  # states[i] = s_{i+1}
  out = []
  for r in depths:
    logits, _, _ = post(params, states[r - 1], pos, mask, none, cfg)
    out.append(logits)
  return jnp.stack(out)
