"""loopspec_jax/experiment/table3.py (the paper's Table 3) from stub results: variant names, the after-first-token
estimate and the table's lines. (tests/decoding/test_ablation.py checks the preset's rows through the entry point.)"""

import pytest

from loopspec_jax import methods
from loopspec_jax.experiment import table3


def test_variants_and_after_first_estimate():
  variant = lambda spec: table3.variant_of(methods.parse(spec))
  assert variant("loopspec:d1=2") == "single" and variant("loopspec:d1=2,d2=8,second=masked,gate=false") == "masked"
  assert variant("loopspec:d1=2,d2=8,gate=true").endswith("+gate")
  assert table3.after_first_seconds({"decode_seconds_median": 1.0, "batch": 1, "tokens": 4}) == 0.75
  ls = {"decode_seconds_median": 2.0, "first_token_ticks": 5, "request_ticks": 20}
  assert table3.after_first_seconds(ls) == pytest.approx(1.5)


def test_markdown_lines_and_footer():
  row = dict(d1=2, d2=None, variant="single", release_gamma=3.0, mean_accepted_length=3.1, wall_clock_ratio_median=1.2)
  row.update(after_first_ratio_est=1.25, gate_open_rate=0.5, mean_live_lanes=3.0, max_live_lanes=9, lane_capacity=100)
  row.update(skipped_spawns=0, split=dict(first_reject=2, second_skip=1, second_accept=1, second_reject=0))
  config = dict(task="gsm8k", prompt_select=[0, 2], max_new_tokens=8, temperature=0.0, top_p=1.0, seed=0)
  config.update(init_state="zeros", repeats=3)
  text = table3.markdown([row], {"model": "tiny-raven", "config": config, "machine": "host", "time": "now"})
  assert "| (2, -) | single | 3.00 | 3.10 | 1.200x | 1.250x | 2: 1 / 1 / 0 | 0.50 | 3.0 / 9 | 100 | 0 |" in text
  assert "tiny-raven, task gsm8k: prompts [1, 3] x 8 tokens" in text and "Host: host; now." in text
