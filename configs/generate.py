"""Settings of the `loopspec-generate` console script (experiments/generate.py).

Override fields on the command line, e.g.
  loopspec-generate --config.prompt_ids=1,2,3 --config.max_new_tokens=16
  loopspec-generate --config.checkpoint=/path/to/Ouro-1.4B --config.prompt="Hello" --config.method=loopspec \
      --config.d1=1 --config.d2=2
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown preset {arg!r} (override fields with --config.<field>=<value>)")
  c = ml_collections.ConfigDict()
  # A checkpoint directory (HF config.json + safetensors, or one saved by loopspec_jax.save) or the name of a
  # bundled model (loopspec_jax.bundled_models()).
  c.checkpoint = "tiny-raven"
  c.prompt = "ROMEO:\n"  # text, encoded with the checkpoint's tokenizer.json when it has one
  c.prompt_ids = "1,2,3,4,5,6,7,8"  # comma-separated token ids: used when there is no prompt text or tokenizer
  c.max_new_tokens = 32
  c.method = "ar"  # 'ar', 'chain' (d1, gamma) or 'loopspec' (d1, d2)
  c.d1 = config_dict.placeholder(int)  # none: the method's default
  c.d2 = config_dict.placeholder(int)
  c.gamma = config_dict.placeholder(int)
  c.temperature = 0.0  # 0: greedy
  c.top_k = 0  # 0: no top-k filter
  c.top_p = 1.0
  c.seed = 0
  return c
