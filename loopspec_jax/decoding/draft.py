"""Speculative decoding with a separate draft model (Leviathan et al. 2023; Chen et al. 2023).

One round per iteration of one jitted `lax.while_loop`, for every request of the batch at once:

1. draft: a small model with the same tokenizer (any supported family, typically R = 1) runs gamma steps
   autoregressively from the last committed token at position p0, drafting x_1..x_gamma with distributions
   q_i = process(drafter logits) (greedy: argmax). Its first step also re-runs position p0 - 1, whose entries
   are missing after a round in which every draft was accepted (the bonus token's predecessor was never
   drafted from), so the drafter cache stays one exact prefix cache with no extra sequential step.
2. verify: the looped target runs the gamma + 1 positions p0..p0+gamma (x_0 = the committed token) through
   every depth R in ONE batched pass (`full_pass`) and reads them out at R.
3. accept: left to right with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection a token from
   norm(max(0, p_i - q_i)); a bonus token from p_{gamma+1} when all are accepted (`verify.verify_chain_upto`,
   greedy: the longest prefix equal to the target's argmax). Commit via `common.commit_tokens`.
4. roll back: both caches by length (entries past it are masked, then overwritten).

Expected tokens per verify pass (1 - a^(gamma+1)) / (1 - a) at acceptance rate a = 1 - TV(p, q)
(`adaptive.expected_tokens`). `gamma="auto"` picks each request's gamma from its past acceptance
(`decoding/adaptive.py`). The verify round (`verify_round`) and the state (`SpecState`) are shared with prompt
lookup (`decoding/lookup.py`), whose drafts are copied from earlier text instead.

On a mesh (`generate(..., mesh=)`) `initial_state` and `decode_loop` run as sharded entry points
(`parallel/sharding.py`): the drafter's parameters (argument kind 'draft_params') are sharded by the same rules
in the drafter's own head layout, and its KV cache like the target's (see `make_decoder`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Optional, Union

import flax.struct
import jax
import jax.numpy as jnp

from loopspec_jax.checkpoint import loading
from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding.method import Method
from loopspec_jax.decoding.passes import full_pass
from loopspec_jax.decoding import sampling
from loopspec_jax.decoding import verify
from loopspec_jax.decoding.tree import draft_tree
from loopspec_jax.decoding.tree import verify as tree_verify
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_jax.models.model import LoopedModel
from loopspec_jax.parallel import entry
from loopspec_jax.parallel.logical import axes_field


@flax.struct.dataclass
class SpecState:
  """The loop state of draft-model and prompt-lookup speculation (explicit pytree, static shapes)."""

  cache: kvcache.KVCache  # target: committed prefix (+ verified positions past `length`), group 1, readout R
  dcache: Any  # drafter's KVCache (group 1, its own full depth); None for prompt lookup
  tokens: jax.Array = axes_field("batch", "length")  # [B, T]
  length: jax.Array = axes_field("batch")  # [B]
  n_new: jax.Array = axes_field("batch")  # [B]
  done: jax.Array = axes_field("batch")  # [B]
  rounds: jax.Array = axes_field("batch")  # [B] verify passes per request
  accepted: jax.Array = axes_field("batch")  # [B] drafts accepted (and committed)
  drafted: jax.Array = axes_field("batch")  # [B] drafts offered to verification (sum of n_max)
  examined: jax.Array = axes_field("batch")  # [B] drafts verification looked at (accepted + first rejected)
  acc_num: jax.Array = axes_field("batch")  # [B] float32 decayed accepted count (gamma="auto")
  acc_den: jax.Array = axes_field("batch")  # [B] float32 decayed examined count (gamma="auto")
  draft_steps: jax.Array = axes_field()  # [] batched drafter steps run (cost accounting)
  iterations: jax.Array = axes_field()  # [] rounds of the batched loop


def distributions(logits, sp: common.SamplingParams):
  """`sampling.process_logits` of logits [B, ..., V] with sp's temperature / top-k / top-p, which may be
  scalars or per request [B] (broadcast against the logits' leading shape), so drafter and target logits go
  through exactly the same processing."""
  lead = logits.shape[:-1]
  row = lambda x: jnp.broadcast_to(jnp.reshape(x, jnp.shape(x) + (1,) * (len(lead) - jnp.ndim(x))), lead)
  return sampling.process_logits(
      logits, greedy=False, temperature=row(sp.temperature), top_k=row(sp.top_k), top_p=row(sp.top_p)
  )


def offered(st: SpecState, sp: common.SamplingParams, g_eff):
  """Drafts each request offers this round [B]: its gamma, at most the budget left after the round's
  target token (a function of past rounds only), 0 once done."""
  left = jnp.maximum(sp.max_new - st.n_new - 1, 0)
  return jnp.where(st.done, 0, jnp.minimum(g_eff, left)).astype(jnp.int32)


def gamma_of(st: SpecState, gamma: int, auto: bool, draft_cost: float, fixed_cost: float):
  """This round's per-request gamma [B]: fixed, or `adaptive.choose_gamma` of past outcomes."""
  if not auto:
    return jnp.full(st.length.shape, gamma, jnp.int32)
  return adaptive.choose_gamma(st.acc_num, st.acc_den, gamma, draft_cost, fixed_cost)


def verify_round(
    params, st: SpecState, sp: common.SamplingParams, drafts, q, n_max, *, cfg, greedy: bool, random_init: bool
) -> SpecState:
  """Verify drafts [B, G] (first n_max [B] of them offered) with draft distributions q [B, G, V] (None:
  one-hot, prompt lookup) in one full-depth pass of the target over positions p0..p0+G, commit, count."""
  b, t = st.tokens.shape
  g = drafts.shape[1]
  bi = jnp.arange(b)
  p0 = st.length - 1
  layout = kvcache.CacheLayout.of(cfg, 1)
  toks = jnp.concatenate([st.tokens[bi, p0][:, None], drafts], axis=1)  # [B, G + 1]
  pos = p0[:, None] + jnp.arange(g + 1)[None, :]
  mask = jnp.broadcast_to(jnp.arange(t)[None, None, :] < p0[:, None, None], (b, g + 1, t))
  causal = jnp.broadcast_to(jnp.tril(jnp.ones((g + 1, g + 1), bool)), (b, g + 1, g + 1))
  noise = common.state_noise(sp, pos, cfg) if random_init else None
  logits, cache = full_pass(params, st.cache, toks, pos, causal, mask, layout, cfg, noise)
  if greedy:  # the longest offered prefix equal to the target's argmax, then the target's next token
    target = sampling.greedy_token(logits)  # [B, G + 1]
    match = (drafts == target[:, :g]) & (jnp.arange(g)[None, :] < n_max[:, None])
    n_acc = jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=1), axis=1)
    nxt = target[bi, n_acc]
  else:
    if q is None:
      q = jax.nn.one_hot(drafts, logits.shape[-1], dtype=jnp.float32)
    vkeys = jax.vmap(lambda rid, p: sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_VERIFY))(
        sp.request_ids, p0 + 1
    )
    n_acc, nxt = jax.vmap(verify.verify_chain_upto)(vkeys, distributions(logits, sp), drafts, q, n_max)
  live = ~st.done
  num, den = adaptive.update(st.acc_num, st.acc_den, n_acc, n_max, live)
  return st.replace(
      cache=cache,
      **common.commit_round(st, drafts, n_acc, nxt, sp),
      drafted=st.drafted + jnp.where(live, n_max, 0),
      examined=st.examined + jnp.where(live, n_acc + (n_acc < n_max), 0),
      acc_num=num,
      acc_den=den,
  )


