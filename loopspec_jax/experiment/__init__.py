"""What experiments share, as a tested library: model resolution, prompt sets, benchmark timing (interleaved
repeats, medians, ratios against AR), result files, the host description and the (d1, d2) / gamma sweep.

The command-line entry points (`loopspec-bench`, `loopspec-sweep`, ...) live in the top-level experiments/
folder (the package `loopspec_experiments`) and are thin: flags and a config in, these functions, a report out.
This package sits above `api` (it decodes through `generate`), beside serving and integrations; nothing of the
library below imports it, and it never imports experiments/ or configs/ (a config table it needs, e.g. the
model configs of 'random:<family>:<variant>' specs, is handed in).
"""
