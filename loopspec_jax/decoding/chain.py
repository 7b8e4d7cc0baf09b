"""Classic chain self-speculation: draft gamma tokens from the depth-d1 readout, verify at depth R.

One round: gamma + 1 positions each run `pre` and d1 core steps one after another (drafting x_{j+1} from the
depth-d1 readout of position j), then all gamma + 1 positions run the remaining depths d1..R in ONE batched
pass, are read out at R and verified left to right (standard rule plus a bonus token). Drafting only reads the
cache (each position attends to the round's earlier positions as an in-flight segment); their entries are then
written with one in-place scatter per buffer; rejected positions are rolled back by length (masked, later
overwritten).
`gamma="auto"` compiles for `adaptive.AUTO_MAX_GAMMA` and offers each request the gamma its past acceptance
calls for (decoding/adaptive.py); drafting positions past the batch's largest are skipped (`lax.cond`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Optional, Union

import flax.struct
import jax
import jax.numpy as jnp

from loopspec_jax.analysis import theory
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding.method import Method
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_jax.decoding import sampling
from loopspec_jax.decoding import verify
from loopspec_jax.decoding.tree import self_spec
from loopspec_jax.config import ModelConfig
from loopspec_jax.parallel import entry
from loopspec_jax.parallel.logical import axes_field


@flax.struct.dataclass
class ChainState:
  cache: kvcache.KVCache  # committed prefix (+ drafts beyond `length`), group=1, readouts (d1, R)
  tokens: jax.Array = axes_field("batch", "length")  # [B, T]
  length: jax.Array = axes_field("batch")  # [B]
  n_new: jax.Array = axes_field("batch")  # [B]
  done: jax.Array = axes_field("batch")  # [B]
  rounds: jax.Array = axes_field("batch")  # [B] verify passes per request
  accepted: jax.Array = axes_field("batch")  # [B] drafts accepted
  drafted: jax.Array = axes_field("batch")  # [B] drafts offered to verification
  acc_num: jax.Array = axes_field("batch")  # [B] float32 decayed accepted count (gamma="auto")
  acc_den: jax.Array = axes_field("batch")  # [B] float32 decayed examined count (gamma="auto")
  iterations: jax.Array = axes_field()  # [] rounds of the batched loop


def validate(cfg: ModelConfig, d1, gamma):
  r = cfg.recurrence
  if d1 is None or int(d1) != d1 or not 1 <= d1 < r:
    raise ValueError(f"chain needs an integer draft depth 1 <= d1 < R={r}, got {d1!r}")
  adaptive.parse_gamma("chain", gamma)


class _Round(NamedTuple):
  """The static settings of one chain round (hashable Python values, closed over by the jitted loop)."""

  cfg: ModelConfig
  layout: kvcache.CacheLayout  # coda caches for readouts at d1 (ridx 0) and R (ridx 1)
  d1: int
  gamma: int
  greedy: bool
  random_init: bool
  auto: bool
  # gamma="auto" costs in layer calls: a drafting position, and what every round pays (one drafting
  # position plus the verify pass over depths d1..R)
  auto_costs: tuple


def _auto_costs(cfg: ModelConfig, d1: int) -> tuple:
  draft = float(adaptive.layer_calls(cfg, d1))
  verify_pass = adaptive.layer_calls(cfg, cfg.recurrence, coda=True) - adaptive.layer_calls(cfg, d1, coda=False)
  return draft, draft + float(verify_pass)


@entry.program(entry.LOOP, donate_argnames=("state",))
def decode_loop(
    params,
    state: ChainState,
    sp: common.SamplingParams,
    *,
    cfg: ModelConfig,
    d1: int,
    gamma: int,
    greedy: bool,
    random_init: bool,
    auto: bool = False,
):
  """Chain rounds until every request is done (one `lax.while_loop`)."""
  rc = _Round(cfg, kvcache.CacheLayout.of(cfg, 2), d1, gamma, greedy, random_init, auto, _auto_costs(cfg, d1))
  params = M.prepare_params(params, cfg)
  return common.loop_until_done(lambda st: _round(params, st, sp, rc), state, sp)


def _with_inflight(base, past):
  """ctx_fn `base` (the committed prefix) plus one segment of this round's earlier draft positions, which are
  in flight (not yet in the cache: drafting only reads the cache, so XLA updates every buffer in place)."""
  if not past:
    return base

  def ctx(l):
    k = jnp.concatenate([kv[0][l] for kv in past], axis=1).transpose(0, 2, 1, 3)  # [B, KV, j, D]
    v = jnp.concatenate([kv[1][l] for kv in past], axis=1).transpose(0, 2, 1, 3)
    return base(l) + [(k, v, jnp.ones((k.shape[0], 1, k.shape[2]), bool))]

  return ctx


def _draft_position(params, cache, tok, q, mask, past, sp, rc: _Round):
  """pre + d1 core steps + readout at d1 of one position q [B, 1] per request, attending to the committed
  prefix (mask [B, 1, T]) and to `past`: per entry name, the (k, v) [L, B, 1, KV, D] of the round's earlier
  positions. Returns (s, e, logits [B, V], this position's entries by name); writes nothing."""
  cfg, one = rc.cfg, jnp.ones((tok.shape[0], 1, 1), bool)
  ctx = lambda name, base: _with_inflight(base, [p[name] for p in past])
  e, k, v = M.pre(params, tok[:, None], q, one, ctx("pre", kvcache.prelude_ctx(cache, mask)), cfg)
  new = {"pre": (k, v)}
  noise = common.state_noise(sp, q, cfg) if rc.random_init else None
  s = M.initial_state(e, cfg, noise)
  for i in range(rc.d1):
    s, k, v = M.core_step(params, s, e, q, one, ctx(f"core{i}", kvcache.core_ctx(cache, rc.layout, i, mask)), cfg)
    new[f"core{i}"] = (k, v)
  logits, k, v = M.post(params, s, q, one, ctx("coda", kvcache.coda_ctx(cache, 0, mask)), cfg)
  new["coda"] = (k, v)
  return s, e, logits[:, 0], new


def _write_drafts(cache, entries, pos, after, rc: _Round):
  """Writes the drafted positions' entries (prelude, core steps 0..d1-1, readout d1) at pos [B, S], one
  scatter per buffer, ordered after every read of the drafting phase (`after`: its last float output)."""
  cat = lambda name, i: jnp.concatenate([p[name][i] for p in entries], axis=2)  # [L, B, S, KV, D]
  pos = kvcache.ordered(pos, after, cache.length)
  cache = kvcache.write_prelude(cache, cat("pre", 0), cat("pre", 1), pos)
  ks = jnp.stack([cat(f"core{i}", 0) for i in range(rc.d1)])  # [d1, L, B, S, KV, D]
  vs = jnp.stack([cat(f"core{i}", 1) for i in range(rc.d1)])
  cache = kvcache.write_core_steps(cache, rc.layout, jnp.arange(rc.d1), ks, vs, pos)
  return kvcache.write_coda(cache, 0, cat("coda", 0), cat("coda", 1), pos)


def _draft(params, st: ChainState, sp, p0, n_run, rc: _Round):
  """Drafting: gamma + 1 positions from p0 [B], one at a time, to depth d1 (reading the cache, writing
  nothing). Returns per position the states, injections and entries, the gamma drafts [B] (and their
  distributions q when sampling) and the last readout's logits."""
  b, t = st.tokens.shape
  mask = jnp.arange(t)[None, None, :] < p0[:, None, None]  # [B, 1, T]: the committed prefix
  tok = st.tokens[jnp.arange(b), p0]
  states, injections, entries, drafts, qs = [], [], [], [], []
  for j in range(rc.gamma + 1):
    q = (p0 + j)[:, None]
    if rc.auto and j >= 2:  # position j is needed only when some request offers >= j drafts
      run = lambda tok=tok, q=q, past=tuple(entries): _draft_position(params, st.cache, tok, q, mask, past, sp, rc)
      skip = lambda like=(states[0], injections[0], logits, entries[0]): jax.tree.map(jnp.zeros_like, like)
      s, e, logits, new = jax.lax.cond(j <= n_run, run, skip)
    else:
      s, e, logits, new = _draft_position(params, st.cache, tok, q, mask, entries, sp, rc)
    entries.append(new)
    states.append(s)
    injections.append(e)
    if j < rc.gamma:
      if rc.greedy:
        tok = sampling.greedy_token(logits)
      else:
        probs = common.row_distributions(logits, sp=sp)
        keys = jax.vmap(lambda rid, p: sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_X1))(
            sp.request_ids, p0 + j + 1
        )
        tok = jax.vmap(sampling.sample_token)(keys, probs)
        qs.append(probs)
      drafts.append(tok)
  return states, injections, entries, drafts, qs, logits


