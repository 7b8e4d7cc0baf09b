"""Tree self-speculation on the loop: a token tree drafted from the model's own depth-d1 readout, verified at R.

One round per request (static envelope: `branch`, `gamma` levels, `tree_nodes` draft nodes):
1. level 0 runs the last committed token (the root, position p0) through pre and d1 core steps and reads it
   out at d1; its top-`branch` tokens (by the draft log-probability log_softmax(logits_d1)) are the depth-1
   candidates;
2. level j = 1..gamma-1 runs the `branch` best candidates of depth j (the frontier, by cumulative draft
   log-probability) to depth d1 in one batched call, each attending to the committed prefix and to its own
   in-flight ancestors (earlier levels' entries, never written to the cache), and adds the top-`branch`
   children of each, `branch`^2 candidates of depth j + 1;
3. the tree is the root plus the `tree_nodes` best candidates of the whole pool by cumulative log-probability
   (EAGLE-2's reranking in a fixed envelope). A child's score is its parent's plus a log-probability <= 0 and
   ties go to the lower pool index (parents come first), so the chosen set always contains its ancestors.
   One exception to the ranking: the top-1 path (the argmax child of the argmax child ..., exactly chain's
   greedy drafts) is always expanded and always kept (score +inf; it is a path from the root, so ancestor
   closure holds), so the tree never verifies less than chain would: without it, an unconfident depth-d1
   readout made the EAGLE-2 rule prefer shallow alternatives to the deep greedy path and tau fell below
   chain's (tiny-raven GSM8K greedy, d1 = 1, gamma 6: 5.12 against chain's 5.49).
The tree goes to the one verifier (`tree/verify.py`): one pass of its 1 + tree_nodes nodes through the whole
model, AR's draws at every node, the accepted path written to the cache. Drafts are deterministic (top-k), so
sampled output is token-identical to AR's. A round's critical path is gamma * d1 + R recurrent steps, the same
as a chain round with gamma drafts; `branch=1, tree_nodes=gamma` drafts chain's greedy drafts.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding.method import Method
from loopspec_jax.decoding.passes import append_level, run_level
from loopspec_jax.decoding.tree import draft_tree as dt
from loopspec_jax.decoding.tree import sequoia
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.models import kvcache
from loopspec_jax.parallel import entry

DEFAULTS = {"d1": 2, "gamma": 6, "branch": 4, "tree_nodes": 32}
SHAPES = ("dynamic", "sequoia")  # EAGLE-2's tree from this round's scores / Sequoia's static optimum


def pool_size(branch: int, gamma: int) -> int:
  """Candidates a round drafts besides the root: branch at depth 1, branch^2 at each deeper level."""
  return branch + (gamma - 1) * branch * branch


def _children(logits, branch: int):
  """(log-probabilities, tokens) [B, S, branch] of the top-`branch` tokens of each readout [B, S, V]."""
  return jax.lax.top_k(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), branch)


def level_noise(sp, p0, lvl: int, s: int, *, cfg, random_init: bool):
  """The random initial states [B, s, E] of s draft queries at depth lvl below the roots at p0 [B] (all at
  position p0 + lvl: Raven 'like-init'), or None (zero initial states)."""
  if not random_init:
    return None
  return jnp.broadcast_to(common.state_noise(sp, (p0 + lvl)[:, None], cfg), (p0.shape[0], s, cfg.hidden_size))


def draft_tree(params, cache, layout, tokens, p0, sp, *, cfg, d1, gamma, branch, tree_nodes, random_init):
  """The round's tree (`verify.Tree`, [B, 1 + tree_nodes]) drafted from the depth-d1 readout (module
  docstring). Reads the cache only. Pool order: the root, the depth-1 candidates, then branch^2 per level."""
  b = tokens.shape[0]
  root = tokens[jnp.arange(b), p0]
  noise = functools.partial(level_noise, sp, p0, cfg=cfg, random_init=random_init)

  def level(past, lvl, toks, order, past_mask):
    del order
    logits, new = run_level(params, cache, layout, toks, p0, lvl, past, past_mask, d1, cfg, noise(lvl, toks.shape[1]))
    return logits, append_level(past, new)

  return expand_tree(level, None, root, gamma=gamma, branch=branch, tree_nodes=tree_nodes)[0]


def expand_tree(level, carry, root, *, gamma: int, branch: int, tree_nodes: int):
  """EAGLE-2's dynamic top-k expansion in a fixed envelope (module docstring), for any drafter.

  `level(carry, lvl, toks [B, S], order, past_mask) -> (logits [B, S, V], carry)` drafts one level: lvl 0 is
  the root alone (toks = root[:, None], order and past_mask None); level lvl >= 1 the `branch` frontier
  candidates of depth lvl, `order` [B, branch] their indices among the previous level's candidates (a
  candidate c of level >= 2 is child c // branch of that level's frontier row), past_mask [B, branch,
  1 + (lvl - 1) * branch] their ancestors among the run slots so far (slot 0: the root's run, then `branch`
  per level). Returns (the tree, the final carry)."""
  b = root.shape[0]
  n_runs = 1 + (gamma - 1) * branch  # queries run: the root, then `branch` per level
  logits, carry = level(carry, 0, root[:, None], None, None)
  lp, tok = _children(logits, branch)  # [B, 1, branch]
  pool_tok, pool_score = [root[:, None], tok[:, 0]], [jnp.zeros((b, 1)), lp[:, 0]]
  pool_parent, pool_depth = [jnp.zeros((b, 1 + branch), jnp.int32)], [jnp.zeros((b, 1), jnp.int32)]
  pool_depth.append(jnp.ones((b, branch), jnp.int32))
  first_rank = jnp.arange(branch) == 0
  chain = [jnp.zeros((b, 1), bool), jnp.broadcast_to(first_rank, (b, branch))]  # the top-1 path (chain's drafts)
  # run-slot ancestry of the newest level's candidates: [B, n_cand, n_runs] (depth 1: the root, slot 0)
  cand_runs = jnp.zeros((b, branch, n_runs), bool).at[:, :, 0].set(True)
  cand_first = 1  # pool index of the newest level's first candidate
  for lvl in range(1, gamma):
    score = pool_score[-1]
    keyed = jnp.where(chain[-1], jnp.inf, score)  # the top-1 path is always expanded
    order = jax.lax.top_k(keyed, branch)[1] if lvl > 1 else jnp.broadcast_to(jnp.arange(branch), (b, branch))
    f_chain = jnp.take_along_axis(chain[-1], order, axis=1)
    f_tok = jnp.take_along_axis(pool_tok[-1], order, axis=1)  # [B, branch]
    f_score = jnp.take_along_axis(score, order, axis=1)
    f_runs = jnp.take_along_axis(cand_runs, order[:, :, None], axis=1)  # [B, branch, n_runs]
    n_past = 1 + (lvl - 1) * branch
    logits, carry = level(carry, lvl, f_tok, order, f_runs[:, :, :n_past])
    lp, tok = _children(logits, branch)  # [B, branch, branch]
    own = jax.nn.one_hot(n_past + jnp.arange(branch), n_runs, dtype=bool)  # this level's run slots
    cand_runs = jnp.repeat(f_runs | own[None], branch, axis=1)  # [B, branch^2, n_runs]
    pool_tok.append(tok.reshape(b, branch * branch))
    pool_score.append((f_score[:, :, None] + lp).reshape(b, branch * branch))
    pool_parent.append(jnp.repeat(cand_first + order, branch, axis=1))
    pool_depth.append(jnp.full((b, branch * branch), lvl + 1, jnp.int32))
    chain.append((f_chain[:, :, None] & first_rank[None, None, :]).reshape(b, branch * branch))
    cand_first += branch if lvl == 1 else branch * branch
  cat = lambda xs: jnp.concatenate(xs, axis=1)
  keyed = jnp.where(cat(chain), jnp.inf, cat(pool_score))  # the top-1 path first, then the best by score
  return select(cat(pool_tok), keyed, cat(pool_parent), cat(pool_depth), tree_nodes), carry


def draft_static(
    params,
    cache,
    layout,
    tokens,
    p0,
    sp,
    *,
    cfg,
    d1,
    gamma,
    branch,
    tree_nodes,
    random_init,
    shape=None,
    sample=True,
    replacement=True,
):
  """(tree, q [B, K, V] or None) of a static shape (`shape`, default `draft_tree.static_shape(gamma, branch,
  tree_nodes)`): sample=True (drafts="sample" / "distinct"): every expanded node's children drawn from q =
  process_logits(its depth-d1 readout), with / without replacement; sample=False: its top-rank tokens
  (deterministic drafts, shape="sequoia" greedy)."""
  b = tokens.shape[0]
  root = tokens[jnp.arange(b), p0]
  noise = functools.partial(level_noise, sp, p0, cfg=cfg, random_init=random_init)
  logits0, past = run_level(params, cache, layout, root[:, None], p0, 0, None, None, d1, cfg, noise(0, 1))

  def run(lvl, toks, past, pm):
    return run_level(params, cache, layout, toks, p0, lvl, past, pm, d1, cfg, noise(lvl, toks.shape[1]))

  shape = shape or dt.static_shape(gamma, branch, tree_nodes)
  keys = dt.draft_keys(sp, p0)
  return dt.expand(shape, root, logits0, run, past, sp, keys, branch=branch, sample=sample, replacement=replacement)


def select(tokens, score, parent, depth, tree_nodes: int) -> tv.Tree:
  """The root plus the `tree_nodes` best pool entries by score (ties: lower pool index), in pool order
  (topological), parents re-indexed into the tree. Pool arrays [B, P]; entry 0 is the root."""

  def one(tokens, score, parent, depth):
    best = jax.lax.top_k(score[1:], tree_nodes)[1] + 1
    keep = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.sort(best).astype(jnp.int32)])
    new_index = jnp.zeros(tokens.shape, jnp.int32).at[keep].set(jnp.arange(keep.shape[0], dtype=jnp.int32))
    par = new_index[parent[keep]].at[0].set(0)
    return tokens[keep], par, depth[keep]

  tok, par, dep = jax.vmap(one)(tokens, score, parent, depth)
  return tv.Tree(tokens=tok.astype(jnp.int32), parent=par, depth=dep, valid=jnp.ones(tok.shape, bool))


# ---------------------------------------------------------------------------------------------------
# The loop, the stats and the Method
# ---------------------------------------------------------------------------------------------------
def draft(params, st: tv.TreeState, sp, *, cfg, layout, envelope: dict, drafts: str, sample: bool, shape):
  """The round's tree from the depth-d1 readout (with sample: (tree, q) of sampled drafts); see `decode_loop`."""
  args = (params, st.cache, layout, st.tokens, st.length - 1, sp)
  if sample:
    return st, draft_static(*args, cfg=cfg, **envelope, shape=shape, replacement=drafts != "distinct")
  if shape is not None:
    return st, draft_static(*args, cfg=cfg, **envelope, shape=shape, sample=False)[0]
  return st, draft_tree(*args, cfg=cfg, **envelope)


