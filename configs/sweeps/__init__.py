"""Configs of experiments/measure_depths.py (depths.py) and experiments/sweep.py (default.py, ...)."""
