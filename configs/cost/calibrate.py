"""Cost-model calibration on the host: predicted against measured decode-loop iterations.

  loopspec-cost-report --config=cost/calibrate.py          # the full grid (3 models x 2 contexts x 2 samplings)
  loopspec-cost-report --config=cost/calibrate.py:quick    # tiny models, greedy and sampled, one context each
  loopspec-cost-report --config=cost/calibrate.py:subset   # quick + bench_e512 at 512, greedy only
  loopspec-cost-report --config=cost/calibrate.py:tiny     # seconds: the default suite's test

`model_settings[label].methods` are method specs (`loopspec_jax.methods.parse`), the first one "ar" (the
reference of the ratios); `spec` is an `experiments.common.resolve_model` spec. Writes
<out_root>/<host>-<date>/{calibration.json, calibration.md, README.md} (or `out_dir` when set).
"""

import ml_collections

RAVEN_METHODS = (
    "ar",
    "chain:d1=2,gamma=8",
    "loopspec:d1=2",
    "loopspec:d1=2,d2=8",
    "draft:draft_model=tiny-raven-draft,gamma=4",
    "lookup:gamma=4",
)
OURO_METHODS = (  # R = 4: (2, 8) does not exist; its best pair is (1, 2)
    "ar",
    "chain:d1=1,gamma=3",
    "loopspec:d1=2",
    "loopspec:d1=1,d2=2",
    "draft:draft_model=tiny-raven-draft,gamma=4",
    "lookup:gamma=4",
)
E512_METHODS = (
    "ar",
    "chain:d1=2,gamma=8",
    "loopspec:d1=2",
    "loopspec:d1=2,d2=8",
    "lookup:gamma=4",
)  # no drafter shares its 65536-token vocabulary


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.calibrate = True  # experiments/cost_report.py runs experiments/cost_calibration.py
  c.models = "tiny_raven,tiny_ouro,bench_e512"
  c.model_settings = {
      "tiny_raven": {"spec": "tiny-raven", "contexts": (128, 256), "methods": RAVEN_METHODS},
      "tiny_ouro": {"spec": "tiny-ouro", "contexts": (128, 256), "methods": OURO_METHODS},
      "bench_e512": {"spec": "random:huginn:bench_e512", "contexts": (256, 512), "methods": E512_METHODS},
  }
  c.sampling = "greedy,sampled"
  c.new_tokens = 32  # tokens decoded per run (the iterations of one run are averaged)
  c.repeats = 3  # interleaved runs per method and per host microbenchmark (the same load on both); medians
  c.stat = "min"  # per loop and host microbenchmark: "min" (least disturbed on a shared host) or "median"
  c.overhead_from = "ar"  # per-op overhead: "ar" (fitted on AR's loop of the block) or "microbenchmark"
  # "wall" (perf_counter) or "cpu" (process CPU time). Not "cpu": Linux adds a thread's CPU time to the
  # process clock only at a scheduler tick or context switch, so a call shorter than a few ticks whose work
  # ran on XLA's worker threads reads as almost free (2026-12-04: 30 of 87 tiny-raven product timings read
  # 200-2200 GFLOP/s on a 2-core host whose products peak at ~190, results/cost_calibration/epyc2-2026-12-04-c).
  c.clock = "wall"
  c.timed_shapes = 0  # product shapes of the loops timed on the host, most flops first (0: all)
  c.rows = (1, 2, 4, 8, 16, 32)  # product rows M at which the host's throughput is measured
  c.mode = "kernels"  # hardware.Hardware.step_seconds: "kernels" (sum of per-kernel rooflines) or "roofline"
  c.out_root = "results/cost_calibration"
  c.out_dir = ""  # set: write here instead of <out_root>/<host>-<date>
  if arg == "subset":  # what this 2-core host ran in the time (README of the run says so)
    c.model_settings.tiny_raven.contexts = (256,)
    c.model_settings.tiny_ouro.contexts = (256,)
    c.model_settings.bench_e512.contexts = (512,)
    c.model_settings.bench_e512.sampling = "greedy"
  elif arg == "quick":
    c.models = "tiny_raven,tiny_ouro"
    c.model_settings.tiny_raven.contexts = (256,)
    c.model_settings.tiny_ouro.contexts = (256,)
  elif arg == "tiny":  # the default suite's test: two loops that compile fast, one small grid
    c.models = "tiny_raven"
    c.model_settings.tiny_raven.contexts = (48,)
    c.model_settings.tiny_raven.methods = ("ar", "lookup:gamma=2")
    c.sampling = "greedy"
    c.new_tokens = 8
    c.repeats = 1
    c.timed_shapes = 2
    c.rows = (1, 4)
  elif arg:
    raise ValueError(f"unknown cost/calibrate.py variant {arg!r} (quick, tiny)")
  return c