# ---------------------------------------------------------------------------------------------------
# The draft-model loop
# ---------------------------------------------------------------------------------------------------
@entry.program(entry.DRAFT_LOOP, donate_argnames=("state",))
def decode_loop(
    params,
    state: SpecState,
    sp: common.SamplingParams,
    dparams,
    *,
    cfg: ModelConfig,
    dcfg: ModelConfig,
    gamma: int,
    auto: bool,
    greedy: bool,
    random_init: bool,
):
  """Rounds of draft (gamma drafter steps) / verify (one full-depth target pass) until every request is done."""
  params = M.prepare_params(params, cfg)
  dparams = M.prepare_params(dparams, dcfg)
  dlayout = kvcache.CacheLayout.of(dcfg, 1)
  draft_cost = float(adaptive.layer_calls(dcfg, dcfg.recurrence))
  fixed_cost = float(adaptive.layer_calls(cfg, cfg.recurrence))

  def round_(st: SpecState) -> SpecState:
    b, t = st.tokens.shape
    bi = jnp.arange(b)
    p0 = st.length - 1
    n_max = offered(st, sp, gamma_of(st, gamma, auto, draft_cost, fixed_cost))
    n_run = jnp.max(n_max)  # drafter steps the batch needs this round (auto: later steps are skipped)

    def step(dcache, tok, pos):  # one drafter position [B] -> (logits [B, V], dcache)
      mask = jnp.arange(t)[None, None, :] < pos[:, None, None]
      one = jnp.ones((b, 1, 1), bool)
      logits, dcache = full_pass(dparams, dcache, tok[:, None], pos[:, None], one, mask, dlayout, dcfg, None)
      return logits[:, 0], dcache

    # First step: positions (p0 - 1, p0); p0 - 1 restores the entry a fully accepted round leaves out.
    pm = jnp.maximum(p0 - 1, 0)
    toks2 = jnp.stack([st.tokens[bi, pm], st.tokens[bi, p0]], axis=1)
    pos2 = jnp.stack([pm, p0], axis=1)
    lower = jnp.array([[False, False], [True, False]])
    self2 = jnp.eye(2, dtype=bool)[None] | ((p0 > 0)[:, None, None] & lower[None])  # [B, 2, 2]
    # (a first position, p0 = 0, is computed twice, each copy seeing only itself)
    mask2 = jnp.broadcast_to(jnp.arange(t)[None, None, :] < pm[:, None, None], (b, 2, t))
    logits2, dcache = full_pass(dparams, st.dcache, toks2, pos2, self2, mask2, dlayout, dcfg, None)
    lg = logits2[:, 1]
    drafts, qs = [], []
    steps = jnp.int32(1)
    for j in range(gamma):
      if greedy:
        x = sampling.greedy_token(lg)
      else:
        q = distributions(lg, sp)
        keys = jax.vmap(lambda rid, p: sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_X1))(
            sp.request_ids, p0 + j + 1
        )
        x = jax.vmap(sampling.sample_token)(keys, q)
        qs.append(q)
      drafts.append(x)
      if j + 1 < gamma:
        if auto:
          lg, dcache = jax.lax.cond(
              j + 1 < n_run,
              lambda dc, x=x, j=j: step(dc, x, p0 + j + 1),
              lambda dc: (jnp.zeros_like(lg), dc),
              dcache,
          )
          steps = steps + (j + 1 < n_run).astype(jnp.int32)
        else:
          lg, dcache = step(dcache, x, p0 + j + 1)
          steps = steps + 1
    q = None if greedy else jnp.stack(qs, axis=1)
    st = st.replace(dcache=dcache, draft_steps=st.draft_steps + steps)
    return verify_round(
        params, st, sp, jnp.stack(drafts, axis=1), q, n_max, cfg=cfg, greedy=greedy, random_init=random_init
    )

  return common.loop_until_done(round_, state, sp)


