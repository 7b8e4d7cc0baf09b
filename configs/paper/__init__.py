"""The LoopSpec paper's experiments as presets (`python -m loopspec_jax.experiments.paper_table3 --config=paper/table3.py`)."""
