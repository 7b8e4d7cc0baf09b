"""Training small looped models with the project's own model functions (`pre`, `core_step`, `post`).

Two objectives:
- 'raven' (Huginn recipe): each step draws a recurrence depth r ~ Poisson(exp(N(log(mean) - sigma^2/2, sigma)))
  clipped to [1, max_recurrence], runs r core steps from a random (or zero) initial state and takes the loss of
  the depth-r readout. Gradients flow through the last `backprop_depth` steps only (truncated backprop): the
  first r - k steps run in a `lax.fori_loop` with a dynamic trip count on stop-gradient parameters.
  Optional `aux_depths` (our choice, not Huginn's): the readouts at a few fixed shallow depths get a loss too,
  with gradients through all their steps (a static scan from s0 that the depth-r branch then continues). It
  asks the recurrence to reach a good prediction early and the later steps to keep it, so early readouts agree
  with the full-depth one -- what self-speculative decoding needs.
- 'ouro': the loss at every depth 1..R (mean or sum), gradients through every step.
AdamW (warmup + cosine), global-norm clipping, optional bf16 compute with float32 master weights, orbax
CheckpointManager saves (params, opt state, step, rng) and exact resume: the batch of step k is a function of
(seed, k) only and the step's randomness is fold_in(rng, k).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loopspec_jax.checkpoint import native
from loopspec_jax.models import layers
from loopspec_jax.models import looped as M
from loopspec_jax.models.model import LoopedModel
from loopspec_jax.config import ModelConfig, from_config_dict
from loopspec_jax.train import data as D


# ---------------------------------------------------------------------------------------------------
# The loss functions (pure)
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Objective:
  """Static (hashable) settings of the training loss."""

  kind: str = "raven"  # 'raven' | 'ouro'
  mean_recurrence: float = 8.0
  sigma: float = 0.5
  max_recurrence: int = 32
  backprop_depth: int = 4
  aux_depths: tuple = ()
  aux_weight: float = 1.0
  ouro_reduce: str = "mean"  # 'mean' | 'sum' over depths
  init_state: str = "random"  # Raven initial state during training: 'random' (Huginn) or 'zeros'
  compute_dtype: str = "float32"
  mtp_weight: float = 0.0  # > 0: params["mtp"] is a DeepSeek-V3 MTP module (heads/mtp.py), loss weight lambda

  def __post_init__(self):
    if self.kind not in ("raven", "ouro"):
      raise ValueError(f"objective must be 'raven' or 'ouro', got {self.kind!r}")
    if self.ouro_reduce not in ("mean", "sum"):
      raise ValueError(f"ouro_reduce must be 'mean' or 'sum', got {self.ouro_reduce!r}")
    if self.init_state not in ("random", "zeros"):
      raise ValueError(f"init_state must be 'random' or 'zeros', got {self.init_state!r}")
    if self.backprop_depth < 1 or self.max_recurrence < 1:
      raise ValueError("backprop_depth and max_recurrence must be >= 1")


def sample_depth(key, obj: Objective):
  """r ~ Poisson(tau), log tau ~ N(log(mean) - sigma^2/2, sigma) (so E[tau] = mean), clipped to [1, max]."""
  k1, k2 = jax.random.split(key)
  mu = math.log(obj.mean_recurrence) - 0.5 * obj.sigma**2
  tau = jnp.exp(mu + obj.sigma * jax.random.normal(k1, ()))
  r = jax.random.poisson(k2, tau, ())
  return jnp.clip(r, 1, obj.max_recurrence).astype(jnp.int32)


def _xent(logits, targets):
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets))


def _setup(params, tokens, cfg: ModelConfig, obj: Objective):
  inp, tgt = tokens[:, :-1], tokens[:, 1:]
  b, t = inp.shape
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = M.causal_mask(jnp.full((b,), t, jnp.int32), t)
  cp = M.cast_params(params, jnp.dtype(obj.compute_dtype))
  return inp, tgt, pos, mask, cp


def raven_loss(params, tokens, key, cfg: ModelConfig, obj: Objective):
  """Huginn-style loss at a random depth r (plus optional fixed shallow depths). Returns (loss, metrics)."""
  none = layers.no_context
  inp, tgt, pos, mask, cp = _setup(params, tokens, cfg, obj)
  k_depth, k_init = jax.random.split(key)
  r = sample_depth(k_depth, obj)
  e, _, _ = M.pre(cp, inp, pos, mask, none, cfg)
  noise = M.random_state_noise(k_init, e.shape, cfg) if obj.init_state == "random" else None
  s0 = M.initial_state(e, cfg, noise)
  k = obj.backprop_depth
  p_ng, e_ng = jax.lax.stop_gradient(cp), jax.lax.stop_gradient(e)

  def step(p, e_, s):
    return M.core_step(p, s, e_, pos, mask, none, cfg)[0]

  def tail(s, n):
    """n more steps from s: max(n - k, 0) without gradients (dynamic), then min(n, k) with gradients."""
    n_ng = jnp.maximum(n - k, 0)
    s = jax.lax.fori_loop(0, n_ng, lambda _, x: step(p_ng, e_ng, x), jax.lax.stop_gradient(s))
    n_g = jnp.minimum(n, k)

    def body(x, i):  # the first k - n_g of the k static steps are skipped (masked)
      return jnp.where(i >= k - n_g, step(cp, e, x), x), None

    return jax.lax.scan(body, s, jnp.arange(k))[0]

  def readout_loss(s):
    return _xent(M.post(cp, s, pos, mask, none, cfg)[0], tgt)

  def main_and_mtp(s):
    """The main readout loss plus lambda * the MTP module's loss on the same depth-r features."""
    if not obj.mtp_weight:
      return readout_loss(s), {}
    from loopspec_jax.heads import mtp

    f = M.coda_hidden(cp, s, pos, mask, none, cfg)[0]
    main = _xent(M.readout_logits(cp, f, cfg), tgt)
    m_loss, m_acc = mtp.loss(cp["mtp"], cp, f, tgt, cfg)
    return main + obj.mtp_weight * m_loss, {"main_loss": main, "mtp_loss": m_loss, "mtp_acc": m_acc}

  metrics = {"depth": r}
  a = max(obj.aux_depths) if obj.aux_depths else 0
  if a:

    def fwd(x, _):
      x = step(cp, e, x)
      return x, x

    _, states = jax.lax.scan(fwd, s0, None, length=a)  # states[i] = s_{i+1}, gradients through all
    s_r = jax.lax.cond(
        r <= a,
        lambda: jax.lax.dynamic_index_in_dim(states, r - 1, keepdims=False),
        lambda: tail(jax.lax.stop_gradient(states[a - 1]), r - a),
    )
    aux = jnp.mean(jnp.stack([readout_loss(states[d - 1]) for d in obj.aux_depths]))
    main, extra = main_and_mtp(s_r)
    metrics.update({"main_loss": main, "aux_loss": aux, **extra})
    loss = main + obj.aux_weight * aux
  else:
    loss, extra = main_and_mtp(tail(s0, r))
    metrics.update({"main_loss": loss, **extra})
  return loss, metrics


