"""The public entry points: `load`, `save`, `readouts`, `generate` (stable; outside tools call them)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax import autoregressive as ar
from loopspec_jax import hf_checkpoint
from loopspec_jax import model as M
from loopspec_jax.config import ModelConfig

OWN_CONFIG = "loopspec_config.json"
ASSETS = os.path.join(os.path.dirname(__file__), "assets", "models")


@dataclasses.dataclass
class LoopedModel:
  """A config, its parameters (a pytree of jax arrays) and an optional `tokenizers.Tokenizer`."""
  config: ModelConfig
  params: Any
  tokenizer: Any = None
  source: Optional[str] = None

  @property
  def family(self) -> str:
    return self.config.family

  @property
  def recurrence(self) -> int:
    return self.config.recurrence

  def encode(self, text: str) -> list:
    if self.tokenizer is None:
      raise ValueError("this model has no tokenizer; pass token ids")
    return self.tokenizer.encode(text).ids

  def decode(self, ids) -> str:
    if self.tokenizer is None:
      raise ValueError("this model has no tokenizer")
    return self.tokenizer.decode(list(ids))


@dataclasses.dataclass
class GenerateResult:
  tokens: list  # new tokens per prompt (list of lists)
  stats: dict


def bundled_models() -> list:
  """Names of the models shipped inside the package (loadable with `load(name)`)."""
  if not os.path.isdir(ASSETS):
    return []
  return sorted(d for d in os.listdir(ASSETS) if os.path.isdir(os.path.join(ASSETS, d)))


def _load_tokenizer(path: str):
  tok_path = os.path.join(path, "tokenizer.json")
  if not os.path.exists(tok_path):
    return None
  from tokenizers import Tokenizer
  return Tokenizer.from_file(tok_path)


def load(path: str, *, family: Optional[str] = None, dtype: str = "float32", mesh=None,
         sharding_rules=None) -> LoopedModel:
  """Loads a bundled model by name, one of the project's own checkpoints, or an HF checkpoint directory.

  HF directories hold config.json plus model.safetensors or a sharded model.safetensors.index.json; the
  family is detected from config and tensor names unless forced with `family=`. With a `mesh` (axes
  'data', 'model') the parameters are placed sharded by `sharding.RULES` (or `sharding_rules`).
  """
  if not os.path.isdir(path) and path in bundled_models():
    path = os.path.join(ASSETS, path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"no checkpoint directory or bundled model named {path!r} "
                            f"(bundled: {bundled_models()})")
  if os.path.exists(os.path.join(path, OWN_CONFIG)):
    model = _load_own(path, dtype)
    if family is not None and family != model.config.family:
      raise ValueError(f"{path} holds a {model.config.family!r} model, not {family!r}")
  else:
    cfg, np_params = hf_checkpoint.read_hf(path, family=family, dtype=dtype)
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.dtype(dtype)), np_params)
    model = LoopedModel(cfg, params, _load_tokenizer(path), source=path)
  if mesh is not None:
    from loopspec_jax import sharding
    model = dataclasses.replace(model, params=sharding.shard_params(model.params, model.config, mesh,
                                                                    sharding_rules))
  return model


def save(model: LoopedModel, path: str):
  """Saves params with orbax and the config (and tokenizer) beside them; `load(path)` round-trips exactly."""
  import orbax.checkpoint as ocp
  path = os.path.abspath(path)
  os.makedirs(path, exist_ok=True)
  ckpt = ocp.StandardCheckpointer()
  target = os.path.join(path, "params")
  if os.path.exists(target):
    shutil.rmtree(target)
  ckpt.save(target, model.params)
  ckpt.wait_until_finished()
  with open(os.path.join(path, OWN_CONFIG), "w") as f:
    f.write(model.config.to_json())
  if model.tokenizer is not None:
    model.tokenizer.save(os.path.join(path, "tokenizer.json"))


def _load_own(path: str, dtype: Optional[str]) -> LoopedModel:
  import orbax.checkpoint as ocp
  path = os.path.abspath(path)
  with open(os.path.join(path, OWN_CONFIG)) as f:
    cfg = ModelConfig.from_dict(json.load(f))
  abstract = M.abstract_params(cfg)
  ckpt = ocp.StandardCheckpointer()
  params = ckpt.restore(os.path.join(path, "params"), abstract)
  if dtype is not None and dtype != cfg.dtype and dtype != "float32":
    cfg = cfg.replace(dtype=dtype)
    params = M.cast_params(params, jnp.dtype(dtype))
  return LoopedModel(cfg, params, _load_tokenizer(path), source=path)


def from_config(cfg: ModelConfig, seed: int = 0, **init_kw) -> LoopedModel:
  """A randomly initialised model of a config (tests, planning)."""
  return LoopedModel(cfg, M.init_params(cfg, jax.random.PRNGKey(seed), **init_kw))


# ---------------------------------------------------------------------------------------------------
# Validation shared by every decoder (runs before anything compiles)
# ---------------------------------------------------------------------------------------------------
def validate_prompts(prompts, cfg: ModelConfig, max_new_tokens: int) -> list:
  if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
    raise ValueError("prompts must be a non-empty list of token-id lists")
  out = []
  for i, p in enumerate(prompts):
    p = [int(t) for t in np.asarray(p).reshape(-1)] if not isinstance(p, list) else list(p)
    if len(p) == 0:
      raise ValueError(f"prompt {i} is empty")
    for t in p:
      if not isinstance(t, (int, np.integer)) or not 0 <= int(t) < cfg.vocab_size:
        raise ValueError(f"prompt {i} has token id {t!r} outside the vocabulary [0, {cfg.vocab_size})")
    if len(p) + max_new_tokens > cfg.max_len:
      raise ValueError(f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} it exceeds the "
                       f"context of {cfg.max_len} positions")
    out.append([int(t) for t in p])
  return out


def validate_sampling(temperature, top_k, top_p, init_state, cfg: ModelConfig):
  if not temperature >= 0:
    raise ValueError(f"temperature must be >= 0, got {temperature}")
  if int(top_k) != top_k or top_k < 0:
    raise ValueError(f"top_k must be a non-negative integer, got {top_k}")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p must be in (0, 1], got {top_p}")
  if init_state not in ("zeros", "random"):
    raise ValueError(f"init_state must be 'zeros' or 'random', got {init_state!r}")
  if init_state == "random" and not cfg.is_raven:
    raise ValueError(f"init_state='random' applies to Raven-style models, not {cfg.family!r}")


def _round_up(x: int, m: int) -> int:
  return ((x + m - 1) // m) * m


def buckets(lengths, max_new_tokens: int, cfg: ModelConfig):
  """Static (prompt_len, total_len) buckets so that similar requests share one compiled program."""
  tp = min(_round_up(max(lengths), 16), cfg.max_len)
  total = min(_round_up(max(lengths) + max_new_tokens, 32), cfg.max_len)
  return tp, max(total, tp)


def batch_prompts(prompts: list, tp: int):
  arr = np.zeros((len(prompts), tp), np.int32)
  for i, p in enumerate(prompts):
    arr[i, :len(p)] = p
  return jnp.asarray(arr), jnp.asarray([len(p) for p in prompts], jnp.int32)


def sampling_params(n, max_new_tokens, temperature, top_k, top_p, seed, eos_id, request_ids=None):
  rid = np.arange(n) if request_ids is None else np.asarray(request_ids)
  return ar.SamplingParams(
      temperature=jnp.float32(temperature), top_k=jnp.int32(top_k), top_p=jnp.float32(top_p),
      base_key=jax.random.PRNGKey(seed), request_ids=jnp.asarray(rid, jnp.int32),
      eos_id=jnp.int32(-1 if eos_id is None else eos_id),
      max_new=jnp.full((n,), max_new_tokens, jnp.int32))


# ---------------------------------------------------------------------------------------------------
# readouts / generate
# ---------------------------------------------------------------------------------------------------
def readouts(model: LoopedModel, token_ids, depths=None, *, init_state=None) -> np.ndarray:
  """float32 logits [len(depths), T, V] of a full-sequence forward read out at each depth (default 1..R)."""
  cfg = model.config
  ids = validate_prompts([list(np.asarray(token_ids).reshape(-1))], cfg, 0)[0]
  depths = tuple(range(1, cfg.recurrence + 1)) if depths is None else tuple(int(d) for d in depths)
  for d in depths:
    if not 1 <= d:
      raise ValueError(f"readout depth {d} must be >= 1")
  noise = None
  if init_state is not None:
    if not cfg.is_raven:
      raise ValueError("init_state applies to Raven-style models")
    noise = jnp.asarray(init_state, jnp.float32)
    if noise.shape != (len(ids), cfg.hidden_size):
      raise ValueError(f"init_state must have shape {(len(ids), cfg.hidden_size)}, got {noise.shape}")
    noise = noise[None]
  tokens = jnp.asarray([ids], jnp.int32)
  out = _forward_depths(model.params, tokens, jnp.asarray([len(ids)], jnp.int32), noise, depths=depths, cfg=cfg)
  return np.asarray(out[:, 0], np.float32)


_forward_depths = jax.jit(
    lambda params, tokens, lengths, noise, depths, cfg: M.forward_depths(params, tokens, lengths, depths, cfg,
                                                                           noise),
    static_argnames=("depths", "cfg"))


def generate(model: LoopedModel, prompts, *, max_new_tokens: int, method: str = "ar", temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, eos_id: Optional[int] = None,
             init_state: str = "zeros", d1: Optional[int] = None, d2: Optional[int] = None,
             gamma: Optional[int] = None, lane_capacity: Optional[int] = None, request_ids=None,
             mesh=None, speculate_max_batch: Optional[int] = None, sharding_rules=None) -> GenerateResult:
  """Decodes `prompts` (lists of token ids) with method 'ar', 'chain' (d1, gamma) or 'loopspec' (d1, d2).

  Every method is lossless with respect to full-depth decoding. Returns new tokens per prompt and stats.
  `mesh`: a jax Mesh with axes 'data' (requests) and 'model' (heads, MLP, vocab); the batch is padded to a
  multiple of the data-axis size with dummy requests, dropped from the result (see loopspec_jax/sharding.py).
  `speculate_max_batch=K`: batches of more than K requests decode with 'ar' instead (speculation stops
  paying once a batch is compute-bound; experiments/batch_bench.py measures where).
  """
  cfg = model.config
  if max_new_tokens is None or int(max_new_tokens) < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  max_new_tokens = int(max_new_tokens)
  prompts = validate_prompts(prompts, cfg, max_new_tokens)
  validate_sampling(temperature, top_k, top_p, init_state, cfg)
  if eos_id is not None and not 0 <= eos_id < cfg.vocab_size:
    raise ValueError(f"eos_id {eos_id} is outside the vocabulary [0, {cfg.vocab_size})")
  if speculate_max_batch is not None and len(prompts) > speculate_max_batch and method != "ar":
    method = "ar"  # large batches are compute-bound: speculation stops paying
  greedy = float(temperature) == 0.0
  random_init = init_state == "random"
  n_real = len(prompts)
  if mesh is not None:
    from loopspec_jax import sharding
    mesh = sharding.plan(mesh, sharding_rules)
    prompts, request_ids, _ = sharding.pad_requests(prompts, request_ids, mesh)
  lengths = [len(p) for p in prompts]
  tp, total = buckets(lengths, max_new_tokens, cfg)
  prompt_arr, len_arr = batch_prompts(prompts, tp)
  sp = sampling_params(len(prompts), max_new_tokens, temperature, top_k, top_p, seed, eos_id, request_ids)
  if len(prompts) > n_real:  # dummy requests stop after one token
    sp = sp.replace(max_new=sp.max_new.at[n_real:].set(1))
  unpad = lambda res: res if mesh is None else sharding.drop_padding(res, n_real)
  if method == "ar":
    if d1 is not None or d2 is not None or gamma is not None:
      raise ValueError("method='ar' takes no d1/d2/gamma")
    return unpad(_generate_ar(model, prompt_arr, len_arr, sp, tp, total, greedy, random_init, mesh))
  if method == "chain":
    from loopspec_jax import chain
    return unpad(chain.generate_chain(model, prompt_arr, len_arr, sp, total=total, greedy=greedy,
                                      random_init=random_init, d1=d1, gamma=gamma, mesh=mesh))
  if method == "loopspec":
    from loopspec_jax import loopspec
    return unpad(loopspec.generate_loopspec(model, prompt_arr, len_arr, sp, total=total, greedy=greedy,
                                            random_init=random_init, d1=d1, d2=d2,
                                            lane_capacity=lane_capacity, mesh=mesh))
  raise ValueError(f"unknown method {method!r}; expected 'ar', 'chain' or 'loopspec'")


def collect_tokens(tokens, lengths0, n_new) -> list:
  tokens = np.asarray(tokens)
  n_new = np.asarray(n_new)
  return [tokens[i, int(lengths0[i]):int(lengths0[i]) + int(n_new[i])].tolist() for i in range(tokens.shape[0])]


def _generate_ar(model, prompt_arr, len_arr, sp, tp, total, greedy, random_init, mesh):
  cfg = model.config
  t0 = time.perf_counter()
  from loopspec_jax import sharding
  cache, tokens = sharding.entry(ar.prefill_state, mesh)(model.params, prompt_arr, len_arr, sp, cfg=cfg,
                                                         readout_depths=(cfg.recurrence,), total_len=total,
                                                         random_init=random_init)
  jax.block_until_ready(cache)
  t1 = time.perf_counter()
  b = prompt_arr.shape[0]
  lengths0 = np.asarray(len_arr)
  state = ar.DecodeState(cache=cache, tokens=tokens, length=jnp.array(len_arr), n_new=jnp.zeros((b,), jnp.int32),
                         done=jnp.zeros((b,), bool), iterations=jnp.int32(0))
  out = sharding.entry(ar.decode_loop, mesh)(model.params, state, sp, cfg=cfg, greedy=greedy,
                                             random_init=random_init)
  jax.block_until_ready(out.tokens)
  t2 = time.perf_counter()
  n_new = np.asarray(out.n_new)
  iters = int(out.iterations)
  gen = int(n_new.sum())
  stats = {
      "method": "ar", "batch": b, "tokens_generated": gen, "prefill_seconds": t1 - t0, "decode_seconds": t2 - t1,
      "tokens_per_second": gen / max(t2 - t1, 1e-9), "ticks": iters, "core_step_calls": iters * cfg.recurrence,
      "core_step_calls_per_token": iters * cfg.recurrence * b / max(gen, 1), "mean_accepted_length": 1.0,
      "commits": {"first": 0, "second": 0, "restart": gen}, "gate_open_rate": 0.0, "skipped_spawns": 0,
  }
  return GenerateResult(collect_tokens(out.tokens, lengths0, n_new), stats)
