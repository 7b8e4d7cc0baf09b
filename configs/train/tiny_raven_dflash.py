"""tiny-raven-dflash: a DFlash block drafter on the frozen bundled tiny-raven (R = 32; depths 1, 16, 32), the
settings of train/tiny_ouro_dflash.py (`loopspec_jax/heads/dflash.py`, `loopspec_jax/heads/dflash_train.py`).

  loopspec-train --config=train/tiny_raven_dflash.py
"""

from loopspec_configs.train.tiny_ouro_dflash import dflash_config


def get_config(arg=None):
  del arg
  return dflash_config("tiny-raven", steps=300)  # R = 32: each step runs the target 8x deeper