@entry.program(entry.DRAFT_INIT)
def initial_state(cache, tokens, lengths, sp: common.SamplingParams, dparams, *, cfg: ModelConfig, dcfg: ModelConfig):
  """The loop state: the target cache from the shared prefill; the drafter's cache prefilled here over the
  token buffer [B, T] (positions past each prompt are masked now and overwritten before they are read)."""
  del sp, cfg
  b, t = tokens.shape
  dlayout = kvcache.CacheLayout.of(dcfg, 1)
  dcache = kvcache.empty_cache(dcfg, dlayout, b, t)
  dcache = kvcache.prefill(dparams, tokens, lengths, dcache, dcfg, dlayout, (dcfg.recurrence,))
  return fresh_state(cache, dcache, tokens, lengths)


def fresh_state(cache, dcache, tokens, lengths) -> SpecState:
  counters = common.fresh_counters(tokens, lengths, "rounds", "accepted", "drafted", "examined")
  return SpecState(cache, dcache, **counters, **adaptive.initial_counts(tokens.shape[0]), draft_steps=jnp.int32(0))


def summarize(
    st: SpecState, cfg: ModelConfig, method: str, gamma, gamma_max: int, draft_cost: float, settings: dict
) -> common.DecodeStats:
  """Raw counts of a draft / lookup run (figures: `draft_figures`). `draft_cost`: the drafter's layer calls
  per drafting step (0 for lookup); every verify pass costs the target's R-step layer calls."""
  return common.DecodeStats.of_loop(
      method,
      st,
      cfg.recurrence,
      settings={
          **settings,
          "recurrence": cfg.recurrence,
          "gamma": gamma,
          "gamma_max": gamma_max,
          "draft_layer_calls": draft_cost,
          "verify_layer_calls": adaptive.layer_calls(cfg, cfg.recurrence),
      },
      per_request={
          "rounds": st.rounds,
          "accepted": st.accepted,
          "drafted": st.drafted,
          "examined": st.examined,
          "first": st.accepted,
          "restart": st.n_new - st.accepted,
      },
      totals={"draft_steps": st.draft_steps},
  )