def ouro_loss(params, tokens, key, cfg: ModelConfig, obj: Objective):
  """Ouro-style loss: the readout loss at every depth 1..R, averaged (or summed). Returns (loss, metrics)."""
  del key
  none = layers.no_context
  inp, tgt, pos, mask, cp = _setup(params, tokens, cfg, obj)
  e, _, _ = M.pre(cp, inp, pos, mask, none, cfg)

  def fwd(s, _):
    s = M.core_step(cp, s, e, pos, mask, none, cfg)[0]
    return s, _xent(M.post(cp, s, pos, mask, none, cfg)[0], tgt)

  _, losses = jax.lax.scan(fwd, M.initial_state(e, cfg), None, length=cfg.recurrence)
  loss = jnp.sum(losses) if obj.ouro_reduce == "sum" else jnp.mean(losses)
  return loss, {"main_loss": losses[-1], "first_loss": losses[0]}


def make_optimizer(
    lr: float,
    steps: int,
    warmup: int,
    min_lr_ratio: float,
    weight_decay: float,
    grad_clip: float,
    b1: float = 0.9,
    b2: float = 0.95,
):
  """AdamW with linear warmup and cosine decay; weight decay on matrices only; global-norm clipping."""
  sched = optax.warmup_cosine_decay_schedule(0.0, lr, max(warmup, 1), max(steps, warmup + 1), lr * min_lr_ratio)
  decay_mask = lambda p: jax.tree_util.tree_map(lambda x: x.ndim >= 2, p)
  return (
      optax.chain(
          optax.clip_by_global_norm(grad_clip),
          optax.adamw(sched, b1=b1, b2=b2, weight_decay=weight_decay, mask=decay_mask),
      ),
      sched,
  )


