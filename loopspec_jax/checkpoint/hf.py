"""Reading (and writing) Hugging Face checkpoints of the looped families: config.json + safetensors.

Every tensor of the file is accounted for: a missing, unexpected or mis-shaped tensor, a missing config key
or an unknown family is a `CheckpointError` naming it. Linear weights are stored [out, in] (PyTorch) and
become [in, out] here.
"""

from __future__ import annotations

import json
import math
import os
from typing import Optional

import numpy as np

from loopspec_jax.config import FAMILIES, ModelConfig


class CheckpointError(ValueError):
  """A checkpoint that does not match what its family requires."""


# Tensors a checkpoint may carry that the port recomputes or ties (never silently anything else).
_IGNORABLE = {"huginn": {"freqs_cis", "lm_head.weight"}}


def _need(cfg: dict, key: str, where: str):
  if key not in cfg:
    raise CheckpointError(f"config.json of {where} is missing the key {key!r}")
  return cfg[key]


# ---------------------------------------------------------------------------------------------------
# Family detection and config parsing
# ---------------------------------------------------------------------------------------------------
def detect_family(hf_cfg: dict, names) -> str:
  """Family from config.json and tensor names (retrofitted Raven checkpoints do not name their block)."""
  names = set(names)
  mt = str(hf_cfg.get("model_type", "")).lower()
  archs = " ".join(hf_cfg.get("architectures", []) or []).lower()
  if mt == "ouro" or "ouro" in archs or any(n.startswith("model.layers.") for n in names):
    return "ouro"
  if mt in ("huginn_raven", "raven") or "raven" in archs or any(n.startswith("transformer.") for n in names):
    if any(n.endswith("attn.q_norm.weight") for n in names):
      return "raven-olmo"
    has_norm3 = any(n.endswith(".norm_3.weight") for n in names)
    if not has_norm3:
      return "raven-llama"
    if any(n.endswith("attn.qk_bias") for n in names):
      return "huginn"
    raise CheckpointError(
        "Raven checkpoint with norm_3/norm_4 but no qk_bias: unknown block style; " "force one with family="
    )
  raise CheckpointError(
      f"unknown family: model_type={mt!r}, architectures={archs!r}; " f"pass family= one of {FAMILIES}"
  )


