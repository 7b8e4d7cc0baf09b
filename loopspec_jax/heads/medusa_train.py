"""Training Medusa-1 heads on a frozen target (`loopspec-train --config=train/tiny_raven_medusa.py`).

The data is the target's own corpus (`train.data`: tiny-shakespeare minus its held-out tail, GSM8K train,
stdlib source) tokenized with the TARGET's tokenizer, so token ids mean what the target means by them; batch
k is `data.batch_at(corpus, k, seed=...)`, a function of (seed, k) only. Per step the frozen target's final
features of the batch are computed once (full depth R, stop_gradient) and the heads take one AdamW step on
the summed per-head cross-entropy (`medusa.loss`). Orbax checkpoints of (head params, opt state, step) in
`workdir` make a rerun resume exactly. `export` saves the artefact (`heads.artefact.save`) with a model card
holding held-out per-head top-1 accuracy.
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
from loopspec_jax.heads import medusa
from loopspec_jax.train import data as D
from loopspec_jax.train import trainer as T

TEST_WINDOWS = 2  # the first held-out windows, whose figures the test suite recomputes


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


def make_step(cfg, opt):
  def step(state, tparams, tokens):
    feats = medusa.features(tparams, tokens, cfg)
    (l, xent), g = jax.value_and_grad(medusa.loss, has_aux=True)(state["params"], feats, tokens)
    upd, opt_state = opt.update(g, state["opt_state"], state["params"])
    params = jax.tree_util.tree_map(lambda p, u: p + u, state["params"], upd)
    return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, {"loss": l, "xent": xent}

  return jax.jit(step, donate_argnums=(0,))


class MedusaTrainer:
  """A Medusa head training run described by a configs/train/*_medusa.py ConfigDict; resumes from workdir."""

  def __init__(self, config, workdir: Optional[str] = None, model=None):
    from loopspec_jax import api

    c = self.config = config
    self.model = model if model is not None else api.load(c.target)
    self.cfg = self.model.config
    self.workdir = os.path.abspath(workdir or c.workdir)
    self.corpus = target_corpus(self.model, c.data.stdlib_max_bytes)
    self.opt, self.schedule = T.make_optimizer(
        float(c.lr),
        int(c.steps),
        int(c.warmup_steps),
        float(c.min_lr_ratio),
        float(c.weight_decay),
        float(c.grad_clip),
        float(c.b1),
        float(c.b2),
    )
    self.step_fn = make_step(self.cfg, self.opt)
    self._mngr = None

  def batch(self, step: int) -> np.ndarray:
    c = self.config
    w = dict(c.data.weights)
    return D.batch_at(self.corpus, step, seed=c.seed, batch_size=c.batch_size, seq_len=c.seq_len, weights=w)

  def init_state(self):
    hp = medusa.init_params(self.model.params, self.cfg, int(self.config.num_heads))
    return {"params": hp, "opt_state": self.opt.init(hp), "step": jnp.int32(0)}

  @property
  def manager(self):
    import orbax.checkpoint as ocp

    if self._mngr is None:
      opts = ocp.CheckpointManagerOptions(max_to_keep=2, create=True, enable_async_checkpointing=False)
      self._mngr = ocp.CheckpointManager(os.path.join(self.workdir, "checkpoints"), options=opts)
    return self._mngr

  def restore_or_init(self):
    import orbax.checkpoint as ocp

    last = self.manager.latest_step()
    if last is None:
      return self.init_state()
    state = self.manager.restore(last, args=ocp.args.StandardRestore(jax.eval_shape(self.init_state)))
    return jax.tree_util.tree_map(jnp.asarray, state)

  def train(self, stop_at: Optional[int] = None):
    import orbax.checkpoint as ocp

    c = self.config
    total = c.steps if stop_at is None else min(stop_at, c.steps)
    state = self.restore_or_init()
    t0 = time.time()
    for step in range(int(state["step"]), total):
      state, m = self.step_fn(state, self.model.params, jnp.asarray(self.batch(step)))
      done = step + 1
      if done % c.log_every == 0 or done == total:
        rec = {"step": done, "loss": float(m["loss"]), "xent": np.asarray(m["xent"]).round(4).tolist()}
        rec["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(rec), flush=True)
        os.makedirs(self.workdir, exist_ok=True)
        with open(os.path.join(self.workdir, "metrics.jsonl"), "a") as f:
          f.write(json.dumps(rec) + "\n")
      if done % c.save_every == 0 or done == total:
        if self.manager.latest_step() != done:
          self.manager.save(done, args=ocp.args.StandardSave(state), force=True)
          self.manager.wait_until_finished()
    return state

  def close(self):
    if self._mngr is not None:
      self._mngr.close()
      self._mngr = None

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

On the first {ev["test_windows"]} windows only (recomputed by tests/test_medusa.py):
{", ".join(f"{a:.4%}" for a in ev["test_accuracy"])} (LM head, heads 0..{k - 1}).
"""
