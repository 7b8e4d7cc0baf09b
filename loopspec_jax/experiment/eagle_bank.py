"""EAGLE heads trained from a recorded feature bank: the bundled tiny-raven heads' recipe (`train_eagle`).

The frozen target's features (final hidden state and the states at the fused feature's depths) are recorded
once over training windows of its own corpus and held-out windows; each feature choice's head is trained on
random crops of that bank; `bundle` copies a trained head into the assets with its model card and check
figure. (loopspec_jax/heads/eagle_train.py is the resumable trainer that computes features per step.)
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loopspec_jax.heads import artefact
from loopspec_jax.heads import eagle as E
from loopspec_jax.train import data as D

SEQ = 256
WEIGHTS = {"shakespeare": 0.4, "gsm8k": 0.3, "stdlib": 0.3}


def record(model, windows: np.ndarray, depths, chunk: int = 8):
  """(hidden [W, N, E], states [W, N, 3E] at `depths`) of the frozen target over windows [W, N]."""
  cfg = model.config
  fn = jax.jit(lambda p, t, l: E.target_features(p, t, l, cfg, depths))
  hs, ss = [], []
  for i in range(0, len(windows), chunk):
    tok = jnp.asarray(windows[i : i + chunk])
    h, s = fn(model.params, tok, jnp.full((tok.shape[0],), tok.shape[1], jnp.int32))
    hs.append(np.asarray(h))
    ss.append(np.asarray(jnp.concatenate(list(s), axis=-1)))
  return np.concatenate(hs), np.concatenate(ss)


def heldout_accuracy(model, hp, config, bank, levels: int, chunk: int = 8):
  """Held-out top-1 accuracy of the head against the target's argmax at each draft level 1..levels."""
  cfg = model.config
  fn = jax.jit(lambda hp, t, r, h, l: E.level_accuracy(hp, model.params, config, t, r, h, l, levels, cfg))
  hits, counts = 0, 0
  tok, hid, states = bank
  for i in range(0, len(tok), chunk):
    raw = hid[i : i + chunk] if config["feature"] == "final" else states[i : i + chunk]
    n = jnp.full((len(tok[i : i + chunk]),), tok.shape[1], jnp.int32)
    a, c = fn(hp, jnp.asarray(tok[i : i + chunk]), jnp.asarray(raw), jnp.asarray(hid[i : i + chunk]), n)
    hits, counts = hits + np.asarray(a), counts + np.asarray(c)
  return (hits / np.maximum(counts, 1)).tolist()


