"""Training Medusa-1 heads on a frozen target (`loopspec-train --config=train/tiny_raven_medusa.py`).

The data is the target's own corpus (`train.data`: tiny-shakespeare minus its held-out tail, GSM8K train,
stdlib source) tokenized with the TARGET's tokenizer, so token ids mean what the target means by them; batch
k is `data.batch_at(corpus, k, seed=...)`, a function of (seed, k) only. Per step the frozen target's final
features of the batch are computed once (full depth R, stop_gradient) and the heads take one AdamW step on
the summed per-head cross-entropy (`medusa.loss`). Orbax checkpoints of (head params, opt state, step) in
`workdir` make a rerun resume exactly (`head_train.HeadTrainer`). `export` saves the artefact
(`heads.artefact.save`) with a model card holding held-out per-head top-1 accuracy.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.heads import artefact
from loopspec_jax.heads import head_train
from loopspec_jax.heads import medusa
from loopspec_jax.train import data as D

TEST_WINDOWS = 2  # the first held-out windows, whose figures the test suite recomputes


target_corpus = head_train.target_corpus
heldout_windows = head_train.heldout_windows


def make_step(cfg, opt):
  def step(state, tparams, tokens):
    feats = medusa.features(tparams, tokens, cfg)
    (l, xent), g = jax.value_and_grad(medusa.loss, has_aux=True)(state["params"], feats, tokens)
    upd, opt_state = opt.update(g, state["opt_state"], state["params"])
    params = jax.tree_util.tree_map(lambda p, u: p + u, state["params"], upd)
    return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, {"loss": l, "xent": xent}

  return jax.jit(step, donate_argnums=(0,))


class MedusaTrainer(head_train.HeadTrainer):
  """A Medusa head training run described by a configs/train/*_medusa.py ConfigDict; resumes from workdir."""

  def __init__(self, config, workdir: Optional[str] = None, model=None, corpus=None):
    super().__init__(config, workdir, model, corpus)
    self.step_fn = make_step(self.cfg, self.opt)

  def init_state(self):
    hp = medusa.init_params(self.model.params, self.cfg, int(self.config.num_heads))
    return {"params": hp, "opt_state": self.opt.init(hp), "step": jnp.int32(0)}

  def update(self, state, step: int):
    return self.step_fn(state, self.model.params, jnp.asarray(self.batch(step)))

  def heads(self, state) -> artefact.Heads:
    hp = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), jax.device_get(state["params"]))
    cfg = medusa.config_of(self.cfg, int(self.config.num_heads))
    return artefact.Heads(medusa.KIND, hp, cfg, artefact.target_signature(self.model))

  def evaluate(self, heads: artefact.Heads) -> dict:
    c = self.config
    w = heldout_windows(self.model, c.seq_len, c.card_eval_windows)
    return {
        "windows": int(len(w)),
        "seq_len": int(c.seq_len),
        "accuracy": medusa.heldout_accuracy(heads, self.model, w),
        "test_windows": TEST_WINDOWS,
        "test_accuracy": medusa.heldout_accuracy(heads, self.model, w[:TEST_WINDOWS]),
    }

  def export(self, state, out_dir: str, command: str = "", seconds: Optional[float] = None) -> dict:
    h = self.heads(state)
    ev = self.evaluate(h)
    ev.update(steps=int(state["step"]), train_seconds=seconds)
    artefact.save(out_dir, h, card=model_card(self.config, self.cfg, ev, command, seconds, self.corpus))
    with open(os.path.join(out_dir, "eval.json"), "w") as f:
      json.dump(ev, f, indent=1)
    return ev


def accuracy_rows(acc) -> str:
  names = ["LM head (t + 1)"] + [f"head {i} (t + {i + 2})" for i in range(len(acc) - 1)]
  return "\n".join(f"| {n} | {a:.2%} |" for n, a in zip(names, acc))


def model_card(c, cfg, ev: dict, command: str, seconds, corpus) -> str:
  k = int(c.num_heads)
  n_par = k * (cfg.hidden_size**2 + cfg.hidden_size + cfg.hidden_size * cfg.vocab_size)
  toks = ev["steps"] * c.batch_size * (c.seq_len + 1)
  wall = f" ({seconds / 60:.1f} min wall, 2 shared vCPUs loaded by other jobs)" if seconds else ""
  return f"""# {c.name}

Medusa-1 heads (Cai et al., 2024) for the bundled `{c.target}` ({cfg.family}, hidden {cfg.hidden_size}, vocab
{cfg.vocab_size}, R = {cfg.recurrence}): {k} heads on the target's final feature at depth R (post-coda and post
final norm: the vector the LM head multiplies, `looped.readout_features`); head i predicts the token i + 2
ahead. Each head: z = h + silu(W h + b) (W, b zero-initialised), logits = z P (P initialised from the
target's tied LM head). {n_par:,} parameters (float32). Load with `lj.load_heads("{c.name}")`; decode with
`lj.generate(model, prompts, method="medusa", heads=..., tree_nodes=16)`.

## Data
The target's own corpus (`loopspec_jax.train.data`, tokenized with the target's tokenizer): tiny-shakespeare
without its last {D.HELDOUT_FRACTION:.0%} (held out), GSM8K train, Python stdlib source (capped at
{c.data.stdlib_max_bytes:,} characters); windows of {c.seq_len + 1} tokens sampled with weights
{dict(c.data.weights)}, data seed {c.seed}. Corpus tokens: {", ".join(f"{s} {len(v):,}" for s, v in corpus.tokens.items())}.

## Training
- Backbone frozen: per step the target's depth-{cfg.recurrence} features of the batch (zero initial state),
  under stop_gradient; loss = sum over heads of the mean cross-entropy against the token i + 2 ahead.
- {ev["steps"]} steps x batch {c.batch_size} x {c.seq_len + 1} tokens = {toks:,} tokens; AdamW lr {c.lr}
  (warmup {c.warmup_steps}, cosine to {c.lr * c.min_lr_ratio:g}), weight decay {c.weight_decay}, clip {c.grad_clip}.
- Command: `{command}`{wall}.

## Held-out per-head top-1 accuracy
Held-out Shakespeare, {ev["windows"]} windows of {ev["seq_len"] + 1} tokens (each its own full-sequence forward):
fraction of positions t whose argmax equals the token it predicts.

| predictor | top-1 accuracy |
|---|---|
{accuracy_rows(ev["accuracy"])}

On the first {ev["test_windows"]} windows only (recomputed by tests/decoding/tree/test_medusa.py):
{", ".join(f"{a:.4%}" for a in ev["test_accuracy"])} (LM head, heads 0..{k - 1}).
"""
