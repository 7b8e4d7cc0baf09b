"""The LoopSpec release's experiment suite (its experiments 100/101, 110-113) as presets (`release/suite.py`)."""