def _verify_logits(params, cache, states, injections, pos, p0, t: int, rc: _Round):
  """All gamma + 1 positions pos [B, S] through depths d1..R at once (T = t cache positions), read out at R:
  (logits [B, S, V], cache)."""
  b, s_len = pos.shape
  s = jnp.concatenate(states, axis=1)  # [B, S, E]
  e = jnp.concatenate(injections, axis=1)
  mask = jnp.broadcast_to(jnp.arange(t)[None, None, :] < p0[:, None, None], (b, s_len, t))
  causal = jnp.broadcast_to(jnp.tril(jnp.ones((s_len, s_len), bool)), (b, s_len, s_len))
  s, cache = kvcache.run_core_steps(params, cache, rc.layout, s, e, pos, causal, mask, rc.d1, rc.cfg.recurrence, rc.cfg)
  logits, k, v = M.post(params, s, pos, causal, kvcache.coda_ctx(cache, 1, mask), rc.cfg)
  return logits, kvcache.write_coda(cache, 1, k, v, kvcache.ordered(pos, logits, t))


def _accept(logits, drafts, qs, n_max, p0, sp, rc: _Round):
  """(accepted drafts [B], next token [B]): greedy, the longest prefix of drafts [B, G] equal to the target's
  argmax, then its next token; sampled, the standard rule with a bonus token (`verify.verify_chain`)."""
  if rc.greedy:
    target = sampling.greedy_token(logits)  # [B, S]
    match = drafts == target[:, : rc.gamma]
    if rc.auto:
      match = match & (jnp.arange(rc.gamma)[None, :] < n_max[:, None])
    n_acc = jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=1), axis=1)
    return n_acc, target[jnp.arange(target.shape[0]), n_acc]
  vkeys = jax.vmap(lambda rid, p: sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_VERIFY))(
      sp.request_ids, p0 + 1
  )
  probs, q = common.row_distributions(logits, sp=sp), jnp.stack(qs, axis=1)
  if rc.auto:
    return jax.vmap(verify.verify_chain_upto)(vkeys, probs, drafts, q, n_max)
  return jax.vmap(verify.verify_chain)(vkeys, probs, drafts, q)


