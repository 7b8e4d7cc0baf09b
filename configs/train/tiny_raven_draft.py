"""tiny-raven-draft: a plain (non-looped, R = 1) 2-layer transformer drafting for tiny-raven (method="draft").

Same corpus, tokenizer (2048-token byte-level BPE, `<|endoftext|>` = 0) and context as tiny-raven, so its token
ids mean the same thing; 689,280 parameters and 2 layer calls per token against tiny-raven's 66 at R = 32.
Trained with the Ouro objective, which at R = 1 is the ordinary next-token loss.
"""

from loopspec_configs.models._common import model_config
from loopspec_configs.train._base import base_config

HIDDEN = 128


def get_config(arg=None):
  if arg:
    raise ValueError(f"unknown preset {arg!r} (override fields with --config.<field>=<value>)")
  c = base_config()
  c.name = "tiny-raven-draft"
  c.model = model_config(
      family="ouro",
      vocab_size=2048,
      hidden_size=HIDDEN,
      num_heads=4,
      num_kv_heads=4,
      head_dim=32,
      intermediate_size=384,
      n_prelude=0,
      n_core=2,
      n_coda=0,
      recurrence=1,
      max_len=256,
      rope_theta=10000.0,
      rope_interleaved=False,
      tie_embeddings=True,
      eos_id=0,
  )
  c.objective = "ouro"
  c.steps = 600
  c.batch_size = 16
  c.seq_len = 256
  c.lr = 3e-3
  c.warmup_steps = 30
  c.max_recurrence = 1
  c.init_state = "zeros"
  c.workdir = "/tmp/loopspec_train/tiny-raven-draft"
  c.eval_every = 200
  c.save_every = 100
  c.eval_depths = (1,)
  c.card_depths = (1,)
  c.export_dir = "loopspec_jax/assets/models/tiny-raven-draft"
  return c
