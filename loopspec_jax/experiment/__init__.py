"""What experiments share, as a tested library: model resolution, prompt sets, benchmark timing (interleaved
repeats, medians, ratios against AR), result files, the host description and the (d1, d2) / gamma sweep; and
the reusable part of each benchmark entry point: the serving load generator (`load`), the lm-eval evaluation
(`evaluation`), the tree benchmarks and replays (`tree_bench`, `tree_replay`, `tree_accept`), the row cost
(`row_cost`), the PyTorch reference comparison (`reference`), the batch, auto and Figure 4 benchmarks
(`batch_bench`, `auto_bench`, `figure4`), the paper's Table 3 (`table3`), the demo's runs and lines (`demo`)
and the bank-recorded EAGLE training (`eagle_bank`).

The command-line entry points (`loopspec-bench`, `loopspec-sweep`, ...) live in the top-level experiments/
folder (the package `loopspec_experiments`) and are thin: flags and a config in, these functions, a report out.
This package sits above `api` (it decodes through `generate`), beside serving and integrations; nothing of the
library below imports it, and it never imports experiments/ or configs/ (a config table it needs, e.g. the
model configs of 'random:<family>:<variant>' specs, is handed in).
"""
