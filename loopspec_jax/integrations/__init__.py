"""Integrations with outside tools. Each submodule imports its tool lazily, on import of that submodule only:

lm_eval   the lm-evaluation-harness backend (`pip install ".[eval]"`), registered as model `loopspec_jax`
"""
