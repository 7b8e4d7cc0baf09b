"""The accelerators the cost model projects onto (`--config=accelerators.py[:h200,tpu_v5e]`): the table lives
in the library (loopspec_jax/analysis/accelerators.py, which the planner reads); configs and experiments read
it here."""

from loopspec_jax.analysis.accelerators import ACCELERATORS, get_config

__all__ = ["ACCELERATORS", "get_config"]