def config_from_hf(hf_cfg: dict, family: str, dtype: str = "float32", where: str = "checkpoint") -> ModelConfig:
  """Maps config.json keys of the family to a ModelConfig."""
  if family not in FAMILIES:
    raise CheckpointError(f"unknown family {family!r}; expected one of {FAMILIES}")
  if family == "ouro":
    e = _need(hf_cfg, "hidden_size", where)
    h = _need(hf_cfg, "num_attention_heads", where)
    scaling = hf_cfg.get("rope_scaling")
    if scaling:
      raise CheckpointError(f"config.json of {where}: rope_scaling {scaling!r} is not supported for ouro")
    return ModelConfig(
        family="ouro",
        vocab_size=_need(hf_cfg, "vocab_size", where),
        hidden_size=e,
        num_heads=h,
        num_kv_heads=hf_cfg.get("num_key_value_heads", h),
        head_dim=hf_cfg.get("head_dim") or e // h,
        intermediate_size=_need(hf_cfg, "intermediate_size", where),
        n_prelude=0,
        n_core=_need(hf_cfg, "num_hidden_layers", where),
        n_coda=0,
        recurrence=_need(hf_cfg, "total_ut_steps", where),
        max_len=hf_cfg.get("max_position_embeddings", 4096),
        rope_theta=float(hf_cfg.get("rope_theta", 10000.0)),
        norm_eps=float(hf_cfg.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)),
        dtype=dtype,
        has_exit_gate=True,
        bos_id=hf_cfg.get("bos_token_id"),
        eos_id=_first(hf_cfg.get("eos_token_id")),
    )
  e = _need(hf_cfg, "n_embd", where)
  h = _need(hf_cfg, "n_heads", where)
  init = hf_cfg.get("init_values") or {}
  if family == "huginn":
    embed_scale = float(init.get("embed_scale", math.sqrt(e)))
    theta = hf_cfg.get("rope_base", hf_cfg.get("rope_theta"))
  else:
    embed_scale = float(init.get("embed_scale", 1.0))
    theta = hf_cfg.get("rope_theta", hf_cfg.get("rope_base"))
  if theta is None:
    raise CheckpointError(f"config.json of {where} is missing the key 'rope_theta' (or 'rope_base')")
  llama3 = None
  scaling = hf_cfg.get("rope_scaling")
  if scaling:
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
      raise CheckpointError(f"config.json of {where}: rope_scaling type {kind!r} is not supported")
    llama3 = tuple(
        float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    )
  vocab = hf_cfg.get("padded_vocab_size", hf_cfg.get("vocab_size"))
  if vocab is None:
    raise CheckpointError(f"config.json of {where} is missing the key 'padded_vocab_size' (or 'vocab_size')")
  return ModelConfig(
      family=family,
      vocab_size=vocab,
      hidden_size=e,
      num_heads=h,
      num_kv_heads=hf_cfg.get("num_key_value_heads", h),
      head_dim=hf_cfg.get("head_dim") or e // h,
      intermediate_size=_need(hf_cfg, "intermediate_size", where),
      n_prelude=_need(hf_cfg, "n_layers_in_prelude", where),
      n_core=_need(hf_cfg, "n_layers_in_recurrent_block", where),
      n_coda=_need(hf_cfg, "n_layers_in_coda", where),
      recurrence=_need(hf_cfg, "mean_recurrence", where),
      max_len=hf_cfg.get("block_size", 4096),
      rope_theta=float(theta),
      rope_interleaved=(family == "huginn"),
      rope_llama3=llama3,
      norm_eps=float(hf_cfg.get("norm_eps", 1e-6)),
      embed_scale=embed_scale,
      init_std=float(init.get("std", 0.0)),
      tie_embeddings=(family == "huginn"),
      dtype=dtype,
      bos_id=hf_cfg.get("bos_token_id"),
      eos_id=_first(hf_cfg.get("eos_token_id")),
  )


def _first(x):
  return x[0] if isinstance(x, (list, tuple)) else x


def config_to_hf(cfg: ModelConfig) -> dict:
  """The config.json of a ModelConfig, with the family's real key names."""
  if cfg.family == "ouro":
    return {
        "architectures": ["OuroForCausalLM"],
        "model_type": "ouro",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.n_core,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": cfg.tie_embeddings,
        "total_ut_steps": cfg.recurrence,
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "torch_dtype": "float32",
    }
  d = {
      "architectures": ["RavenForCausalLM"],
      "model_type": "huginn_raven",
      "n_embd": cfg.hidden_size,
      "n_heads": cfg.num_heads,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "intermediate_size": cfg.intermediate_size,
      "vocab_size": cfg.vocab_size,
      "padded_vocab_size": cfg.vocab_size,
      "n_layers_in_prelude": cfg.n_prelude,
      "n_layers_in_recurrent_block": cfg.n_core,
      "n_layers_in_coda": cfg.n_coda,
      "mean_recurrence": cfg.recurrence,
      "norm_eps": cfg.norm_eps,
      "block_size": cfg.max_len,
      "block_class_name": "SandwichBlock",
      "init_values": {"std": cfg.init_std, "embed_scale": cfg.embed_scale},
      "tie_embeddings": cfg.tie_embeddings,
      "bos_token_id": cfg.bos_id,
      "eos_token_id": cfg.eos_id,
  }
  if cfg.family == "huginn":
    d["rope_base"] = cfg.rope_theta
    d["qk_bias"] = True
  else:
    d["rope_theta"] = cfg.rope_theta
  if cfg.rope_llama3 is not None:
    f, lo, hi, old = cfg.rope_llama3
    d["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": f,
        "low_freq_factor": lo,
        "high_freq_factor": hi,
        "original_max_position_embeddings": int(old),
    }
  return d