@entry.program(entry.LOOP, donate_argnames=("state",))
def decode_loop(
    params, state, sp, *, cfg: ModelConfig, d1, gamma, branch, tree_nodes, drafts, greedy, random_init, shape=None
):
  """Rounds of (draft a tree from the depth-d1 readout, verify it in one full-depth pass) until all are done.
  drafts (ignored when greedy) "sample" / "distinct": a static tree of children drawn with / without
  replacement and the matching multi-step verification; "kseq": i.i.d. children verified by K-SEQ; "topk": the EAGLE-2 tree of `draft_tree`, or with a
  static `shape` (Sequoia's) the top-rank tokens at its nodes."""
  envelope = dict(d1=d1, gamma=gamma, branch=branch, tree_nodes=tree_nodes, random_init=random_init)
  sample = drafts != "topk" and not greedy
  layout = kvcache.CacheLayout.of(cfg, 2)  # coda caches for readouts at d1 (index 0) and R (index 1)
  drafter = tl.Drafter(
      draft=functools.partial(
          draft, cfg=cfg, layout=layout, envelope=envelope, drafts=drafts, sample=sample, shape=shape
      ),
      max_depth=gamma,
      readouts=((d1, 0), (cfg.recurrence, 1)),
      verify=tl.sampled_verify(drafts) if sample else tv.verify_round,
  )
  return tl.run(params, state, sp, drafter, cfg=cfg, greedy=greedy, random_init=random_init)


