"""The paper's Table 3 (ablation of the second proposal) on the bundled tiny-raven, as the release runs it.

  python -m loopspec_experiments.paper_table3                      # configs/paper/table3.py
  python -m loopspec_experiments.paper_table3 --config=paper/table3.py:quick

Rows per depth pair (d1, d2): no second proposal (d1 alone), the masked second proposal without a gate, the
residual without a gate, the residual with the gate (the paper's LoopSpec). Sampled at T = 1, top-p 0.7 (the
paper's sampled setting), batch 1, one request at a time; every LoopSpec row skip-free (`lane_capacity =
"worst"`: the schedule's worst case per stage, as the release caps nothing). Raven's initial state is drawn
at random as the release and the Huginn reference draw it (tiny-raven was trained that way).
"""

import ml_collections

PAIRS = ((2, 8), (2, 10), (4, 8))  # the paper's Raven pairs of Table 3
# label -> the LoopSpec arguments of a variant beside (d1, d2) (None: the variant has no second proposal)
VARIANTS = {
    "single": None,
    "masked": "second=masked,gate=false",
    "residual": "second=residual,gate=false",
    "residual+gate": "second=residual,gate=true",
}


def methods(pairs=PAIRS, variants=VARIANTS, capacity="worst") -> list:
  """'ar' then, per pair, one LoopSpec spec per variant (a single proposal once per distinct d1)."""
  out, singles = ["ar"], set()
  for d1, d2 in pairs:
    for args in variants.values():
      if args is None:
        if d1 not in singles:
          singles.add(d1)
          out.append(f"loopspec:d1={d1},lane_capacity={capacity}")
        continue
      out.append(f"loopspec:d1={d1},d2={d2},lane_capacity={capacity},{args}")
  return out


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.model = "tiny-raven"
  c.task = "demo"  # the prompts loopspec-demo decodes (loopspec_jax.experiment.prompts.load_prompt_set)
  c.num_prompts = 4
  c.prompt_select = (0, 2, 3)  # which of them to decode: demo prompts 1, 3 and 4 share one decode shape
  c.prompt_len = 32  # 'random' task only
  c.max_new_tokens = 32
  c.repeats = 3  # interleaved repeats (method order rotated); figures are medians
  c.seed = 1234  # the release's seed
  c.temperature = 1.0
  c.top_p = 0.7
  c.init_state = "random"  # Raven / Huginn: the release's random initial state ("zeros": ours before)
  c.methods = methods()
  c.out_dir = "results/paper_table3/2026-12-06"
  if arg == "capacity":  # why plain generate keeps its default table: the gated residual, default vs skip-free
    c.methods = ["ar"] + [f"loopspec:d1=2,d2=8{cap}" for cap in ("", ",lane_capacity=worst")]
    c.out_dir = "results/paper_table3/2026-12-06-capacity"
  elif arg == "quick":  # a smoke run: one pair, one prompt, 16 tokens
    c.num_prompts = 1
    c.prompt_select = (0,)
    c.max_new_tokens = 16
    c.repeats = 1
    c.methods = methods(pairs=((4, 8),))
    c.out_dir = "/tmp/paper_table3_quick"
  elif arg is not None:
    raise ValueError(f"unknown preset {arg!r} (presets: capacity, quick)")
  return c