# ---------------------------------------------------------------------------------------------------
# Tensor name mapping: HF name -> (HF shape, function building our array)
# ---------------------------------------------------------------------------------------------------
def _expected_tensors(cfg: ModelConfig) -> dict:
  """{hf_name: hf_shape} the family's checkpoint must contain."""
  e, h, kv, d, i, v = (
      cfg.hidden_size,
      cfg.num_heads,
      cfg.num_kv_heads,
      cfg.head_dim,
      cfg.intermediate_size,
      cfg.vocab_size,
  )
  out = {}
  if cfg.family == "ouro":
    out["model.embed_tokens.weight"] = (v, e)
    for l in range(cfg.n_core):
      p = f"model.layers.{l}."
      out.update(
          {
              p + "self_attn.q_proj.weight": (h * d, e),
              p + "self_attn.k_proj.weight": (kv * d, e),
              p + "self_attn.v_proj.weight": (kv * d, e),
              p + "self_attn.o_proj.weight": (e, h * d),
              p + "mlp.gate_proj.weight": (i, e),
              p + "mlp.up_proj.weight": (i, e),
              p + "mlp.down_proj.weight": (e, i),
          }
      )
      for n in ("input_layernorm", "input_layernorm_2", "post_attention_layernorm", "post_attention_layernorm_2"):
        out[p + n + ".weight"] = (e,)
    out["model.norm.weight"] = (e,)
    if cfg.has_exit_gate:
      out["model.early_exit_gate.weight"] = (1, e)
      out["model.early_exit_gate.bias"] = (1,)
    if not cfg.tie_embeddings:
      out["lm_head.weight"] = (v, e)
    return out
  out["transformer.wte.weight"] = (v, e)
  out["transformer.adapter.weight"] = (e, 2 * e)
  out["transformer.ln_f.weight"] = (e,)
  if not cfg.tie_embeddings:
    out["lm_head.weight"] = (v, e)
  for stack, n in (("prelude", cfg.n_prelude), ("core_block", cfg.n_core), ("coda", cfg.n_coda)):
    for l in range(n):
      p = f"transformer.{stack}.{l}."
      out.update(
          {
              p + "attn.Wqkv.weight": ((h + 2 * kv) * d, e),
              p + "attn.proj.weight": (e, h * d),
              p + "mlp.fc.weight": (2 * i, e),
              p + "mlp.proj.weight": (e, i),
          }
      )
      for j in range(1, cfg.norms_per_layer + 1):
        out[p + f"norm_{j}.weight"] = (e,)
      if cfg.qk_bias:
        out[p + "attn.qk_bias"] = (2, 1, h, d)
      if cfg.qk_norm:
        out[p + "attn.q_norm.weight"] = (h * d,)
        out[p + "attn.k_norm.weight"] = (kv * d,)
  return out


_OURO_LAYER = {
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
    "input_layernorm.weight": "norm_1",
    "input_layernorm_2.weight": "norm_2",
    "post_attention_layernorm.weight": "norm_3",
    "post_attention_layernorm_2.weight": "norm_4",
}


def _raven_layer_from_hf(get, prefix: str, cfg: ModelConfig) -> dict:
  h, kv, d, i = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
  wqkv = get(prefix + "attn.Wqkv.weight")
  fc = get(prefix + "mlp.fc.weight")
  layer = {
      "wq": wqkv[: h * d].T,
      "wk": wqkv[h * d : (h + kv) * d].T,
      "wv": wqkv[(h + kv) * d :].T,
      "wo": get(prefix + "attn.proj.weight").T,
      "w_gate": fc[:i].T,
      "w_up": fc[i:].T,
      "w_down": get(prefix + "mlp.proj.weight").T,
  }
  for j in range(1, cfg.norms_per_layer + 1):
    layer[f"norm_{j}"] = get(prefix + f"norm_{j}.weight")
  if cfg.qk_bias:
    layer["qk_bias"] = get(prefix + "attn.qk_bias").reshape(2, h, d)
  if cfg.qk_norm:
    layer["q_norm"] = get(prefix + "attn.q_norm.weight")
    layer["k_norm"] = get(prefix + "attn.k_norm.weight")
  return layer


