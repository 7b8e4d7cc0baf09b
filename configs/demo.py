"""Settings of the demo (`loopspec-demo`, experiments/demo.py).

loopspec-demo                                   # bundled tiny-raven, LoopSpec at its best known (d1, d2)
loopspec-demo --config.model=tiny-ouro          # bundled tiny-ouro
loopspec-demo --config.model=/path/to/checkpoint --config.d1=2 --config.d2=8 --config.max_new_tokens=32
loopspec-demo --config.d1=4                     # single-proposal LoopSpec at depth 4 (d2 none)
loopspec-demo --config.compare_single_proposal=false   # skip the (d1, -) comparison line
loopspec-demo --config.gate_mass=0               # the paper's gate for the sampled second proposal
loopspec-demo --config.auto=false                # skip the method="auto" row
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown preset {arg!r} (override fields with --config.<field>=<value>)")
  c = ml_collections.ConfigDict()
  c.model = "tiny-raven"  # a bundled model name or a checkpoint directory
  # LoopSpec depths; d1 none: the model family's best known (d1, d2). With d1 given, d2 none is single proposal.
  c.d1 = config_dict.placeholder(int)
  c.d2 = config_dict.placeholder(int)
  c.max_new_tokens = 96
  c.seed = 0
  c.repeats = 3  # timed calls per prompt after the compiling one; the median counts
  # Every fixed method of both phases compiles first, this many at a time (XLA compiles a program on one core:
  # two side by side on a 2-core host take about half the time); the timed calls come after, alone.
  c.compile_workers = 2
  # With a second proposal (d2), also time LoopSpec at (d1, -): what the second lane column buys on this hardware.
  c.compare_single_proposal = True
  # Sampled LoopSpec's gate also asks for this much residual mass sum(max(0, p_d2 - q1)) before it spends a
  # branch lane on a second proposal (0: the paper's gate, which opens for about half of the d2 lanes here
  # on float-level differences; lossless either way, see docs/engine.md "The second proposal's gate").
  c.gate_mass = 0.1
  # Also decode with method="auto" (loopspec_jax/planner.py: the planner's pick, planned once per prompt shape on
  # its untimed first call, then cached, on disk too: a second demo loads the plan) and print its row.
  c.auto = True
  # The planner's measured probe: AR and this many of the best predicted candidates (each compiles once per
  # sampling mode, which is most of a first run's time; none: the planner's whole shortlist), `auto_measure`
  # new tokens each; re-planning after `auto_replan` tokens (0: off; none: the planner's default, 16).
  c.auto_candidates = 1
  c.auto_measure = 16
  c.auto_replan = config_dict.placeholder(int)
  return c
