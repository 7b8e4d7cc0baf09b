"""Token trees drafted by a sampling-capable drafter: a STATIC tree shape, draft-model trees, and the expansion
both use (the draft model's and the loop's own depth-d1 readout's, `tree/self_spec.py` with drafts="sample").

The shape (`static_shape`) is fixed at trace time from the envelope alone (depth `gamma`, at most `branch`
children per node and `branch` expanded nodes per level, 1 + `tree_nodes` nodes): best-first on a static
value, node value = parent's value * A * (1 - A)^rank (rank = sibling index, A = ACCEPT_GUESS), i.e. the chance
of reaching the node if every sibling try is accepted with probability A. Nothing in it depends on this round's
tokens or their draft probabilities. That is what keeps sampled trees exact: SpecInfer's multi-step rule
(`tree/specinfer.py`) needs the children of a node to be i.i.d. draws from the drafter's q at that node, given
the path, and a shape chosen from the drawn tokens' own scores (e.g. keeping the most probable of a larger
pool) would bias them. With a fixed shape the children of node u are `n_u` i.i.d. draws from q_u (with
replacement: duplicates stay in the tree and are simply tried again, as the with-replacement rule assumes),
and each child's subtree is drawn afresh given its token, so the rule is exact whatever the shape.

Expansion (`expand`): level l runs the shape's expanded nodes of depth l through the drafter (batched, each
query attending to the committed prefix and to its in-flight ancestors), and each gets its children: the
top-`rank` tokens of its logits (deterministic drafts: verified by `tree/verify.py` with AR's own draws,
token-identical to AR) or i.i.d. draws from q = process_logits(logits) with per-(request, round, node) keys
(sampled drafts: verified by `specinfer.verify_round`).

Draft-model trees (`generate(method="draft", draft_model=, gamma=, branch=, tree_nodes=)`): the drafter keeps
its own exact prefix cache. Each round first runs a catch-up window of the gamma + 1 positions ending at the
root p0 through the drafter in one batched pass (this rewrites the positions committed last round, at most
gamma + 1, whatever the tree drafted; earlier ones are rewritten with the same values), which yields the root's
q; levels 1..gamma-1 then read that cache below p0 + 1 and write nothing. drafts="sample" (the default when
sampling) draws the children i.i.d. from q; drafts="distinct" draws them without replacement (verified by the
matching without-replacement rule, `specinfer.verify_multistep(replacement=False)`); drafts="kseq" draws them
i.i.d. like "sample" and verifies them with SpecTr's K-SEQ (`tree/spectr.py`: one rho per node, the residual
only after every child was rejected; more accepted tokens per node than SpecInfer's for the same draws);
drafts="topk" (always when greedy) takes the top tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq

import jax
import jax.numpy as jnp
import numpy as np

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding import adaptive
from loopspec_jax.decoding import common
from loopspec_jax.decoding.passes import append_level, full_pass, run_level
from loopspec_jax.decoding import sampling
from loopspec_jax.decoding.tree import loop as tl
from loopspec_jax.decoding.tree import verify as tv
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped as M
from loopspec_jax.parallel import entry

ACCEPT_GUESS = 0.7
DEFAULTS = {"gamma": 5, "branch": 3, "tree_nodes": 24}
DRAFTS = ("sample", "distinct", "kseq", "topk")  # i.i.d. (SpecInfer) / without replacement / i.i.d. (K-SEQ) / top


def pool_size(branch: int, gamma: int) -> int:
  """The most nodes a shape can hold besides the root: branch at depth 1, branch^2 at each deeper level."""
  return branch + (gamma - 1) * branch * branch


@dataclasses.dataclass(frozen=True)
class Shape:
  """A static tree (tuples of ints, K = 1 + tree_nodes nodes, topological: by depth, parent, rank)."""

  parent: tuple
  depth: tuple
  rank: tuple  # sibling index (0 = first child)
  expand: tuple  # per level l < gamma: the nodes of depth l that have children (run through the drafter)

  @property
  def runs(self) -> tuple:
    """Every expanded node in run order (level 0 = the root first)."""
    return tuple(i for lvl in self.expand for i in lvl)

  def ancestors(self, i: int) -> set:
    out = set()
    while i:
      i = self.parent[i]
      out.add(i)
    return out

  def past_mask(self, level: int) -> np.ndarray:
    """[F_level, runs before this level] bool: run s is a (strict) ancestor of the level's expanded node f."""
    before = [i for lvl in self.expand[:level] for i in lvl]
    return np.asarray([[s in self.ancestors(f) for s in before] for f in self.expand[level]], bool).reshape(
        len(self.expand[level]), len(before)
    )