def _stack(layers_: list) -> dict:
  return {k: np.stack([l[k] for l in layers_]) for k in layers_[0]}


def params_from_hf(cfg: ModelConfig, get) -> dict:
  """Builds our parameter tree (numpy) from a tensor getter `get(hf_name) -> np.ndarray`."""
  if cfg.family == "ouro":
    core = [{ours: get(f"model.layers.{l}.{hf}") for hf, ours in _OURO_LAYER.items()} for l in range(cfg.n_core)]
    for lyr in core:
      for k in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
        lyr[k] = lyr[k].T
    params = {"embed": get("model.embed_tokens.weight"), "core": _stack(core), "final_norm": get("model.norm.weight")}
    if cfg.has_exit_gate:
      params["exit_gate"] = {"w": get("model.early_exit_gate.weight").T, "b": get("model.early_exit_gate.bias")}
    if not cfg.tie_embeddings:
      params["lm_head"] = get("lm_head.weight").T
    return params
  params = {
      "embed": get("transformer.wte.weight"),
      "adapter": get("transformer.adapter.weight").T,
      "final_norm": get("transformer.ln_f.weight"),
  }
  for ours, stack, n in (
      ("prelude", "prelude", cfg.n_prelude),
      ("core", "core_block", cfg.n_core),
      ("coda", "coda", cfg.n_coda),
  ):
    if n == 0:
      raise CheckpointError(f"a Raven checkpoint needs at least one {stack} layer")
    params[ours] = _stack([_raven_layer_from_hf(get, f"transformer.{stack}.{l}.", cfg) for l in range(n)])
  if not cfg.tie_embeddings:
    params["lm_head"] = get("lm_head.weight").T
  return params


def params_to_hf(cfg: ModelConfig, params) -> dict:
  """Inverse of params_from_hf: {hf_name: np.ndarray} in PyTorch layout."""
  p = {
      k: (np.asarray(v) if not isinstance(v, dict) else {kk: np.asarray(vv) for kk, vv in v.items()})
      for k, v in params.items()
  }
  out = {}
  if cfg.family == "ouro":
    out["model.embed_tokens.weight"] = p["embed"]
    for l in range(cfg.n_core):
      for hf, ours in _OURO_LAYER.items():
        w = p["core"][ours][l]
        out[f"model.layers.{l}.{hf}"] = w.T if w.ndim == 2 else w
    out["model.norm.weight"] = p["final_norm"]
    if cfg.has_exit_gate:
      out["model.early_exit_gate.weight"] = p["exit_gate"]["w"].T
      out["model.early_exit_gate.bias"] = p["exit_gate"]["b"]
    if not cfg.tie_embeddings:
      out["lm_head.weight"] = p["lm_head"].T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
  h, d = cfg.num_heads, cfg.head_dim
  out["transformer.wte.weight"] = p["embed"]
  out["transformer.adapter.weight"] = p["adapter"].T
  out["transformer.ln_f.weight"] = p["final_norm"]
  if not cfg.tie_embeddings:
    out["lm_head.weight"] = p["lm_head"].T
  for ours, stack, n in (
      ("prelude", "prelude", cfg.n_prelude),
      ("core", "core_block", cfg.n_core),
      ("coda", "coda", cfg.n_coda),
  ):
    for l in range(n):
      s = {k: v[l] for k, v in p[ours].items()}
      pre = f"transformer.{stack}.{l}."
      out[pre + "attn.Wqkv.weight"] = np.concatenate([s["wq"].T, s["wk"].T, s["wv"].T], axis=0)
      out[pre + "attn.proj.weight"] = s["wo"].T
      out[pre + "mlp.fc.weight"] = np.concatenate([s["w_gate"].T, s["w_up"].T], axis=0)
      out[pre + "mlp.proj.weight"] = s["w_down"].T
      for j in range(1, cfg.norms_per_layer + 1):
        out[pre + f"norm_{j}.weight"] = s[f"norm_{j}"]
      if cfg.qk_bias:
        out[pre + "attn.qk_bias"] = s["qk_bias"].reshape(2, 1, h, d)
      if cfg.qk_norm:
        out[pre + "attn.q_norm.weight"] = s["q_norm"]
        out[pre + "attn.k_norm.weight"] = s["k_norm"]
  if cfg.family == "huginn":
    out["lm_head.weight"] = p["embed"]  # the tied copy real Huginn checkpoints store
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------------
# Directory I/O
# ---------------------------------------------------------------------------------------------------
class _TensorFiles:
  """Lazy access to the tensors of model.safetensors or a sharded model.safetensors.index.json."""

  def __init__(self, path: str):
    from safetensors import safe_open

    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      files = sorted(set(weight_map.values()))
      for fn in files:
        if not os.path.exists(os.path.join(path, fn)):
          raise CheckpointError(f"{index} names the shard {fn!r}, which does not exist")
    elif os.path.exists(single):
      files = ["model.safetensors"]
      weight_map = None
    else:
      raise CheckpointError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
    self._handles = {fn: safe_open(os.path.join(path, fn), framework="numpy") for fn in files}
    self.where = {}
    for fn, hdl in self._handles.items():
      for k in hdl.keys():
        if weight_map is not None and weight_map.get(k) != fn:
          raise CheckpointError(f"tensor {k!r} is in shard {fn!r} but the index says {weight_map.get(k)!r}")
        self.where[k] = fn
    if weight_map is not None:
      missing = sorted(set(weight_map) - set(self.where))
      if missing:
        raise CheckpointError(f"the index lists tensors that no shard holds: {missing[:5]}")

  def names(self):
    return set(self.where)

  def shape(self, name):
    return tuple(self._handles[self.where[name]].get_slice(name).get_shape())

  def get(self, name) -> np.ndarray:
    return self._handles[self.where[name]].get_tensor(name)


