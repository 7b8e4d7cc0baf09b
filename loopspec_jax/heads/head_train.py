"""What the head trainers share (`loopspec-train` with `config.heads_kind`: medusa_train.py, eagle_train.py):
a frozen target, its own corpus, AdamW, and resumable orbax checkpoints.

The data is the target's own corpus (`train.data`: tiny-shakespeare minus its held-out tail, GSM8K train,
stdlib source) tokenized with the TARGET's tokenizer, so token ids mean what the target means by them; batch
k is `data.batch_at(corpus, k, seed=...)` and any randomness of step k (EAGLE's feature noise) is keyed by
(seed, k): a function of (seed, k) only. Orbax checkpoints of {head params, opt state, step} in `workdir`
every `save_every` steps (and at the last) make a rerun continue exactly where the last one stopped: a run
stopped after N steps and restarted ends with the same parameters, optimizer state and losses as one run
straight through (tests/heads/test_heads_train.py).
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.heads import artefact
from loopspec_jax.train import data as D
from loopspec_jax.train import trainer as T


def target_corpus(model, stdlib_max_bytes: int) -> D.Corpus:
  """The training corpus tokenized with the target's own tokenizer (documents joined by its eos)."""
  tok = model.tokenizer
  docs = D.corpus_docs(stdlib_max_bytes)
  eot = tok.token_to_id(D.EOT)
  tokens = {}
  for src in D.SOURCES:
    parts = []
    for enc in tok.encode_batch(docs[src]):
      parts += [np.asarray(enc.ids, np.int32), np.asarray([eot], np.int32)]
    tokens[src] = np.concatenate(parts)
  return D.Corpus(tokens, tok, "target-" + (artefact.tokenizer_digest(tok) or "none")[:16])


def heldout_windows(model, seq_len: int, n: int) -> np.ndarray:
  """The first n non-overlapping [seq_len + 1] windows of held-out Shakespeare, in the target's tokens."""
  ids = np.asarray(model.tokenizer.encode(D.heldout_shakespeare()).ids, np.int32)
  n = min(n, (len(ids) - 1) // seq_len)
  return np.stack([ids[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)])


class HeadTrainer(T.Checkpointed):
  """A head training run on a frozen target described by a configs/train/*.py ConfigDict; resumes from
  workdir (`trainer.Checkpointed`: the model trainer's checkpoints). Subclasses give `init_state()`
  ({"params", "opt_state", "step"}) and `update(state, step)` (one optimizer step on batch `step`: (new
  state, metrics dict with "loss"))."""

  def __init__(self, config, workdir: Optional[str] = None, model=None, corpus: Optional[D.Corpus] = None):
    from loopspec_jax import api

    c = self.config = config
    self.model = model if model is not None else api.load(c.target)
    self.cfg = self.model.config
    self.workdir = os.path.abspath(workdir or c.workdir)
    self.corpus = corpus if corpus is not None else target_corpus(self.model, c.data.stdlib_max_bytes)
    hyper = (c.lr, c.steps, c.warmup_steps, c.min_lr_ratio, c.weight_decay, c.grad_clip, c.b1, c.b2)
    types = (float, int, int, float, float, float, float, float)
    self.opt, self.schedule = T.make_optimizer(*(t(x) for t, x in zip(types, hyper)))
    self.history: list = []  # (step, loss) of every step this trainer ran
    self._mngr = None

  def batch(self, step: int) -> np.ndarray:
    c = self.config
    w = dict(c.data.weights)
    return D.batch_at(self.corpus, step, seed=c.seed, batch_size=c.batch_size, seq_len=c.seq_len, weights=w)

  def step_key(self, step: int):
    """The randomness of step `step` (a function of (seed, step) only)."""
    return jax.random.fold_in(jax.random.PRNGKey(int(self.config.seed)), step)

  def init_state(self):
    raise NotImplementedError

  def update(self, state, step: int):
    raise NotImplementedError

  def _log(self, done: int, metrics: dict, t0: float) -> None:
    rec = {"step": done, **{k: np.asarray(v).round(4).tolist() for k, v in metrics.items()}}
    rec["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(rec), flush=True)
    os.makedirs(self.workdir, exist_ok=True)
    with open(os.path.join(self.workdir, "metrics.jsonl"), "a") as f:
      f.write(json.dumps(rec) + "\n")

  def train(self, stop_at: Optional[int] = None):
    """Trains from the last checkpoint (or from scratch) to config.steps, or to `stop_at` steps if smaller
    (a checkpoint is written there too, so a later call continues from it)."""
    c = self.config
    total = c.steps if stop_at is None else min(stop_at, c.steps)
    state = self.restore_or_init()
    t0 = time.time()
    for step in range(int(state["step"]), total):
      state, m = self.update(state, step)
      self.history.append((step, float(m["loss"])))
      done = step + 1
      if done % c.log_every == 0 or done == total:
        self._log(done, m, t0)
      self.save(state, force=done == total)
    return state