def draft_figures(stats) -> dict:
  """Figures of a draft / lookup run. mean_accepted_length = tokens_per_round = tokens per full-depth verify
  pass (a round's critical path is one R-step pass of the target); acceptance_rate = accepted / offered
  drafts (chain's definition); alpha = accepted / examined drafts (the accepted ones and the first rejected
  one), the per-draft acceptance probability a of E[tokens per pass] = (1 - a^(gamma+1)) / (1 - a);
  draft_cost_share = drafting's share of the layer calls per row (0 for lookup)."""
  st, rounds, accepted, drafted = stats.settings, stats.count("rounds"), stats.count("accepted"), stats.count("drafted")
  d_calls = stats.totals.get("draft_steps", 0) * st["draft_layer_calls"]
  v_calls = stats.totals.get("iterations", 0) * st["verify_layer_calls"]
  out = stats.pass_figures("drafted", d_calls, v_calls)
  return dict(
      out,
      tokens_per_r_steps=out["tokens_per_pass"],
      alpha=accepted / max(stats.count("examined"), 1),
      mean_gamma=drafted / max(rounds, 1),
  )


# ---------------------------------------------------------------------------------------------------
# Validation and the Decoder
# ---------------------------------------------------------------------------------------------------
def _tokenizer_json(tok) -> dict:
  d = json.loads(tok.to_str())
  return {k: v for k, v in d.items() if k not in ("truncation", "padding")}


def check_compatible(target, drafter) -> None:
  """ValueError unless `drafter` (a LoopedModel) can draft for `target`: the same vocabulary size, the same
  tokenizer (its JSON: vocabulary, merges, normalisation, pre-tokenisation; both or neither present) and a
  context at least as long as the target's."""
  if not isinstance(drafter, LoopedModel):
    raise ValueError(f"method='draft' needs draft_model=<a LoopedModel (lj.load(...))>, got {type(drafter).__name__}")
  cfg, dcfg = target.config, drafter.config
  if dcfg.vocab_size != cfg.vocab_size:
    raise ValueError(
        f"the draft model's vocabulary has {dcfg.vocab_size} tokens, the target's {cfg.vocab_size}: "
        "a drafter must share the target's tokenizer"
    )
  if (target.tokenizer is None) != (drafter.tokenizer is None):
    which = "draft model" if drafter.tokenizer is None else "target"
    raise ValueError(f"the {which} has no tokenizer, so it cannot be checked to share the other's")
  if target.tokenizer is not None and _tokenizer_json(target.tokenizer) != _tokenizer_json(drafter.tokenizer):
    raise ValueError("the draft model's tokenizer differs from the target's (same vocabulary size, other tokens)")
  if dcfg.max_len < cfg.max_len:
    raise ValueError(f"the draft model's context ({dcfg.max_len}) is shorter than the target's ({cfg.max_len})")