def _tree_norm(tree):
  return optax.tree.norm(tree) if hasattr(optax, "tree") else optax.global_norm(tree)


def make_train_step(cfg: ModelConfig, obj: Objective, opt):
  """A jitted `step(state, tokens) -> (state, metrics)`; state = {params, opt_state, step, rng}.

  `opt` must be hashable-stable for reuse: Trainer caches steps by their hyperparameters (`_cached_step`)."""
  loss_fn = raven_loss if obj.kind == "raven" else ouro_loss

  def train_step(state, tokens):
    key = jax.random.fold_in(state["rng"], state["step"])
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], tokens, key, cfg, obj)
    updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = dict(metrics, loss=loss, grad_norm=_tree_norm(grads))
    return {"params": params, "opt_state": opt_state, "step": state["step"] + 1, "rng": state["rng"]}, metrics

  return jax.jit(train_step, donate_argnums=(0,))


@functools.lru_cache(maxsize=8)
def _cached_step(cfg: ModelConfig, obj: Objective, opt_hp: tuple):
  """(optimizer, schedule, jitted step) per static setting, so a fresh Trainer reuses the compiled step."""
  opt, sched = make_optimizer(*opt_hp)
  return opt, sched, make_train_step(cfg, obj, opt)


@jax.jit
def _eval_logits_stats(logits, targets):
  """Per depth: mean loss and argmax tokens ([D, B, T, V] logits -> [D], [D, B, T])."""
  lp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(lp, targets[None, ..., None], axis=-1)[..., 0]
  return jnp.mean(nll, axis=(1, 2)), jnp.argmax(logits, axis=-1)


_forward = jax.jit(M.forward_depths, static_argnames=("depths", "cfg"))


def evaluate(params, windows: np.ndarray, depths, cfg: ModelConfig, batch_size: int = 4) -> dict:
  """Held-out loss by depth and greedy agreement (argmax equality) of each depth's readout with depth R.

  Full-sequence forwards (`model.forward_depths`, zero initial state: the decoders' default)."""
  depths = tuple(sorted(set(int(d) for d in depths) | {cfg.recurrence}))
  losses, agree, n = np.zeros(len(depths)), np.zeros(len(depths)), 0
  for i in range(0, len(windows), batch_size):
    w = jnp.asarray(windows[i : i + batch_size])
    inp, tgt = w[:, :-1], w[:, 1:]
    logits = _forward(params, inp, jnp.full((inp.shape[0],), inp.shape[1], jnp.int32), depths, cfg)
    nll, am = _eval_logits_stats(logits, tgt)
    cnt = inp.shape[0] * inp.shape[1]
    losses += np.asarray(nll) * cnt
    agree += np.asarray(jnp.sum(am == am[-1][None], axis=(1, 2)))
    n += cnt
  return {"depths": list(depths), "loss": (losses / n).tolist(), "agreement": (agree / n).tolist(), "tokens": n}


# ---------------------------------------------------------------------------------------------------
# The Trainer: data, checkpoints, progress, evaluation, export
# ---------------------------------------------------------------------------------------------------
def objective_from_config(c) -> Objective:
  return Objective(
      kind=c.objective,
      mean_recurrence=float(c.mean_recurrence),
      sigma=float(c.sigma),
      max_recurrence=int(c.max_recurrence),
      backprop_depth=int(c.backprop_depth),
      aux_depths=tuple(int(d) for d in c.aux_depths),
      aux_weight=float(c.aux_weight),
      ouro_reduce=c.ouro_reduce,
      init_state=c.init_state,
      compute_dtype=c.compute_dtype,
      mtp_weight=float(c.get("mtp_weight", 0.0)),
  )


