"""Benchmark of the bundled trained models on the real prompt sets (issue: trained looped models).

  python -m experiments.bench --config=configs/bench/bundled.py
  python -m experiments.bench --config=configs/bench/bundled.py:quick     # a CI-sized run

Methods side by side in one run: autoregressive, chain (best gamma), LoopSpec single proposal, LoopSpec two
proposals; greedy and sampling (T=1.0, top_p=0.7); medians of `repeats` interleaved repeats.
"""
import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.models = ["tiny-raven", "tiny-ouro"]
  c.model_label = ""
  c.contraction = None
  c.seed = 0
  c.tasks = ["gsm8k", "math500", "mbpp", "humaneval", "shakespeare"]
  c.num_prompts = 2
  c.prompt_len = 32
  c.max_new_tokens = 64
  c.repeats = 3
  c.samplings = ["greedy", "sample"]
  c.sampling_settings = {"greedy": {"temperature": 0.0},
                         "sample": {"temperature": 1.0, "top_p": 0.7}}
  c.methods = ["ar"]
  c.methods_by_model = {
      "tiny-raven": ["ar", "chain:d1=2,gamma=8", "loopspec:d1=2", "loopspec:d1=2,d2=8"],
      "tiny-ouro": ["ar", "chain:d1=1,gamma=4", "loopspec:d1=1", "loopspec:d1=1,d2=2"],
  }
  c.out_dir = "results/bench_bundled"
  if arg == "two":  # the README table: two prompt sets, both samplings
    c.tasks = ["gsm8k", "shakespeare"]
    c.out_dir = "results/bench_bundled_two"
  if arg == "quick":
    c.tasks = ["gsm8k", "shakespeare"]
    c.samplings = ["greedy"]
    c.num_prompts = 1
    c.max_new_tokens = 16
    c.repeats = 1
    c.out_dir = "results/bench_bundled_quick"
  return c
