"""Experiment entry points (the `loopspec-*` console scripts); shared conventions in `common`."""