def read_hf(path: str, family: Optional[str] = None, dtype: str = "float32"):
  """Reads an HF checkpoint directory into (ModelConfig, numpy params). Validates before converting."""
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(f"{path} has no config.json")
  with open(cfg_path) as f:
    hf_cfg = json.load(f)
  files = _TensorFiles(path)
  names = files.names()
  fam = family or detect_family(hf_cfg, names)
  cfg = config_from_hf(hf_cfg, fam, dtype=dtype, where=path)
  if fam == "ouro" and not any(n.startswith("model.early_exit_gate.") for n in names):
    cfg = cfg.replace(has_exit_gate=False)  # the gate is unused by decoding; write_hf omits it when absent
  expected = _expected_tensors(cfg)
  ignorable = _IGNORABLE.get(fam, set())
  missing = sorted(set(expected) - names)
  if missing:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise CheckpointError(f"missing tensor {missing[0]!r}{more} in {path} for family {fam!r}")
  unexpected = sorted(names - set(expected) - ignorable)
  if unexpected:
    more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
    raise CheckpointError(f"unexpected tensor {unexpected[0]!r}{more} in {path} for family {fam!r}")
  for name, shape in expected.items():
    got = files.shape(name)
    if got != tuple(shape):
      raise CheckpointError(f"tensor {name!r} has shape {got}, expected {tuple(shape)} for family {fam!r}")
  get = lambda n: np.asarray(files.get(n), dtype=np.float32)
  return cfg, params_from_hf(cfg, get)


def write_hf(path: str, cfg: ModelConfig, params, shards: int = 1):
  """Writes config.json and model.safetensors (or `shards` files plus an index) in the family's layout."""
  from safetensors.numpy import save_file

  os.makedirs(path, exist_ok=True)
  tensors = {k: v.astype(np.float32) for k, v in params_to_hf(cfg, params).items()}
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config_to_hf(cfg), f, indent=2)
  if shards <= 1:
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return
  names = sorted(tensors)
  weight_map = {}
  for s in range(shards):
    fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    part = {n: tensors[n] for n in names[s::shards]}
    save_file(part, os.path.join(path, fn))
    weight_map.update({n: fn for n in part})
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump(
        {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))}, "weight_map": weight_map},
        f,
        indent=2,
    )
