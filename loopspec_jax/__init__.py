"""loopspec_jax: exact, fast decoding of looped (recurrent-depth) transformers in JAX."""

from loopspec_jax.api import (GenerateResult, LoopedModel, bundled_models, from_config, generate, load, readouts, save)
from loopspec_jax.checkpoint.hf import CheckpointError
from loopspec_jax.config import ModelConfig
from loopspec_jax.methods import AR, Chain, Draft, Lookup, LoopSpec, Method

__all__ = [
    "AR",
    "Chain",
    "Draft",
    "Lookup",
    "LoopSpec",
    "Method",
    "GenerateResult",
    "LoopedModel",
    "ModelConfig",
    "CheckpointError",
    "bundled_models",
    "from_config",
    "generate",
    "load",
    "readouts",
    "save",
]
__version__ = "0.1.0"
