"""Configs of loopspec-measure-depths (depths.py) and loopspec-sweep (default.py)."""
