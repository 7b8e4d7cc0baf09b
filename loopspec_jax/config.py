"""The static description of a looped transformer: one frozen, hashable dataclass per model.

It is hashable so that jitted functions can take it as a static argument (one compile per config).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

FAMILIES = ("ouro", "huginn", "raven-llama", "raven-olmo")

# How each family's block normalises (see shared/docs/architectures.md).
#   ouro:    h = h + n2(attn(n1(h)));   h = h + n4(mlp(n3(h)))      (sandwich on sublayer outputs)
#   huginn:  x = n2(x + attn(n1(x)));   x = n4(x + mlp(n3(x)))      (sandwich on the residual stream)
#   llama:   x = x + attn(n1(x));       x = x + mlp(n2(x))          (pre-norm)
#   olmo:    x = x + n1(attn(x));       x = x + n2(mlp(x))          (post-norm, q/k norm)
BLOCK_STYLE = {"ouro": "ouro", "huginn": "huginn", "raven-llama": "llama", "raven-olmo": "olmo"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every size and switch of a looped model; hashable, so usable as a jit static argument."""

  family: str
  vocab_size: int
  hidden_size: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  n_prelude: int
  n_core: int
  n_coda: int
  recurrence: int  # R: full recurrent depth used as the target
  max_len: int  # context length (positions 0 .. max_len-1)
  rope_theta: float = 10000.0
  rope_interleaved: bool = False  # Huginn: interleaved pairs; others: rotate_half
  # llama3 rope scaling as a tuple (factor, low_freq_factor, high_freq_factor, original_max_pos) or None.
  rope_llama3: Optional[tuple] = None
  norm_eps: float = 1e-6
  embed_scale: float = 1.0
  init_std: float = 0.0  # std of the truncated-normal random initial state (Raven family)
  tie_embeddings: bool = False
  dtype: str = "float32"
  # Ouro keeps its early-exit gate tensors (unused by decoding) so that a checkpoint round-trips.
  has_exit_gate: bool = False
  bos_id: Optional[int] = None
  eos_id: Optional[int] = None
  # Head layout for a device mesh (`parallel.sharding.padded_config`; 0 / 1 for a model as trained). When set,
  # num_kv_heads / num_heads count the stored heads: each real KV head stored `kv_repeat` times (its query
  # heads split between the copies; exact), then `head_padding` all-zero KV heads appended, each with its
  # num_heads / num_kv_heads all-zero query heads (they attend to zero values and feed zero rows of wo: exact).
  head_padding: int = 0
  kv_repeat: int = 1

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(f"unknown family {self.family!r}; expected one of {FAMILIES}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.family == "ouro" and (self.n_prelude or self.n_coda):
      raise ValueError("ouro has no prelude or coda")
    if self.recurrence < 1:
      raise ValueError(f"recurrence must be >= 1, got {self.recurrence}")
    if not (0 <= self.head_padding < self.num_kv_heads and self.kv_repeat >= 1):
      raise ValueError(f"head_padding={self.head_padding} / kv_repeat={self.kv_repeat} out of range")
    if (self.num_kv_heads - self.head_padding) % self.kv_repeat:
      real = self.num_kv_heads - self.head_padding
      raise ValueError(f"kv_repeat={self.kv_repeat} does not divide the {real} stored real KV heads")

  # ---- derived properties -------------------------------------------------------------------------
  @property
  def block_style(self) -> str:
    return BLOCK_STYLE[self.family]

  @property
  def is_raven(self) -> bool:
    """Raven layout: prelude -> (adapter + core) x r -> coda."""
    return self.family != "ouro"

  @property
  def norm_before_coda(self) -> bool:
    """Huginn applies ln_f before and after the coda; retrofitted models only after."""
    return self.family == "huginn"

  @property
  def qk_bias(self) -> bool:
    return self.family == "huginn"

  @property
  def qk_norm(self) -> bool:
    return self.family == "raven-olmo"

  @property
  def norms_per_layer(self) -> int:
    return 4 if self.block_style in ("ouro", "huginn") else 2

  @property
  def real_kv_width(self) -> int:
    """Entries of the k projection that are not padding (repeated heads count): OLMo's k_norm averages over them."""
    return (self.num_kv_heads - self.head_padding) * self.head_dim

  @property
  def real_q_width(self) -> int:
    """Entries of the q projection that are not padding: OLMo's q_norm averages over them."""
    return (self.num_heads - self.head_padding * (self.num_heads // self.num_kv_heads)) * self.head_dim

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    if d["rope_llama3"] is not None:
      d["rope_llama3"] = list(d["rope_llama3"])
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
    d = dict(d)
    if d.get("rope_llama3") is not None:
      d["rope_llama3"] = tuple(d["rope_llama3"])
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
      raise ValueError(f"unknown ModelConfig keys: {sorted(unknown)}")
    return cls(**d)

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def from_config_dict(cd) -> ModelConfig:
  """Builds a ModelConfig from an ml_collections ConfigDict (or dict) of the same field names."""
  d = cd.to_dict() if hasattr(cd, "to_dict") else dict(cd)
  return ModelConfig.from_dict(d)