def make_decoder(cfg: ModelConfig, *, greedy: bool, random_init: bool, draft_model, gamma) -> common.Decoder:
  """The Decoder of method='draft' (compatibility with the target is checked by `check_compatible`).

  Its init and loop are `initial_state` and `decode_loop` themselves, the drafter's parameters passed as the
  keyword `dparams` (traced) and its config as the static `dcfg`, so on a mesh they run as registered
  sharded entry points (`parallel/sharding.py`, argument kind 'draft_params'). There the drafter's parameters
  are sharded, not replicated: by the same rules as the target's, in the drafter's own head layout
  `sharding.padded_config(dcfg, mesh)` (heads the model axis does not divide are repeated / zero-padded
  exactly, as for the target; a drafter from `load(..., mesh=)` is already laid out and placed, any other is
  laid out inside the programs). Padding always finds a layout, and replicating would keep a full drafter
  copy, KV cache and attention flops on every device of the model axis, so replication is never needed. Its
  KV cache (`SpecState.dcache`, a KVCache with declared axes) is sharded like the target's: requests over
  'data', KV heads over 'model'.
  """
  if draft_model is None:
    raise ValueError("method='draft' needs draft_model=<a LoopedModel with the target's tokenizer>")
  g, auto = adaptive.parse_gamma("draft", gamma)
  dcfg, dparams = draft_model.config, draft_model.params
  # dparams travel as a keyword (traced, not static): init / loop stay the registered entry points themselves.
  init_kw = {"dparams": dparams, "dcfg": dcfg}
  stats = functools.partial(
      summarize,
      cfg=cfg,
      method="draft",
      gamma="auto" if auto else g,
      gamma_max=g,
      draft_cost=float(adaptive.layer_calls(dcfg, dcfg.recurrence)),
      settings={"draft_model": draft_model.source or dcfg.family},
  )
  loop_kw = dict(init_kw, gamma=g, auto=auto, greedy=greedy, random_init=random_init)
  return common.round_decoder("draft", cfg, g, initial_state, decode_loop, stats, init_kw=init_kw, loop_kw=loop_kw)


@functools.lru_cache(maxsize=None)
def _load_drafter(spec: str) -> LoopedModel:
  return loading.load(spec)


@dataclasses.dataclass(frozen=True)
class Draft(Method):
  """Draft-model speculation: a separate small `draft_model` (same tokenizer) drafts `gamma` tokens; with
  `branch` / `tree_nodes` it drafts a static token tree instead (`tree/draft_tree.py`; `drafts`: "sample"
  (the default when sampling: children drawn from q, multi-step verification) or "topk")."""

  name = "draft"
  positional = ("draft_model", "gamma")
  separate_drafter = True
  # a LoopedModel, or a bundled model's name / a checkpoint directory (loaded once per process)
  draft_model: Union[LoopedModel, str, None] = dataclasses.field(default=None, compare=False)
  gamma: Union[int, str, None] = None
  branch: Optional[int] = None
  tree_nodes: Optional[int] = None
  drafts: Optional[str] = None

  def __post_init__(self):
    if isinstance(self.draft_model, str):
      object.__setattr__(self, "draft_model", _load_drafter(self.draft_model))

  @property
  def is_tree(self) -> bool:
    return self.branch is not None or self.tree_nodes is not None

  @property
  def label(self) -> str:
    """'draft(gamma=4)': the drafter is named by the table around it (its `source` is in the stats)."""
    args = {k: v for k, v in self.args.items() if k != "draft_model"}
    return "draft" + ("(" + ",".join(f"{k}={v}" for k, v in args.items()) + ")" if args else "")

  @property
  def spec(self) -> str:
    src = getattr(self.draft_model, "source", None)
    args = ([f"draft_model={src}"] if src else []) + [f"{k}={v}" for k, v in self.args.items() if k != "draft_model"]
    return "draft" + (":" + ",".join(args) if args else "")

  def tree_envelope(self, cfg: ModelConfig) -> dict:
    if self.gamma == "auto":
      raise ValueError("method='draft' with a tree (branch / tree_nodes) needs an integer gamma, not 'auto'")
    return draft_tree.resolve(cfg, self.gamma, self.branch, self.tree_nodes, self.drafts)

  def validate(self, cfg: ModelConfig) -> None:
    if self.draft_model is None:
      raise ValueError("method='draft' needs draft_model=<a LoopedModel with the target's tokenizer>")
    if self.is_tree:
      self.tree_envelope(cfg)
    elif self.drafts is not None:
      raise ValueError("method='draft' takes drafts= only with a tree (branch= / tree_nodes=)")
    else:
      adaptive.parse_gamma("draft", self.gamma)

  def check_target(self, model) -> None:
    check_compatible(model, self.draft_model)

  def make_decoder(self, cfg: ModelConfig, *, greedy: bool, random_init: bool) -> common.Decoder:
    if self.is_tree:
      return draft_tree.make_decoder(
          cfg, greedy=greedy, random_init=random_init, draft_model=self.draft_model, **self.tree_envelope(cfg)
      )
    return make_decoder(cfg, greedy=greedy, random_init=random_init, draft_model=self.draft_model, gamma=self.gamma)

  @classmethod
  def derived(cls, stats) -> dict:
    if "tree_nodes" in stats.settings:
      return tree_verify.tree_figures(stats)
    return draft_figures(stats)