def summarize(
    st: tv.TreeState,
    cfg: ModelConfig,
    d1: int,
    gamma: int,
    branch: int,
    tree_nodes: int,
    drafts: str,
    shape: str = "dynamic",
    accept=None,
):
  """Raw counts of a tree self-speculation run (figures: `verify.tree_figures`). Per round the drafting runs
  1 + (gamma - 1) * branch rows to depth d1 (drafts="sample" / "distinct", or shape="sequoia": the static
  shape's expanded nodes); the verify pass runs 1 + tree_nodes rows through all R steps (and the coda once
  more at d1)."""
  r = cfg.recurrence
  static = static_shape_of(gamma, branch, tree_nodes, drafts, shape, accept)
  draft_rows = len(static.runs) if static is not None else 1 + (gamma - 1) * branch
  coda = cfg.n_coda if cfg.is_raven else 0
  return common.DecodeStats.of_loop(
      "tree",
      st,
      gamma * d1 + r,
      settings={
          "recurrence": r,
          "d1": d1,
          "gamma": gamma,
          "branch": branch,
          "tree_nodes": tree_nodes,
          "drafts": drafts,
          "shape": shape,
          "accept": None if accept is None else [list(a) for a in accept],
          "draft_layer_calls": draft_rows * adaptive.layer_calls(cfg, d1),
          "verify_layer_calls": (1 + tree_nodes) * (adaptive.layer_calls(cfg, r) + coda),
      },
      per_request=tl.per_request(st),
  )


