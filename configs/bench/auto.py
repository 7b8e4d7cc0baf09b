"""Settings of `experiments/bench_auto.py`: method="auto" beside every fixed candidate, wall clock, one run.

python -m loopspec_experiments.bench_auto --config=bench/auto.py          # the issue-28 table
python -m loopspec_experiments.bench_auto --config=bench/auto.py:epyc2    # reduced: 1 prompt, 32 tokens
python -m loopspec_experiments.bench_auto --config=bench/auto.py:quick    # one model, greedy, 16 tokens
"""

import ml_collections

_DRAFT = "draft:draft_model=tiny-raven-draft,gamma=4"


def get_config(preset: str = ""):
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.max_new_tokens = 64
  c.samplings = "greedy,sample"
  c.sampling_settings = {"greedy": {"temperature": 0.0}, "sample": {"temperature": 1.0, "top_p": 0.7}}
  # model spec -> (task, prompts, repeats, methods); the first method is 'ar', the last 'auto'
  c.models = "tiny-raven,tiny-ouro,random:huginn:bench_e512"
  c.runs = {
      "tiny-raven": (
          "demo",
          2,
          3,
          [
              "ar",
              "chain:d1=1,gamma=4",
              "chain:d1=2,gamma=8",
              "loopspec:d1=2",
              "loopspec:d1=2,d2=8",
              "lookup:ngram=3,gamma=4",
              _DRAFT,
              "auto:draft_model=tiny-raven-draft",
          ],
      ),
      "tiny-ouro": (
          "demo",
          2,
          3,
          [
              "ar",
              "chain:d1=1,gamma=4",
              "chain:d1=2,gamma=4",
              "loopspec:d1=2",
              "loopspec:d1=1,d2=2",
              "lookup:ngram=3,gamma=4",
              _DRAFT,
              "auto:draft_model=tiny-raven-draft",
          ],
      ),
      "random:huginn:bench_e512": (
          "random",
          1,
          3,
          [
              "ar",
              "chain:d1=1,gamma=4",
              "chain:d1=2,gamma=8",
              "loopspec:d1=2",
              "loopspec:d1=2,d2=8",
              "lookup:ngram=3,gamma=4",
              "auto",
          ],
      ),
  }
  c.prompt_len = 32
  c.out_dir = "results/bench_auto/vm-2026-12-03"
  if preset == "epyc2":  # the reduced run of 2026-12-04 (a shared 2-vCPU host): 1 prompt, 32 tokens, 3 rounds
    c.max_new_tokens = 32
    c.runs = {k: (task, 1, 3, specs) for k, (task, _, _, specs) in c.runs.items()}
    c.out_dir = "results/bench_auto/epyc2-2026-12-04"
  if preset == "quick":
    c.models = "tiny-raven"
    c.samplings = "greedy"
    c.max_new_tokens = 16
    c.runs = {"tiny-raven": ("demo", 1, 1, ["ar", "chain:d1=2,gamma=8", "auto:measure=8"])}
    c.out_dir = "/tmp/bench_auto_quick"
  return c
