"""loopspec_jax: exact, fast decoding of looped (recurrent-depth) transformers in JAX."""

from loopspec_jax.api import (GenerateResult, LoopedModel, bundled_models, from_config, generate, load, readouts, save)
from loopspec_jax.checkpoint.hf import CheckpointError
from loopspec_jax.config import ModelConfig
from loopspec_jax.heads.artefact import Heads, bundled_heads
from loopspec_jax.heads.artefact import load as load_heads
from loopspec_jax import methods as _methods
from loopspec_jax.methods import Method

# every registered method class, by its class name: lj.AR, lj.Chain, lj.LoopSpec, lj.Draft, lj.Lookup,
# lj.TreeSelf, lj.Lookahead, ... (a new method is exported by registering it in methods._CLASSES)
_METHOD_CLASSES = {cls.__name__: cls for cls in _methods.REGISTRY.values()}
globals().update(_METHOD_CLASSES)

__all__ = sorted(_METHOD_CLASSES) + [
    "Method",
    "Heads",
    "GenerateResult",
    "LoopedModel",
    "ModelConfig",
    "CheckpointError",
    "bundled_heads",
    "bundled_models",
    "from_config",
    "generate",
    "load",
    "load_heads",
    "readouts",
    "save",
]
__version__ = "0.1.0"