@functools.lru_cache(maxsize=None)
def static_shape(gamma: int, branch: int, tree_nodes: int) -> Shape:
  """The best-first static shape of the module docstring (a = ACCEPT_GUESS; ties: first pushed)."""
  a = ACCEPT_GUESS
  par, dep, rnk, val = [0], [0], [0], [1.0]
  expanded = {0: {0}}
  heap = [(-a, 0, 0, 0)]  # (-value, seq, parent, rank)
  seq = 1
  while len(par) < 1 + tree_nodes and heap:
    nv, _, u, r = heapq.heappop(heap)
    d = dep[u]
    level = expanded.setdefault(d, set())
    if r >= branch or d >= gamma or (u not in level and len(level) >= branch):
      continue
    level.add(u)
    par.append(u), dep.append(d + 1), rnk.append(r), val.append(-nv)
    i = len(par) - 1
    heapq.heappush(heap, (nv * (1 - a), seq, u, r + 1))
    heapq.heappush(heap, (nv * a, seq + 1, i, 0))
    seq += 2
  if len(par) < 1 + tree_nodes:
    raise ValueError(f"no tree of {tree_nodes} nodes fits gamma={gamma}, branch={branch}")
  return ordered_shape(par, dep, rnk, gamma)


def ordered_shape(par, dep, rnk, gamma: int) -> Shape:
  """The Shape of a tree given as lists (parent index, depth, sibling rank; entry 0 the root) in any order
  with parents before children: reordered topologically by depth, then the parent's new index, then rank."""
  order = [0]
  for d in range(1, gamma + 1):
    order += sorted((i for i in range(len(par)) if dep[i] == d), key=lambda i: (order.index(par[i]), rnk[i]))
  new = {old: n for n, old in enumerate(order)}
  parent = tuple(new[par[i]] if i else 0 for i in order)
  depth = tuple(dep[i] for i in order)
  rank = tuple(rnk[i] for i in order)
  has_kids = set(parent[1:])
  expand = tuple(tuple(i for i in range(len(order)) if depth[i] == lvl and i in has_kids) for lvl in range(gamma))
  return Shape(parent=parent, depth=depth, rank=rank, expand=expand)


def _draw_children(q, slot, ranks, kids, keys, replacement: bool):
  """[B, n_kids] tokens: kid j drawn from q[:, slot[j]] with key fold_in(keys, kids[j]); without replacement,
  rank by rank, each from its parent's q with the earlier ranks' tokens removed (renormalised)."""
  ck = jax.vmap(lambda kk: jax.vmap(lambda i: jax.random.fold_in(kk, i))(jnp.asarray(kids)))(keys)  # [B, n]
  if replacement:
    return jax.vmap(jax.vmap(sampling.sample_token))(ck, q[:, slot])
  ranks = np.asarray(ranks)
  left = q  # [B, F, V]
  out = jnp.zeros(ck.shape[:1] + (len(kids),), jnp.int32)
  for r in range(int(ranks.max()) + 1):
    js = np.flatnonzero(ranks == r)
    tok = jax.vmap(jax.vmap(sampling.sample_token))(ck[:, js], left[:, slot[js]])  # [B, n_r]
    out = out.at[:, js].set(tok)
    left = left.at[jnp.arange(q.shape[0])[:, None], slot[js][None, :], tok].set(0.0)
  return out


def expand(shape: Shape, root, logits0, run, past, sp, keys, *, branch: int, sample: bool, replacement: bool = True):
  """The round's tree (`verify.Tree` [B, K]) and the drafter's q at every node [B, K, V] (None unless sample).

  root [B] the last committed token; logits0 [B, 1, V] the drafter's readout at the root; run(level, toks
  [B, F], past, past_mask [B, F, n_runs before]) -> (logits [B, F, V], this level's entries) runs the level's
  expanded nodes (`past`: the entries of the runs so far, appended here with `passes.append_level`); keys [B]
  per request and round (sampled children: fold_in of the node index; replacement=False: siblings drawn
  without replacement, for `specinfer.verify_round(replacement=False)`)."""
  b = root.shape[0]
  k = len(shape.parent)
  tokens = jnp.zeros((b, k), jnp.int32).at[:, 0].set(root)
  q_all = jnp.zeros((b, k, logits0.shape[-1]), jnp.float32) if sample else None
  logits = logits0
  for lvl, exp in enumerate(shape.expand):
    if not exp:
      break
    if lvl:
      pm = jnp.broadcast_to(jnp.asarray(shape.past_mask(lvl)), (b,) + shape.past_mask(lvl).shape)
      logits, new = run(lvl, tokens[:, list(exp)], past, pm)
      past = append_level(past, new)
    kids = [i for i in range(k) if shape.depth[i] == lvl + 1]
    slot = np.asarray([exp.index(shape.parent[i]) for i in kids])
    if sample:
      q = common.row_distributions(logits, sp)  # [B, F, V]
      q_all = q_all.at[:, list(exp)].set(q)
      new_tok = _draw_children(q, slot, [shape.rank[i] for i in kids], kids, keys, replacement)
    else:
      top = jax.lax.top_k(logits.astype(jnp.float32), branch)[1]  # [B, F, branch]
      new_tok = top[:, slot, np.asarray([shape.rank[i] for i in kids])]
    tokens = tokens.at[:, kids].set(new_tok.astype(jnp.int32))
  depth = jnp.broadcast_to(jnp.asarray(shape.depth, jnp.int32), (b, k))
  parent = jnp.broadcast_to(jnp.asarray(shape.parent, jnp.int32), (b, k))
  return tv.Tree(tokens=tokens, parent=parent, depth=depth, valid=jnp.ones((b, k), bool)), q_all