def static_shape_of(gamma, branch, tree_nodes, drafts: str, shape: str, accept) -> Optional[dt.Shape]:
  """The round's static shape: Sequoia's for shape="sequoia", draft_tree's for sampled drafts, else None (the
  dynamic EAGLE-2 tree)."""
  if shape == "sequoia":
    return sequoia.shape_of(accept, gamma, branch, tree_nodes)
  return dt.static_shape(gamma, branch, tree_nodes) if drafts != "topk" else None


def resolve(
    cfg: ModelConfig, d1, gamma, branch, tree_nodes, drafts=None, shape=None, accept=None, greedy: bool = True
) -> dict:
  """The envelope with defaults filled in, or a ValueError naming the bad argument (before compiling). The
  default Sequoia vector is the one measured for the decoding mode (greedy, or the sampled drafts mode)."""
  env = {
      k: DEFAULTS[k] if v is None else v
      for k, v in dict(d1=d1, gamma=gamma, branch=branch, tree_nodes=tree_nodes).items()
  }
  for k, v in env.items():
    if isinstance(v, bool) or not isinstance(v, int):
      raise ValueError(f"method='tree' needs an integer {k}, got {v!r}")
  r = cfg.recurrence
  if not 1 <= env["d1"] < r:
    raise ValueError(f"method='tree' needs a draft depth 1 <= d1 < R={r}, got {env['d1']}")
  if not 1 <= env["branch"] <= min(cfg.vocab_size, 64):
    raise ValueError(f"method='tree' needs 1 <= branch <= {min(cfg.vocab_size, 64)}, got {env['branch']}")
  if not 1 <= env["gamma"] <= min(32, cfg.max_len - 1):
    raise ValueError(f"method='tree' needs a tree depth 1 <= gamma <= {min(32, cfg.max_len - 1)}, got {env['gamma']}")
  most = pool_size(env["branch"], env["gamma"])
  if not 1 <= env["tree_nodes"] <= min(most, 512):
    raise ValueError(
        f"method='tree' needs 1 <= tree_nodes <= {min(most, 512)} (branch={env['branch']}, gamma={env['gamma']} "
        f"draft {most} candidates), got {env['tree_nodes']}"
    )
  if env["tree_nodes"] < env["gamma"]:
    raise ValueError(
        f"method='tree' needs tree_nodes >= gamma={env['gamma']} (the tree holds the top-1 path, gamma nodes "
        f"deep), got {env['tree_nodes']}"
    )
  if drafts is not None and drafts not in dt.DRAFTS:
    raise ValueError(f"method='tree' takes drafts in {dt.DRAFTS}, got {drafts!r}")
  env["drafts"] = drafts or "topk"
  env["shape"] = shape or "dynamic"
  if env["shape"] not in SHAPES:
    raise ValueError(f"method='tree' takes shape in {SHAPES}, got {shape!r}")
  if accept is not None and env["shape"] != "sequoia":
    raise ValueError(f"method='tree' takes accept= only with shape='sequoia', got shape={shape!r}")
  env["accept"] = None
  if env["shape"] == "sequoia":
    mode = "greedy" if greedy else env["drafts"]
    counts = env["drafts"] == "kseq" and (accept is not None or mode == "kseq")  # accept's format: drafts'
    if accept is None:
      accept = sequoia.default_accept(env["d1"], mode, env["branch"])
    if counts:
      env["accept"] = sequoia.parse_counts(accept, env["branch"])
    else:
      env["accept"] = sequoia.parse_accept(accept, env["gamma"], env["branch"])
    sequoia.shape_of(env["accept"], env["gamma"], env["branch"], env["tree_nodes"])
  return env


