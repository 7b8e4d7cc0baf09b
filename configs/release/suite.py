"""The LoopSpec release's benchmark suite (kaist-flexml-lab/loopspec, experiments/*.yaml) restated as presets.

  python -m loopspec_experiments.release_run --config=release/suite.py:110          # bundled models
  python -m loopspec_experiments.release_run --config=release/suite.py:110 \\
      --config.bundled=false --config.limit=none                                           # the real checkpoints

Presets 110 (speed, math), 111 (speed, math, thinking models with chat), 112 (speed, coding), 113 (speed,
general), 100 / 101 (accuracy, base / thinking): per release model, its depth configurations in the release's
"K:X" spelling (d1 = K, d2 = K * X; "K" alone: one proposal; "baseline": AR), samplings and tasks, with each
task's shots, budget (max_gen_toks / max_length) and seed 1234, run one request at a time. `bundled=True` maps
the Raven models to tiny-raven and the Ouro models to tiny-ouro, each task to its offline twin in
loopspec_jax/tasks (`OFFLINE`), and caps the budget to the tiny models' context; a task with no offline twin
is named and skipped (the runner prints the missing data sets).
"""

import ml_collections

SEED = 1234  # the release's server and lm-eval seed
RAVEN = ("baseline", "2", "2:4", "2:5", "4", "4:2")  # (2, 8), (2, 10), (4, 8) and their single proposals
OURO = ("baseline", "1", "1:2")
GREEDY = {"greedy": {}}
BOTH = {"greedy": {}, "t1.0_p0.7": {"temperature": 1.0, "top_p": 0.7}}

# task -> (lm-eval task, shots, max_gen_toks, max_length, chat template with thinking)
TASKS = {
    "gsm8k-cot": ("gsm8k_cot", 3, 512, 2048, False),
    "gsm8k-cot-chat": ("gsm8k_cot", 3, 4096, 8192, True),
    "math500": ("minerva_math500", 4, 2048, 4096, False),
    "math500-chat": ("minerva_math500", 4, 8192, 16384, True),
    "aime24-chat": ("aime24", 0, 16384, 32768, True),
    "aime25-chat": ("aime25", 0, 16384, 32768, True),
    "bbh": ("bbh_cot_fewshot", 3, 1024, 4096, False),
    "humaneval": ("humaneval_custom", 0, 1024, 2048, False),
    "humaneval-plus": ("humaneval_plus_custom", 0, 1024, 2048, False),
    "mbpp": ("mbpp_custom", 0, 1024, 4096, False),
    "mbpp-plus": ("mbpp_plus_custom", 0, 1024, 2048, False),
}
# the release's lm-eval task -> our offline twin (loopspec_jax/tasks); absent: no offline data here
OFFLINE = {
    "gsm8k_cot": "loopspec_gsm8k_cot",
    "minerva_math500": "loopspec_minerva_math500",
    "humaneval_custom": "loopspec_humaneval",
    "mbpp_custom": "loopspec_mbpp",
}
BUNDLED = {"Ouro": "tiny-ouro", "Recurrent": "tiny-raven"}  # release model name prefix -> bundled model

_RAVENS = ("Recurrent-Llama-3.2-train-recurrence-32", "Recurrent-OLMo-2-0425-train-recurrence-32")
_TINYLLAMA = "Recurrent-TinyLlama-3T-train-recurrence-32"
_OUROS = ("Ouro-1.4B", "Ouro-2.6B")
_THINKING = ("Ouro-1.4B-Thinking", "Ouro-2.6B-Thinking")
_CHAT = ["gsm8k-cot-chat", "math500-chat", "aime24-chat", "aime25-chat"]


def _jobs(models, depths, samplings, tasks) -> dict:
  return {m: {"depths": list(depths), "samplings": dict(samplings), "tasks": list(tasks)} for m in models}


def experiment(name: str) -> dict:
  """model -> {depths, samplings, tasks} of one release experiment."""
  if name == "110":
    return {
        **_jobs(_OUROS, OURO, GREEDY, ["gsm8k-cot", "math500"]),
        **_jobs(_RAVENS, RAVEN, GREEDY, ["gsm8k-cot", "math500"]),
        **_jobs([_TINYLLAMA], RAVEN, GREEDY, ["gsm8k-cot"]),
    }
  if name == "111":
    return _jobs(_THINKING, OURO, BOTH, _CHAT)
  if name == "112":
    return {
        **_jobs(_OUROS, OURO, GREEDY, ["humaneval-plus", "mbpp-plus"]),
        **_jobs(_RAVENS + (_TINYLLAMA,), RAVEN, GREEDY, ["humaneval-plus", "mbpp-plus"]),
    }
  if name == "113":
    return {**_jobs(_OUROS, OURO, GREEDY, ["bbh"]), **_jobs(_RAVENS, RAVEN, GREEDY, ["bbh"])}
  if name == "100":
    every = ["gsm8k-cot", "math500", "bbh", "humaneval", "humaneval-plus", "mbpp", "mbpp-plus"]
    return {
        **_jobs(_OUROS + _RAVENS, ("baseline",), GREEDY, every),
        **_jobs([_TINYLLAMA], ("baseline",), GREEDY, ["gsm8k-cot", "humaneval", "humaneval-plus", "mbpp-plus"]),
    }
  if name == "101":
    jobs = _jobs(_THINKING, ("baseline",), GREEDY, ["gsm8k-cot", "math500"] + _CHAT)
    for m in _THINKING:  # sampled: the chat tasks only
      jobs[m + "@sampled"] = {
          "model": m,
          "depths": ["baseline"],
          "samplings": {"t1.0_p0.7": BOTH["t1.0_p0.7"]},
          "tasks": _CHAT,
      }
    return jobs
  raise ValueError(f"unknown release experiment {name!r} (presets: 100, 101, 110, 111, 112, 113)")


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.experiment = arg or "110"
  experiment(c.experiment)  # an unknown name fails here; the runner reads the jobs from `experiment`
  c.bundled = True  # map the release's models to the bundled ones and its tasks to the offline twins
  c.models = {}  # release model name -> checkpoint dir (bundled=False); absent: the name itself
  c.lane_capacity = "worst"  # LoopSpec's lane table: skip-free, as the release caps nothing ('': our default)
  c.include = ""  # comma-separated release model names to run ('': every model of the experiment)
  c.limit = 2  # documents per task (none: all, as the release runs); 2 keeps a bundled run short
  c.max_gen_toks_cap = 32  # bundled only: the tiny models' context is 256 positions
  c.seed = SEED
  c.dtype = "float32"
  c.think_end_token = ""  # chat tasks: the response is the text after it (e.g. '</think>'); '' = the whole text
  c.allow_code_execution = False  # the coding tasks run model-written code: opt in
  c.out_dir = f"results/release/{c.experiment}"
  return c
