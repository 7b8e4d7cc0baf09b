"""Training our own small looped models (Raven/Huginn-style and Ouro-style) on an offline corpus.

`data` builds the corpus, tokenizer and batches; `trainer` the jitted step, checkpoints, eval and export.
"""

from loopspec_jax.train.data import heldout_shakespeare  # noqa: F401