class Checkpointed:
  """Orbax checkpoints of a training state ({"params", "opt_state", "step", ...}) in `self.workdir`: the
  model trainer's and the head trainers' (heads/head_train.py). Needs `self.config` (keep_checkpoints,
  save_every), `self.workdir`, `self._mngr` (None at first) and `self.init_state()`."""

  @property
  def manager(self):
    if self._mngr is None:
      import orbax.checkpoint as ocp

      opts = ocp.CheckpointManagerOptions(
          max_to_keep=self.config.keep_checkpoints, create=True, enable_async_checkpointing=False
      )
      self._mngr = ocp.CheckpointManager(os.path.join(self.workdir, "checkpoints"), options=opts)
    return self._mngr

  def restore_or_init(self):
    """The last saved state in workdir, else a fresh one."""
    import orbax.checkpoint as ocp

    last = self.manager.latest_step()
    if last is None:
      return self.init_state()
    abstract = jax.eval_shape(self.init_state)
    state = self.manager.restore(last, args=ocp.args.StandardRestore(abstract))
    return jax.tree_util.tree_map(jnp.asarray, state)

  def save(self, state, force: bool = False):
    import orbax.checkpoint as ocp

    step = int(state["step"])
    if force or step % self.config.save_every == 0:
      if self.manager.latest_step() != step:
        self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self.manager.wait_until_finished()

  def close(self):
    if self._mngr is not None:
      self._mngr.wait_until_finished()
      self._mngr.close()
      self._mngr = None