def _round(params, st: ChainState, sp, rc: _Round) -> ChainState:
  """One round: draft gamma + 1 positions, write their entries, verify, commit."""
  p0 = st.length - 1  # first position of the round (its token is committed)
  n_max, n_run = None, None
  if rc.auto:  # this round's drafts per request, from past rounds only (decoding/adaptive.py)
    n_max = adaptive.choose_gamma(st.acc_num, st.acc_den, rc.gamma, *rc.auto_costs)
    n_max = jnp.where(st.done, 0, jnp.minimum(n_max, jnp.maximum(sp.max_new - st.n_new - 1, 0)))
    n_run = jnp.max(n_max)
  states, injections, entries, drafts, qs, last = _draft(params, st, sp, p0, n_run, rc)
  pos = p0[:, None] + jnp.arange(rc.gamma + 1)[None, :]
  cache = _write_drafts(st.cache, entries, pos, last, rc)
  logits, cache = _verify_logits(params, cache, states, injections, pos, p0, st.tokens.shape[1], rc)
  drafts = jnp.stack(drafts, axis=1)  # [B, G]
  n_acc, nxt = _accept(logits, drafts, qs, n_max, p0, sp, rc)
  # Commit n_acc drafts and the next token, within the budget and up to the first eos.
  live = ~st.done
  num, den = adaptive.update(st.acc_num, st.acc_den, n_acc, n_max, live) if rc.auto else (st.acc_num, st.acc_den)
  return st.replace(
      cache=cache,
      **common.commit_round(st, drafts, n_acc, nxt, sp),
      drafted=st.drafted + jnp.where(live, n_max if rc.auto else rc.gamma, 0),
      acc_num=num,
      acc_den=den,
  )


@entry.program(entry.INIT)
def initial_state(cache, tokens, lengths, sp: common.SamplingParams, *, cfg: ModelConfig) -> ChainState:
  del sp, cfg
  counters = common.fresh_counters(tokens, lengths, "rounds", "accepted", "drafted")
  return ChainState(cache=cache, **counters, **adaptive.initial_counts(tokens.shape[0]))


def summarize(st: ChainState, cfg: ModelConfig, d1: int, gamma: int, auto: bool = False) -> common.DecodeStats:
  """Raw counts of a chain run (figures: `Chain.derived`). A draft is offered per position up to the
  request's gamma; every committed token that is not an accepted draft is a restart."""
  r = cfg.recurrence
  drafted = st.drafted if auto else st.rounds * gamma
  return common.DecodeStats.of_loop(
      "chain",
      st,
      theory.chain_round_steps(r, d1, gamma),
      settings={
          "recurrence": r,
          "d1": d1,
          "gamma": "auto" if auto else gamma,
          "gamma_max": gamma,
          "draft_layer_calls": adaptive.layer_calls(cfg, d1),  # per drafted position
          "verify_layer_calls": adaptive.layer_calls(cfg, r) - adaptive.layer_calls(cfg, d1, coda=False),  # per round
      },
      per_request={
          "rounds": st.rounds,
          "accepted": st.accepted,
          "drafted": drafted,
          "first": st.accepted,
          "restart": st.n_new - st.accepted,
      },
  )