def train_one(model, feature: str, train_bank, held_bank, args) -> dict:
  """Trains one feature's head on crops of the bank (AdamW, warmup then cosine; `args`: train_eagle's flags
  out, steps, batch, crop, lr, unroll, levels, seed, data_seed); saves the artefact and train.json (the
  figures, returned) under args.out/<feature>/."""
  cfg = model.config
  config = E.head_config(cfg, feature, unroll=args.unroll)
  hp = E.init_params(config, jax.random.PRNGKey(args.seed))
  sched = optax.warmup_cosine_decay_schedule(0.0, args.lr, min(20, args.steps // 4), max(args.steps, 1), args.lr * 0.1)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=0.0))
  state = opt.init(hp)
  tok, hid, states = train_bank

  @jax.jit
  def update(hp, state, t, r, h, key):
    n = jnp.full((t.shape[0],), t.shape[1], jnp.int32)
    (l, m), g = jax.value_and_grad(E.loss, has_aux=True)(hp, model.params, config, t, r, h, n, key, cfg)
    upd, state = opt.update(g, state, hp)
    return optax.apply_updates(hp, upd), state, l, m

  rng = np.random.default_rng(args.seed)
  t0 = time.time()
  crop = min(args.crop, tok.shape[1])
  for i in range(args.steps):
    idx = rng.choice(len(tok), args.batch, replace=False)
    at = int(rng.integers(0, tok.shape[1] - crop + 1))
    cut = lambda x: x[idx, at : at + crop]
    raw = cut(hid) if feature == "final" else cut(states)
    hp, state, l, m = update(hp, state, cut(tok), raw, cut(hid), jax.random.PRNGKey(1000 + i))
    if i % 25 == 0 or i == args.steps - 1:
      print(
          f"[{feature}] step {i} loss {float(l):.4f} " + " ".join(f"{k} {float(v):.3f}" for k, v in m.items()),
          flush=True,
      )
  wall = time.time() - t0
  acc = heldout_accuracy(model, hp, config, held_bank, args.levels)
  out = os.path.join(args.out, feature)
  heads = artefact.Heads(E.KIND, hp, config, artefact.target_signature(model))
  artefact.save(out, heads)
  figures = dict(
      feature=feature,
      depths=config["depths"],
      steps=args.steps,
      batch=args.batch,
      crop=crop,
      lr=args.lr,
      unroll=args.unroll,
      noise=config["noise"],
      data_seed=args.data_seed,
      train_windows=len(tok),
      heldout_windows=len(held_bank[0]),
      train_seconds=wall,
      heldout_top1=acc,
  )
  with open(os.path.join(out, "train.json"), "w") as f:
    json.dump(figures, f, indent=1)
  print(json.dumps(figures), flush=True)
  return figures


# the bundled name of each feature's head: the better one (fused, docs/heads-benchmark.md) is tiny-raven-eagle
BUNDLED_NAMES = {"fused": "tiny-raven-eagle", "final": "tiny-raven-eagle-final"}

CARD = """# {name}

An EAGLE draft head (loopspec_jax/heads/eagle.py) for the bundled `tiny-raven` target, used by
`generate(model, prompts, method="eagle", heads=lj.load_heads("{name}"), gamma=6, branch=4,
tree_nodes=32)`. Feature: **{feature}** {feature_note}. The head: {fuse_note}fc(2E -> E) over [embedding of the next
token; the feature], one huginn transformer block (the target's own block code), then the target's frozen
final norm and LM head; {n_params:,} parameters.

## Data
Features recorded from the frozen tiny-raven (full depth R = 32, zero initial state) over {train_windows}
windows of 257 tokens of its own training corpus (`loopspec_jax.train.data.batch_at`, seed {data_seed}, source
weights {weights}), trained on random crops of {crop} tokens. Held-out: the first {heldout_windows} windows of
the held-out Shakespeare tail (`eval_windows`, never trained on by the target or the head).

## Training
- SmoothL1 on the next final feature (weight 1.0) + cross-entropy against the target's distribution at the
  next position (weight 0.1); teacher features perturbed by uniform noise U(-{half_noise}, {half_noise});
  unrolled {unroll} steps (steps after the first read the head's own fed-back output, as drafting does).
- {steps} steps x batch {batch} x {crop} tokens; AdamW lr {lr} (warmup, cosine to 10%), clip 1.0, seed 0.
- Command: `{command}` (the other feature: the same with `--features <it>`; {train_seconds:.0f} s of training wall for this
  head under `nice -n 10` on a 2-vCPU AMD EPYC VM loaded by other jobs, plus the feature recording).

## Held-out top-1 accuracy per draft level
Fraction of held-out positions where the head's argmax at draft level k (teacher-forced corpus tokens, its own
fed-back features from level 2 on) equals the target's argmax at that position.

| level | {feature} (this head) | {other} |
|---|---|---|
{rows}

Check figure (tests/decoding/tree/test_eagle.py reproduces it): on the first {check_windows} held-out windows the bundled
head's top-1 accuracy per level is {check_text}.
"""


def bundle(model, src: str, other: dict, dest: str, check_windows: int, command: str):
  """Copies the trained head in `src` to `dest` with its MODEL_CARD.md and eval.json (figures and the check
  figure the test reproduces on the first `check_windows` held-out windows)."""
  heads = artefact.load(src)
  with open(os.path.join(src, "train.json")) as f:
    fig = json.load(f)
  corpus = D.load_corpus()
  held = D.eval_windows(corpus, SEQ, check_windows)
  bank = (held,) + record(model, held, heads.config["depths"] or [2, 16, 32])
  levels = len(fig["heldout_top1"])
  check = heldout_accuracy(model, heads.params, heads.config, bank, levels)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(heads.params))
  feature = fig["feature"]
  note = "(the post-coda final state)" if feature == "final" else f"(recurrent states at depths {fig['depths']})"
  rows = "\n".join(
      f"| {k + 1} | {100 * a:.1f}% | {100 * b:.1f}% |"
      for k, (a, b) in enumerate(zip(fig["heldout_top1"], other["heldout_top1"]))
  )
  card = CARD.format(
      name=os.path.basename(os.path.normpath(dest)),
      fuse_note="fc(3E -> E) fusing the three states into the feature, then " if feature == "fused" else "",
      feature=feature,
      feature_note=note,
      n_params=n_params,
      weights=WEIGHTS,
      half_noise=fig.get("noise", 0.2) / 2,
      command=command,
      other=other["feature"],
      rows=rows,
      check_windows=check_windows,
      check_text=", ".join(f"{100 * a:.1f}%" for a in check),
      **{
          k: fig[k]
          for k in ("train_windows", "heldout_windows", "crop", "unroll", "steps", "batch", "lr", "train_seconds")
      },
      data_seed=fig.get("data_seed", 27),
  )
  artefact.save(dest, heads, card=card)
  with open(os.path.join(dest, "eval.json"), "w") as f:
    json.dump(
        {"train": fig, "other": other, "check": {"seq_len": SEQ, "windows": check_windows, "top1": check}}, f, indent=1
    )
  print(card)


def feature_banks(model, train_windows: int, heldout_windows: int, data_seed: int, bank: str = None) -> tuple:
  """((windows, hidden, states) of training windows, the same of held-out windows): `train_windows` windows
  of the target's own corpus (`data.batch_at`, seed `data_seed`, WEIGHTS) and the first `heldout_windows`
  of the held-out Shakespeare tail, recorded at the fused feature's depths; cached in (and read back from)
  the .npz `bank` when given."""
  corpus = D.load_corpus()
  t0 = time.time()
  win = np.concatenate(
      [
          D.batch_at(corpus, s, seed=data_seed, batch_size=8, seq_len=SEQ, weights=WEIGHTS)
          for s in range(train_windows // 8)
      ]
  )
  held = D.eval_windows(corpus, SEQ, heldout_windows)
  depths = E.head_config(model.config, "fused")["depths"]
  if bank and os.path.exists(bank):
    z = np.load(bank)
    train_bank, held_bank = (z["win"], z["win_h"], z["win_s"]), (z["held"], z["held_h"], z["held_s"])
  else:
    train_bank = (win,) + record(model, win, depths)
    held_bank = (held,) + record(model, held, depths)
    if bank:
      np.savez(
          bank,
          win=win,
          win_h=train_bank[1],
          win_s=train_bank[2],
          held=held,
          held_h=held_bank[1],
          held_s=held_bank[2],
      )
  print(f"recorded {len(win)} + {len(held)} windows in {time.time() - t0:.1f}s", flush=True)
  return train_bank, held_bank
