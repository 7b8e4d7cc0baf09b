"""The LoopSpec paper's experiments as presets (`python -m loopspec_experiments.paper_table3 --config=paper/table3.py`)."""
