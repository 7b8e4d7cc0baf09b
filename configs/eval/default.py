"""Task accuracy beside decoding speed through lm-evaluation-harness (loopspec-evaluate).

  loopspec-evaluate                                    # this config: tiny-raven, the offline GSM8K-CoT + MATH-500
  loopspec-evaluate --config=eval/default.py:bundled   # the docs/evaluation.md table (4 tasks, 10 documents, 3 methods)
  loopspec-evaluate --config=eval/default.py:quick     # 2 GSM8K-CoT documents, AR and LoopSpec
  loopspec-evaluate --config.model=/path/to/huginn-0125 --config.dtype=bfloat16 --config.init_state=random \
      --config.methods='ar;loopspec:d1=2,d2=8' --config.tasks=gsm8k_cot,minerva_math500 --config.limit=none
  loopspec-evaluate --config.apply_chat_template=true --config.enable_thinking=true ...  # a chat model's tasks

Tasks are lm-eval task names: the offline ones of loopspec_jax/tasks/ (loopspec_gsm8k_cot,
loopspec_minerva_math500, loopspec_humaneval, loopspec_mbpp, loopspec_shakespeare) or, on a machine that reaches
the hub, any upstream name (gsm8k_cot, minerva_math500, humaneval, mbpp, bbh, mmlu_pro, aime, ...). Methods are
`;`-separated specs 'name:arg=value,...' (`none` for an absent depth); list 'ar' first so the other rows get a
speed ratio. One JSONL row per (task, method) goes to <out_dir>/eval.jsonl as soon as it is measured; a rerun
skips the rows already there.
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.model = "tiny-raven"  # bundled model name, HF checkpoint dir or loopspec_jax.save() dir
  c.model_label = ""  # display name (default: the spec)
  c.tokenizer = ""  # tokenizer.json / bundled model name for checkpoints without a tokenizer; '' = the model's
  c.dtype = "float32"  # parameter dtype when loading: float32, bfloat16 or float16
  c.init_state = "zeros"  # Raven / Huginn: 'random' is the release's (and Huginn's) random initial state
  c.apply_chat_template = False  # the harness's apply_chat_template: prompts through the model's chat template
  c.chat_template = ""  # a Jinja file or template text ('' = the one the checkpoint ships)
  c.enable_thinking = config_dict.placeholder(bool)  # passed to the chat template; none: not passed
  c.think_end_token = ""  # the response is the text after it (a thinking model's end of thought); '' = none
  c.tasks = "loopspec_gsm8k_cot,loopspec_minerva_math500"  # comma-separated lm-eval task names
  c.methods = "ar;loopspec:d1=2,d2=8"  # ';'-separated method specs
  c.limit = config_dict.placeholder(int)  # documents per task; none: all
  c.num_fewshot = config_dict.placeholder(int)  # none: each task's own
  c.gen_kwargs = ""  # the harness's generation overrides, e.g. 'max_gen_toks=64' ('' = the tasks' own)
  c.batch_size = 1  # requests per generate call (1: one request at a time, as the paper measures)
  c.max_gen_toks = config_dict.placeholder(int)  # budget of tasks that set none; none: min(256, context / 2)
  c.depth = config_dict.placeholder(int)  # readout depth of loglikelihood requests; none: full depth R
  c.seed = 0  # sampled decoding's base seed
  c.warmup = True  # run each new compiled shape once untimed, so tok/s excludes compilation
  c.allow_code_execution = False  # code tasks run model-written code: opt in (sets HF_ALLOW_CODE_EVAL=1)
  c.offline = "auto"  # 'auto': HF offline mode when every task is a loopspec_* one; 'true' / 'false' force it
  c.bootstrap_iters = 100000  # the harness's stderr bootstrap (0: none)
  c.log_samples = True  # also write the harness's per-document samples to <out_dir>/samples/
  c.out_dir = "results/eval"
  c.stop_after = config_dict.placeholder(int)  # raise after this many new rows (a killed run, for tests)
  c.progress = True
  if (
      arg == "bundled"
  ):  # the docs/evaluation.md table: the bundled Huginn-style model, four offline tasks, three methods
    c.tasks = "loopspec_gsm8k_cot,loopspec_minerva_math500,loopspec_humaneval,loopspec_mbpp"
    c.methods = "ar;chain:d1=2,gamma=8;loopspec:d1=2,d2=8"
    c.limit = 10
    c.gen_kwargs = "max_gen_toks=96"
    c.allow_code_execution = True
    c.out_dir = "results/eval_bundled"
  elif arg == "quick":
    c.tasks = "loopspec_gsm8k_cot"
    c.limit = 2
    c.gen_kwargs = "max_gen_toks=32"
    c.bootstrap_iters = 0
    c.out_dir = "results/eval_quick"
  elif arg:
    raise ValueError(f"unknown preset {arg!r}; known: bundled, quick")
  return c