def make_decoder(cfg: ModelConfig, *, greedy: bool, random_init: bool, d1, gamma) -> common.Decoder:
  validate(cfg, d1, gamma)
  gamma, auto = adaptive.parse_gamma("chain", gamma)
  d1 = int(d1)
  loop_kw = {"d1": d1, "gamma": gamma, "greedy": greedy, "random_init": random_init}
  if auto:
    loop_kw["auto"] = True
  stats = functools.partial(summarize, cfg=cfg, d1=d1, gamma=gamma, auto=auto)
  return common.round_decoder("chain", cfg, gamma, initial_state, decode_loop, stats, d1=d1, loop_kw=loop_kw)


@dataclasses.dataclass(frozen=True)
class Chain(Method):
  """Chain self-speculation: `gamma` drafts (an integer, or 'auto') from the depth-`d1` readout, verified at R.

  `branch` > 1 (with `tree_nodes`) drafts a token tree instead: tree self-speculation (`TreeSelf`,
  method='tree' with the same arguments; its stats are the tree's). `branch=1` (the default) is the chain."""

  name = "chain"
  positional = ("d1", "gamma")
  d1: Optional[int] = None
  gamma: Union[int, str, None] = None
  branch: Optional[int] = None
  tree_nodes: Optional[int] = None

  def as_tree(self):
    """The `TreeSelf` this chain delegates to (branch > 1), or None (a chain)."""
    if self.branch is not None and (isinstance(self.branch, bool) or not isinstance(self.branch, int)):
      raise ValueError(f"method='chain' needs an integer branch >= 1, got {self.branch!r}")
    if self.branch is None or self.branch == 1:
      if self.tree_nodes is not None and self.tree_nodes != self.gamma:
        raise ValueError(
            f"method='chain' with branch=1 drafts gamma={self.gamma!r} nodes; tree_nodes={self.tree_nodes!r} "
            "needs branch > 1 (a tree)"
        )
      return None
    if self.branch < 1:
      raise ValueError(f"method='chain' needs an integer branch >= 1, got {self.branch!r}")
    if self.gamma == "auto":
      raise ValueError("method='chain' with branch > 1 (a tree) needs an integer gamma, not 'auto'")
    return self_spec.TreeSelf(d1=self.d1, gamma=self.gamma, branch=self.branch, tree_nodes=self.tree_nodes)

  def validate(self, cfg: ModelConfig) -> None:
    tree = self.as_tree()
    if tree is not None:
      return tree.validate(cfg)
    validate(cfg, self.d1, self.gamma)

  def make_decoder(self, cfg: ModelConfig, *, greedy: bool, random_init: bool) -> common.Decoder:
    tree = self.as_tree()
    if tree is not None:
      return tree.make_decoder(cfg, greedy=greedy, random_init=random_init)
    return make_decoder(cfg, greedy=greedy, random_init=random_init, d1=self.d1, gamma=self.gamma)

  @classmethod
  def derived(cls, stats) -> dict:
    """Accepted length on the release's scale (R * tokens / recurrent steps on the critical path: a round that
    offered g drafts costs (g + 1) d1 + R - d1 steps), acceptance per offered draft, drafting's share of the
    layer calls."""
    st, n = stats.settings, stats.tokens
    r, d1, g = st["recurrence"], st["d1"], st["gamma_max"]
    rounds, accepted, drafted = stats.count("rounds"), stats.count("accepted"), stats.count("drafted")
    if st["gamma"] == "auto":
      mal = tpr = r * n / max((drafted + rounds) * d1 + rounds * (r - d1), 1)
    else:
      mal = theory.chain_accepted_length(r, d1, g, n, rounds) if n else 0.0
      tpr = n * r / max(rounds * theory.chain_round_steps(r, d1, g), 1)
    draft, verify = (drafted + rounds) * st["draft_layer_calls"], rounds * st["verify_layer_calls"]
    out = {
        "mean_accepted_length": mal,
        "tokens_per_r_steps": tpr,
        "tokens_per_round": n / max(rounds, 1),
        "acceptance_rate": accepted / max(drafted, 1),
        "draft_cost_share": draft / max(draft + verify, 1),
    }
    out.update(tokens_per_pass=out["tokens_per_round"], acceptance=out["acceptance_rate"])
    if st["gamma"] == "auto":
      out["mean_gamma"] = drafted / max(rounds, 1)
    return out