def draft_keys(sp: common.SamplingParams, p0):
  """[B] the drafter's per-(request, round) key: the round is named by its root position p0."""
  return jax.vmap(lambda rid, p: sampling.request_key(sp.base_key, rid, p, sampling.PURPOSE_X1))(sp.request_ids, p0)


# ---------------------------------------------------------------------------------------------------
# Draft-model trees
# ---------------------------------------------------------------------------------------------------
def catch_up(dparams, dcache, tokens, p0, width: int, dlayout, dcfg: ModelConfig):
  """The drafter's pass over the `width` positions ending at p0 (written to its cache; positions below 0 are
  copies of position 0, each seeing only itself). Returns (logits at p0 [B, 1, V], dcache)."""
  b, t = tokens.shape
  pos = p0[:, None] - (width - 1) + jnp.arange(width)[None, :]
  ok = pos >= 0
  pos = jnp.maximum(pos, 0)
  toks = jnp.take_along_axis(tokens, pos, axis=1)
  start = jnp.maximum(p0 - (width - 1), 0)
  mask = jnp.broadcast_to(jnp.arange(t)[None, None, :] < start[:, None, None], (b, width, t))
  eye = jnp.eye(width, dtype=bool)[None]
  self_mask = (jnp.tril(jnp.ones((width, width), bool))[None] & ok[:, None, :]) | eye
  logits, dcache = full_pass(dparams, dcache, toks, pos, self_mask, mask, dlayout, dcfg, None)
  return logits[:, -1:], dcache


def draft(dparams, params, st: tv.TreeState, sp, *, dcfg, dlayout, shape, gamma: int, branch: int, sample, repl):
  """The drafter catches up on the committed tokens (its KV cache: st.extra) and expands the static tree."""
  del params
  p0 = st.length - 1
  logits0, dcache = catch_up(dparams, st.extra, st.tokens, p0, gamma + 1, dlayout, dcfg)

  def run(lvl, toks, past, pm):  # the root is in the drafter's cache: past and pm cover levels >= 1
    pm = pm[:, :, 1:]
    return run_level(dparams, dcache, dlayout, toks, p0 + 1, lvl - 1, past, pm, dcfg.recurrence, dcfg, None)

  root = st.tokens[jnp.arange(p0.shape[0]), p0]
  tree, q = expand(
      shape, root, logits0, run, None, sp, draft_keys(sp, p0), branch=branch, sample=sample, replacement=repl
  )
  return st.replace(extra=dcache), ((tree, q) if sample else tree)


@entry.program(entry.DRAFT_LOOP, donate_argnames=("state",))
def decode_loop(params, state, sp, dparams, *, cfg, dcfg, gamma, branch, tree_nodes, drafts, greedy, random_init):
  """Rounds of (the drafter expands a static tree, one full-depth target pass verifies it) until all are done.
  state.extra is the drafter's KV cache; drafts: one of DRAFTS (greedy decoding always takes "topk")."""
  dparams = M.prepare_params(dparams, dcfg)
  sample, repl = drafts != "topk" and not greedy, drafts != "distinct"
  shape = static_shape(gamma, branch, tree_nodes)
  dlayout = kvcache.CacheLayout.of(dcfg, 1)
  drafter = tl.Drafter(
      draft=functools.partial(
          draft, dparams, dcfg=dcfg, dlayout=dlayout, shape=shape, gamma=gamma, branch=branch, sample=sample, repl=repl
      ),
      max_depth=gamma,
      verify=tl.sampled_verify(drafts) if sample else tv.verify_round,
  )
  return tl.run(params, state, sp, drafter, cfg=cfg, greedy=greedy, random_init=random_init)


