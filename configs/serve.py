"""Settings of loopspec-serve (experiments/serve.py): the OpenAI-compatible server.

  loopspec-serve                                                   # tiny-raven, LoopSpec (2, 8), port 8000
  loopspec-serve --config.model=/path/to/huginn-0125 --config.method=loopspec:d1=2,d2=8 --config.slots=8
  loopspec-serve --config.method=ar --config.greedy_only=true --config.port=8001
  loopspec-serve --config=serve.py:quick                           # 2 slots, no warm-up (tests, a first look)

`method` is any method spec of the registry (loopspec_jax.methods: 'ar', 'chain:d1=2,gamma=4',
'loopspec:2,8', 'lookup:ngram=3,gamma=4', 'draft:gamma=4' with draft_model set, ...); 'none' spells an absent
value (`--config.max_len=none`).
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.model = "tiny-raven"  # bundled model name, checkpoint directory (HF or lj.save) or random:<family>:<variant>
  c.served_model_name = ""  # the model id clients send ('' = the model's basename)
  c.method = "loopspec:d1=2,d2=8"  # a method spec (loopspec_jax.methods)
  c.draft_model = ""  # method 'draft': the drafter's model spec
  c.slots = 4  # request slots decoded together (continuous batching)
  c.max_queue = 64  # waiting requests beyond which submissions get 429
  c.ticks_per_call = 16  # decode-loop iterations per device call
  c.greedy_only = False  # compile greedy kernels only (requests must use temperature 0)
  c.max_len = config_dict.placeholder(int)  # context per slot; none: the model's
  c.seed = 0  # the engine's base PRNG seed
  c.dtype = "float32"  # parameter dtype
  c.host = "127.0.0.1"
  c.port = 8000
  c.warmup = True  # compile (one short request) before /ready answers 200; the port opens at once
  c.max_body_bytes = 2 * 1024 * 1024  # larger request bodies get a 413 without being read
  c.chat_template = ""  # a Jinja chat template file for /v1/chat/completions ('' = the checkpoint's, if any)
  c.access_log = True  # one log line per request (uvicorn's access log)
  c.shutdown_timeout = 10.0  # SIGTERM: seconds to let requests finish, then open connections are closed
  if arg == "quick":
    c.slots, c.warmup = 2, False
  elif arg:
    raise ValueError(f"unknown preset {arg!r}: 'quick' or none (override fields with --config.<field>=<value>)")
  return c