class Trainer(Checkpointed):
  """Owns a training run described by a configs/train/*.py ConfigDict; resumes from `workdir` if present."""

  def __init__(self, config, workdir: Optional[str] = None, corpus: Optional[D.Corpus] = None):
    self.config = config
    self.cfg = from_config_dict(config.model)
    self.obj = objective_from_config(config)
    self.workdir = os.path.abspath(workdir or config.workdir)
    self.corpus = corpus or D.load_corpus(
        config.data.cache_dir or None, config.data.vocab_size, config.data.stdlib_max_bytes, verbose=True
    )
    tv = self.corpus.tokenizer.get_vocab_size()
    if tv > self.cfg.vocab_size:
      raise ValueError(f"tokenizer has {tv} tokens but the model vocab_size is {self.cfg.vocab_size}")
    if self.cfg.eos_id is not None and self.cfg.eos_id != self.corpus.eot_id:
      raise ValueError(f"model eos_id {self.cfg.eos_id} != tokenizer's {D.EOT} id {self.corpus.eot_id}")
    if config.seq_len > self.cfg.max_len:
      raise ValueError(f"seq_len {config.seq_len} exceeds the model context {self.cfg.max_len}")
    opt_hp = (
        float(config.lr),
        int(config.steps),
        int(config.warmup_steps),
        float(config.min_lr_ratio),
        float(config.weight_decay),
        float(config.grad_clip),
        float(config.b1),
        float(config.b2),
    )
    self.opt, self.schedule, self.train_step = _cached_step(self.cfg, self.obj, opt_hp)
    self.weights = dict(config.data.weights)
    self._mngr = None
    self._eval_windows = None
    self.history = []  # (step, metrics) of the steps run by this object

  # -- data ---------------------------------------------------------------------------------------
  def batch(self, step: int) -> np.ndarray:
    """The [batch, seq_len + 1] token windows of `step` (a function of (seed, step) only)."""
    c = self.config
    return D.batch_at(self.corpus, step, seed=c.seed, batch_size=c.batch_size, seq_len=c.seq_len, weights=self.weights)

  def eval_windows(self, max_windows=None) -> np.ndarray:
    if self._eval_windows is None:
      self._eval_windows = D.eval_windows(self.corpus, self.config.seq_len)
    w = self._eval_windows
    return w if max_windows is None else w[:max_windows]

  # -- state and checkpoints ----------------------------------------------------------------------
  def init_state(self):
    key = jax.random.PRNGKey(self.config.seed)
    k_params, k_rng = jax.random.split(key)
    params = M.init_params(self.cfg, k_params, contraction=self.config.get("init_contraction", None))
    if self.obj.mtp_weight:
      if not self.cfg.is_raven or self.obj.kind != "raven":
        raise ValueError("mtp_weight > 0 needs a Raven-family model and the 'raven' objective")
      from loopspec_jax.heads import mtp

      params["mtp"] = mtp.init_params(self.cfg, jax.random.fold_in(k_params, 1))
    params = M.cast_params(params, jnp.float32)
    return {"params": params, "opt_state": self.opt.init(params), "step": jnp.int32(0), "rng": k_rng}

  # -- the loop -----------------------------------------------------------------------------------
  def train(self, stop_at: Optional[int] = None, progress: bool = True, state=None):
    """Trains from the last checkpoint (or scratch) up to `stop_at` (default: config.steps); returns state."""
    from tqdm.auto import tqdm

    c = self.config
    total = c.steps if stop_at is None else min(stop_at, c.steps)
    state = self.restore_or_init() if state is None else state
    start = int(state["step"])
    toks_per_step = c.batch_size * c.seq_len
    bar = tqdm(total=total, initial=start, disable=not progress, dynamic_ncols=True, mininterval=2.0, smoothing=0.1)
    t_last, n_last = time.perf_counter(), 0
    ema = None
    for step in range(start, total):
      state, metrics = self.train_step(state, jnp.asarray(self.batch(step)))
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      self.history.append((step, metrics))
      ema = metrics["loss"] if ema is None else 0.95 * ema + 0.05 * metrics["loss"]
      n_last += 1
      now = time.perf_counter()
      if now - t_last > 5.0 or step + 1 == total:
        post = {"loss": f"{ema:.3f}", "tok_s": f"{n_last * toks_per_step / (now - t_last):.0f}"}
        if "depth" in metrics:
          post["r"] = int(metrics["depth"])
        bar.set_postfix(post, refresh=False)
        t_last, n_last = now, 0
      bar.update(1)
      done = step + 1
      if c.log_every and done % c.log_every == 0:
        self._log({"step": done, "lr": float(self.schedule(done)), **metrics})
      if c.eval_every and done % c.eval_every == 0 and done < c.steps:
        ev = evaluate(state["params"], self.eval_windows(c.eval_windows), c.eval_depths, self.cfg)
        self._log({"step": done, "eval": ev}, echo=bar.write)
      self.save(state, force=(done == total))
    bar.close()
    return state

  def _log(self, rec: dict, echo=None):
    os.makedirs(self.workdir, exist_ok=True)
    with open(os.path.join(self.workdir, "metrics.jsonl"), "a") as f:
      f.write(json.dumps(rec) + "\n")
    if echo is not None and "eval" in rec:
      ev = rec["eval"]
      echo(
          f"step {rec['step']}: eval "
          + " ".join(f"d{d}:{l:.3f}/{a:.1%}" for d, l, a in zip(ev["depths"], ev["loss"], ev["agreement"]))
      )

  # -- export -------------------------------------------------------------------------------------
  def export(self, state, out_dir: str, command: str = "", train_seconds: Optional[float] = None) -> dict:
    """Saves the model (`loopspec_jax.save`) and writes MODEL_CARD.md with held-out numbers."""
    c = self.config
    params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), jax.device_get(state["params"]))
    head = params.pop("mtp", None)
    model = LoopedModel(self.cfg, params, self.corpus.tokenizer)
    native.save(model, out_dir)
    ev = evaluate(params, self.eval_windows(c.card_eval_windows), c.card_depths, self.cfg)
    card = model_card(c, self.cfg, ev, int(state["step"]), command, train_seconds, self.corpus)
    if head is not None:
      from loopspec_jax.heads import mtp

      card += mtp.export(model, head, c, self.eval_windows(c.card_eval_windows), int(state["step"]), command)
    with open(os.path.join(out_dir, "MODEL_CARD.md"), "w") as f:
      f.write(card)
    with open(os.path.join(out_dir, "eval.json"), "w") as f:
      json.dump(ev, f, indent=1)
    return ev