@entry.program(entry.DRAFT_INIT)
def initial_state(cache, tokens, lengths, sp: common.SamplingParams, dparams, *, cfg: ModelConfig, dcfg: ModelConfig):
  """The loop state: the target cache from the shared prefill, the drafter's cache prefilled over the prompt."""
  del sp, cfg
  b, t = tokens.shape
  dlayout = kvcache.CacheLayout.of(dcfg, 1)
  dcache = kvcache.empty_cache(dcfg, dlayout, b, t)
  dcache = kvcache.prefill(dparams, tokens, lengths, dcache, dcfg, dlayout, (dcfg.recurrence,))
  return tv.fresh_state(cache, tokens, lengths, extra=dcache)


def summarize(st: tv.TreeState, cfg: ModelConfig, dcfg: ModelConfig, settings: dict) -> common.DecodeStats:
  """Raw counts of a draft-model tree run (figures: `verify.tree_figures`). Per round the drafter runs the
  catch-up window (gamma + 1 rows) and the expanded nodes of levels >= 1; the target 1 + tree_nodes rows."""
  shape = static_shape(settings["gamma"], settings["branch"], settings["tree_nodes"])
  draft_rows = settings["gamma"] + 1 + len(shape.runs) - 1
  return common.DecodeStats.of_loop(
      "draft",
      st,
      cfg.recurrence,
      settings={
          **settings,
          "recurrence": cfg.recurrence,
          "draft_layer_calls": draft_rows * adaptive.layer_calls(dcfg, dcfg.recurrence),
          "verify_layer_calls": (1 + settings["tree_nodes"]) * adaptive.layer_calls(cfg, cfg.recurrence),
      },
      per_request=tl.per_request(st),
  )


def resolve(cfg: ModelConfig, gamma, branch, tree_nodes, drafts, method: str = "draft") -> dict:
  """The tree envelope with defaults filled in (tree_nodes at most the pool), or a ValueError naming the bad
  argument (before compiling)."""
  env = {k: DEFAULTS[k] if v is None else v for k, v in dict(gamma=gamma, branch=branch).items()}
  env["tree_nodes"] = tree_nodes
  for k, v in env.items():
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
      raise ValueError(f"method={method!r} with a tree needs an integer {k}, got {v!r}")
  if not 1 <= env["branch"] <= min(cfg.vocab_size, 64):
    raise ValueError(f"method={method!r} needs 1 <= branch <= {min(cfg.vocab_size, 64)}, got {env['branch']}")
  if not 1 <= env["gamma"] <= min(32, cfg.max_len - 1):
    raise ValueError(
        f"method={method!r} needs a tree depth 1 <= gamma <= {min(32, cfg.max_len - 1)}, got {env['gamma']}"
    )
  most = min(pool_size(env["branch"], env["gamma"]), 512)
  if env["tree_nodes"] is None:
    env["tree_nodes"] = min(DEFAULTS["tree_nodes"], most)
  if not 1 <= env["tree_nodes"] <= most:
    raise ValueError(
        f"method={method!r} needs 1 <= tree_nodes <= {most} (branch={env['branch']}, gamma={env['gamma']}), "
        f"got {env['tree_nodes']}"
    )
  if drafts is not None and drafts not in DRAFTS:
    raise ValueError(f"method={method!r} takes drafts in {DRAFTS}, got {drafts!r}")
  env["drafts"] = drafts
  return env


def make_decoder(cfg: ModelConfig, *, greedy: bool, random_init: bool, draft_model, **envelope) -> common.Decoder:
  """The Decoder of a draft-model tree (drafts default to "sample"; greedy decoding always takes top-k)."""
  env = resolve(cfg, **envelope)
  drafts = "topk" if greedy else env.pop("drafts") or "sample"
  env.pop("drafts", None)
  dcfg = draft_model.config
  init_kw = {"dparams": draft_model.params, "dcfg": dcfg}
  settings = dict(env, draft_model=draft_model.source or dcfg.family, drafts=drafts)
  stats = functools.partial(summarize, cfg=cfg, dcfg=dcfg, settings=settings)
  loop_kw = dict(init_kw, **env, drafts=drafts, greedy=greedy, random_init=random_init)
  return common.round_decoder(
      "draft", cfg, env["gamma"], initial_state, decode_loop, stats, init_kw=init_kw, loop_kw=loop_kw
  )