def make_decoder(cfg: ModelConfig, *, greedy: bool, random_init: bool, **envelope) -> common.Decoder:
  env = resolve(cfg, **envelope, greedy=greedy)
  drafts = "topk" if greedy else env.pop("drafts")
  env.pop("drafts", None)
  shape, accept = env.pop("shape"), env.pop("accept")
  static = static_shape_of(env["gamma"], env["branch"], env["tree_nodes"], drafts, shape, accept)
  loop_kw = dict(env, drafts=drafts, greedy=greedy, random_init=random_init)
  if shape == "sequoia":
    loop_kw["shape"] = static
  stats = functools.partial(summarize, cfg=cfg, **env, drafts=drafts, shape=shape, accept=accept)
  d1, gamma = env["d1"], env["gamma"]
  return common.round_decoder("tree", cfg, gamma, tl.initial_state, decode_loop, stats, d1=d1, loop_kw=loop_kw)


@dataclasses.dataclass(frozen=True)
class TreeSelf(Method):
  """Tree self-speculation: a tree of `tree_nodes` drafts from the top-`branch` tokens of the depth-`d1`
  readout, `gamma` levels deep, verified in one full-depth pass (defaults d1=2, gamma=6, branch=4, 32 nodes).
  drafts="sample" / "distinct" (when sampling): a static tree whose children are drawn from the readout's q
  with / without replacement, verified by the matching multi-step rule (exact in distribution, not
  token-identical to AR); default "topk". shape="sequoia": a static shape instead of the EAGLE-2 tree,
  Sequoia's optimum for the acceptance vector `accept` (per rank, '0.9/0.05/0.02/0.01' in spec strings, or
  per-depth rows; default the vector measured on tiny-raven for the decoding mode (greedy, or the sampled
  drafts mode), `sequoia.DEFAULT_ACCEPT`), its nodes the
  top-rank tokens of the readout (greedy / drafts="topk") or the sampled children (drafts="sample" /
  "distinct" / "kseq"). drafts="kseq": i.i.d. children verified by SpecTr's K-SEQ (`tree/spectr.py`); with
  it, accept is a count table (row c - 1: the c slots' acceptance with c children, '0.9;0.8/0.16' in spec
  strings; `sequoia.parse_counts`)."""

  name = "tree"
  positional = ("d1", "gamma", "branch", "tree_nodes")
  build_decoder = staticmethod(make_decoder)
  d1: Optional[int] = None
  gamma: Optional[int] = None
  branch: Optional[int] = None
  tree_nodes: Optional[int] = None
  drafts: Optional[str] = None
  shape: Optional[str] = None
  accept: Optional[object] = None

  def validate(self, cfg: ModelConfig) -> None:
    resolve(cfg, self.d1, self.gamma, self.branch, self.tree_nodes, self.drafts, self.shape, self.accept)

  @classmethod
  def derived(cls, stats) -> dict:
    out = tv.tree_figures(stats)
    st = stats.settings
    rounds = max(stats.count("rounds"), 1)
    out["tokens_per_r_steps"] = stats.tokens * st["recurrence"] / (rounds * (st["gamma"] * st["d1"] + st["recurrence"]))
    return out