def model_card(c, cfg: ModelConfig, ev: dict, steps: int, command: str, seconds, corpus) -> str:
  """MODEL_CARD.md text: what the model is, how it was trained, and its held-out numbers by depth."""
  n_params = M.count_params(cfg)
  toks = steps * c.batch_size * c.seq_len
  if c.objective == "raven":
    recipe = (
        f"Huginn recipe: per step a depth r ~ Poisson(exp(N(log {c.mean_recurrence} - sigma^2/2, sigma="
        f"{c.sigma}))) clipped to [1, {c.max_recurrence}], loss at depth r, gradients through the last "
        f"{c.backprop_depth} steps, initial state '{c.init_state}'"
        + (
            f"; plus the loss at fixed depths {tuple(c.aux_depths)} (weight {c.aux_weight}) with gradients "
            f"through all their steps, so that early readouts agree with deep ones"
            if c.aux_depths
            else ""
        )
        + "."
    )
  else:
    recipe = f"Ouro-style: the {c.ouro_reduce} of the readout losses at every depth 1..{cfg.recurrence}."
  rows = "\n".join(f"| {d} | {l:.4f} | {a:.2%} |" for d, l, a in zip(ev["depths"], ev["loss"], ev["agreement"]))
  w = dict(c.data.weights)
  return f"""# {c.name}

A tiny {cfg.family} looped transformer (full depth R = {cfg.recurrence}) trained from scratch by
`loopspec_jax.train` for tests, demos and decoding benchmarks. It is a toy: expect Shakespeare-, GSM8K- and
Python-flavoured babble, not useful text.

## Model
- family `{cfg.family}`, hidden {cfg.hidden_size}, heads {cfg.num_heads} (kv {cfg.num_kv_heads}) x {cfg.head_dim},
  MLP {cfg.intermediate_size}, prelude/core/coda = {cfg.n_prelude}/{cfg.n_core}/{cfg.n_coda}, vocab {cfg.vocab_size},
  context {cfg.max_len}; {n_params:,} parameters (float32). Full config: `loopspec_config.json`.
- Tokenizer: byte-level BPE ({corpus.tokenizer.get_vocab_size()} tokens) trained on the corpus below;
  `{D.EOT}` (id {corpus.eot_id}) is the document separator and eos.

## Data
Offline only: tiny-shakespeare without its last {D.HELDOUT_FRACTION:.0%} of characters (held out), GSM8K train
(question + answer; the test split is never used), and Python standard-library source (tests excluded, capped at
{c.data.stdlib_max_bytes:,} characters). Windows of {c.seq_len} tokens, sampled with source weights {w}.
Corpus tokens: {", ".join(f"{k} {len(v):,}" for k, v in corpus.tokens.items())}.

## Training
- {recipe}
- {steps} steps x batch {c.batch_size} x {c.seq_len} tokens = {toks:,} tokens; AdamW lr {c.lr} (warmup
  {c.warmup_steps}, cosine to {c.lr * c.min_lr_ratio:g}), weight decay {c.weight_decay}, clip {c.grad_clip},
  compute {c.compute_dtype}, seed {c.seed}.
- Command: `{command}`{f" ({seconds / 60:.1f} min wall in the final process, on CPU cores shared with other jobs)"
                         if seconds else ""}.

## Held-out evaluation
{ev["tokens"]:,} tokens of held-out Shakespeare ({ev["tokens"] // c.seq_len} windows of {c.seq_len}), full-sequence
forward (`loopspec_jax.model.forward_depths`) from a zero initial state. Agreement = fraction of positions whose greedy
(argmax) token at depth d equals the one at depth R = {cfg.recurrence}.

| depth | loss (nats/token) | greedy agreement with depth {cfg.recurrence} |
|---|---|---|
{rows}
"""
