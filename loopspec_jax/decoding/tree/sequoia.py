"""Sequoia's static tree shape (Chen et al., 2024): the tree of `tree_nodes` nodes, depth <= gamma and at most
`branch` children per node that maximises the expected accepted length under a measured acceptance vector.

The acceptance model: accept[d - 1][k] is the probability that the rank-k child (k-th best token of the
drafter's readout, or the k-th sibling try when children are sampled) of an accepted depth-(d - 1) node is
the accepted one; a node is reached with the product of its path's entries, and the expected number of
accepted drafts of a tree is the sum of its nodes' reach probabilities. A flat vector (one entry per rank)
means the same at every depth. The dynamic program (`best_children`) is exact for that model: the value of a
subtree of m descendants under a node of depth d is a knapsack over its children's ranks, each rank either
absent or given a subtree of s >= 1 nodes (ranks need not be contiguous, so a noisy, non-monotone vector is
still optimised). The shape is static (tuples, fixed at trace time), so it serves deterministic top-k drafts
(`draft_tree.expand(sample=False)`, verified with AR's own draws: token-identical to AR) and sampled drafts
(children drawn i.i.d. / without replacement, SpecInfer's rule: exact whatever the shape).

`DEFAULT_ACCEPT` holds the vectors measured on tiny-raven (pooled over GSM8K and Shakespeare calibration
prompts 8..15, never the benchmark's first 8; `experiments/tree_shape.py`), per d1 and decoding mode: greedy,
and under sampling per drafts mode (sampled children are accepted by SpecInfer's rule, whose later siblings
face the residual norm(max(p - q, 0)): a far steeper vector than greedy's second ranks). drafts="kseq"
(SpecTr's K-SEQ, `tree/spectr.py`) accepts slot i of a node with c children with beta_c (1 - beta_c)^i, beta_c
depending on c: its vectors are count tables (row c - 1: the c slots), optimised by `kseq_shape`'s DP (a
node's value is a maximum over its child count c of the knapsack over its c slots).
"""

from __future__ import annotations

import functools

import numpy as np

from loopspec_jax.decoding.tree import draft_tree as dt

# greedy, measured by `python -m loopspec_experiments.tree_shape` (results/trees_shape/epyc2-2026-12-03/
# shape.md): P(AR's greedy token is the rank-k top-4 token of the d1 readout | its parent accepted), pooled over
# depths and over GSM8K and Shakespeare prompts 8..15 (720 depth-1 trials per task and d1), 3 decimals.
# Sampled (T = 1), measured by `tree_shape --sampled` (results/trees_shape/epyc2-2026-12-04-t1cal/shape_t1.md)
# along AR's T = 1 text of the same prompts: P(sibling k is the accepted child | its parent accepted), exact
# under SpecInfer's rule from the target's p and the readout's q at every node of AR's path ("sample": i.i.d.
# children; "distinct": without replacement, Monte Carlo over the rejected tokens; "topk": deterministic top-k
# drafts verified with AR's draws, E[p(rank-k token of q)]), pooled over depths, prompts and tasks.
DEFAULT_ACCEPT = {
    (1, "greedy"): (0.889, 0.087, 0.021, 0.002),
    (2, "greedy"): (0.984, 0.015, 0.001, 0.0),
    (1, "sample"): (0.894, 0.039, 0.018, 0.010),
    (2, "sample"): (0.968, 0.013, 0.005, 0.003),
    (1, "distinct"): (0.894, 0.042, 0.018, 0.010),
    (2, "distinct"): (0.968, 0.014, 0.006, 0.003),
    (1, "topk"): (0.228, 0.073, 0.046, 0.035),
    (2, "topk"): (0.233, 0.074, 0.046, 0.035),
    # drafts="kseq" (SpecTr's K-SEQ): count-dependent, row c - 1 = P(slot i is the accepted child | c
    # children) = E[beta_c (1 - beta_c)^i], exact, pooled like the rows above (`tree_shape --sampled`,
    # results/trees_shape/epyc2-2026-12-04-kseq/shape_t1.md)
    (1, "kseq"): ((0.894,), (0.806, 0.148), (0.744, 0.180, 0.051), (0.697, 0.200, 0.065, 0.023)),
    (2, "kseq"): ((0.968,), (0.924, 0.068), (0.890, 0.094, 0.013), (0.864, 0.113, 0.019, 0.004)),
}
MODES = ("greedy", "sample", "distinct", "kseq", "topk")  # greedy decoding / the sampled drafts modes


def default_accept(d1: int, mode: str, branch: int) -> tuple:
  """The measured vector for a draft depth d1 (the deepest measured when d1 is deeper) and a decoding mode
  ("greedy", or the sampled drafts mode: "sample", "distinct", "topk"), its first `branch` ranks."""
  if mode not in MODES:
    raise ValueError(f"no default acceptance vector for mode {mode!r}; known: {MODES}")
  d1 = min(d1, max(d for d, m in DEFAULT_ACCEPT if m == mode))
  return DEFAULT_ACCEPT[d1, mode][:branch]


def is_count_table(accept) -> bool:
  """Whether a parsed accept is a K-SEQ count table (rows of 1, 2, ... entries) rather than `parse_accept`'s
  (gamma, branch) form (where the two coincide, gamma = branch = 1, both DPs give the same one-node tree)."""
  return all(len(r) == i + 1 for i, r in enumerate(accept))


def shape_of(accept: tuple, gamma: int, branch: int, tree_nodes: int) -> dt.Shape:
  """Sequoia's shape for a parsed accept: `kseq_shape` for a count table, else `sequoia_shape`."""
  if is_count_table(accept):
    return kseq_shape(accept, gamma, branch, tree_nodes)
  return sequoia_shape(accept, gamma, branch, tree_nodes)


def parse_accept(accept, gamma: int, branch: int) -> tuple:
  """accept as a (gamma, branch) tuple of tuples of floats in [0, 1]: from a flat sequence (one entry per
  rank, same at every depth), a sequence of per-depth rows, or a string '0.9/0.05/0.02/0.01' (spec strings);
  missing ranks are 0. ValueError on anything else."""
  if isinstance(accept, str):
    try:
      accept = tuple(float(x) for x in accept.split("/"))
    except ValueError:
      raise ValueError(f"accept must be '/'-separated probabilities, got {accept!r}") from None
  try:
    rows = [tuple(float(x) for x in r) for r in accept] if np.ndim(accept) == 2 else [tuple(float(x) for x in accept)]
  except (TypeError, ValueError):
    raise ValueError(f"accept must be a sequence of probabilities (or of per-depth rows), got {accept!r}") from None
  if len(rows) == 1:
    rows = rows * gamma
  if len(rows) != gamma or any(not r or len(r) > branch for r in rows):
    raise ValueError(f"accept needs 1..branch={branch} entries per rank (and 1 or gamma={gamma} rows), got {accept!r}")
  for r in rows:
    if any(not 0.0 <= x <= 1.0 for x in r) or sum(r) > 1.0 + 1e-6:
      raise ValueError(f"accept entries must be probabilities summing to <= 1 per depth, got {accept!r}")
  return tuple(tuple(r) + (0.0,) * (branch - len(r)) for r in rows)


def best_children(accept: tuple, gamma: int, branch: int, n: int):
  """The DP tables: value[d][m] = the best expected accepted descendants of a depth-d node given m descendant
  nodes (-inf where they cannot fit), and choice[d][m] = its children as ((rank, subtree size), ...)."""
  neg = -np.inf
  value = [[0.0] + [neg] * n for _ in range(gamma + 1)]
  choice = [[()] * (n + 1) for _ in range(gamma + 1)]
  for d in range(gamma - 1, -1, -1):
    p = accept[d]  # the children are at depth d + 1
    # h[j][m]: best over ranks j..branch-1 with m nodes in their subtrees; pick[j][m] the size given to rank j
    h = [[neg] * (n + 1) for _ in range(branch + 1)]
    h[branch][0] = 0.0
    pick = [[0] * (n + 1) for _ in range(branch)]
    for j in range(branch - 1, -1, -1):
      for m in range(n + 1):
        best, arg = h[j + 1][m], 0
        for s in range(1, m + 1):
          sub, rest = value[d + 1][s - 1], h[j + 1][m - s]
          if sub == neg or rest == neg:
            continue
          v = p[j] * (1.0 + sub) + rest
          if v > best + 1e-12:
            best, arg = v, s
        h[j][m], pick[j][m] = best, arg
    for m in range(1, n + 1):
      value[d][m] = h[0][m]
      kids, left = [], m
      for j in range(branch):
        if pick[j][left]:
          kids.append((j, pick[j][left]))
          left -= pick[j][left]
      choice[d][m] = tuple(kids)
  return value, choice


@functools.lru_cache(maxsize=None)
def sequoia_shape(accept: tuple, gamma: int, branch: int, tree_nodes: int) -> dt.Shape:
  """The optimal static shape (module docstring) for accept (`parse_accept`'s (gamma, branch) form)."""
  value, choice = best_children(accept, gamma, branch, tree_nodes)
  if value[0][tree_nodes] == -np.inf:
    raise ValueError(f"no tree of {tree_nodes} nodes fits gamma={gamma}, branch={branch}")
  par, dep, rnk = [0], [0], [0]
  todo = [(0, tree_nodes)]  # (node, descendants to place)
  while todo:
    u, m = todo.pop()
    for r, s in choice[dep[u]][m]:
      par.append(u), dep.append(dep[u] + 1), rnk.append(r)
      todo.append((len(par) - 1, s - 1))
  return dt.ordered_shape(par, dep, rnk, gamma)


# ---------------------------------------------------------------------------------------------------
# Count-dependent acceptance (drafts="kseq": SpecTr's K-SEQ, `tree/spectr.py`)
# ---------------------------------------------------------------------------------------------------
def parse_counts(table, branch: int) -> tuple:
  """A K-SEQ acceptance table: row c - 1 (c = 1..branch children) holds the c per-slot probabilities
  P(slot i is the accepted child | c children), as nested sequences or a string '0.9;0.8/0.16;...' (rows
  ';'-separated, entries '/'); rows past the table's are unavailable (no node gets that many children).
  ValueError on anything else."""
  if isinstance(table, str):
    try:
      table = [[float(x) for x in r.split("/")] for r in table.split(";")]
    except ValueError:
      raise ValueError(f"a K-SEQ table must be ';'-separated rows of '/'-separated floats, got {table!r}") from None
  try:
    rows = tuple(tuple(float(x) for x in r) for r in table)
  except (TypeError, ValueError):
    raise ValueError(f"a K-SEQ table must be rows of probabilities, got {table!r}") from None
  if not rows or any(len(r) != c + 1 for c, r in enumerate(rows)):
    raise ValueError(f"a K-SEQ table needs rows of 1, 2, 3, ... entries (row c - 1: c children), got {table!r}")
  if any(not 0.0 <= x <= 1.0 for r in rows for x in r) or any(sum(r) > 1.0 + 1e-6 for r in rows):
    raise ValueError(f"a K-SEQ table's entries must be probabilities summing to <= 1 per row, got {table!r}")
  return rows[:branch]


def _count_value(value_next, row, n: int):
  """The best value of exactly len(row) children (slot i reached with row[i]) sharing m = 0..n nodes, each
  child subtree of s >= 1 nodes worth value_next[s - 1]: (h [n + 1], sizes per m)."""
  neg = -np.inf
  h, sizes = [0.0] + [neg] * n, [()] + [None] * n  # no slots yet
  for a in reversed(row):
    nh, ns = [neg] * (n + 1), [None] * (n + 1)
    for m in range(1, n + 1):
      for s in range(1, m + 1):
        if value_next[s - 1] == neg or h[m - s] == neg:
          continue
        v = a * (1.0 + value_next[s - 1]) + h[m - s]
        if v > nh[m] + 1e-12:
          nh[m], ns[m] = v, (s,) + sizes[m - s]
    h, sizes = nh, ns
  return h, sizes


@functools.lru_cache(maxsize=None)
def kseq_shape(table: tuple, gamma: int, branch: int, tree_nodes: int) -> dt.Shape:
  """Sequoia's DP for count-dependent acceptance (`parse_counts`' table, the same at every depth): a node
  with c children reaches its slot i with table[c - 1][i] (K-SEQ: rho, hence beta, depends on c)."""
  neg = -np.inf
  value = [[0.0] + [neg] * tree_nodes for _ in range(gamma + 1)]
  choice = [[()] * (tree_nodes + 1) for _ in range(gamma + 1)]
  for d in range(gamma - 1, -1, -1):
    for row in table[:branch]:
      h, sizes = _count_value(value[d + 1], row, tree_nodes)
      for m in range(1, tree_nodes + 1):
        if h[m] > value[d][m] + 1e-12:
          value[d][m], choice[d][m] = h[m], sizes[m]
  if value[0][tree_nodes] == neg:
    raise ValueError(f"no tree of {tree_nodes} nodes fits gamma={gamma}, branch={branch}")
  par, dep, rnk = [0], [0], [0]
  todo = [(0, tree_nodes)]
  while todo:
    u, m = todo.pop()
    for r, s in enumerate(choice[dep[u]][m]):
      par.append(u), dep.append(dep[u] + 1), rnk.append(r)
      todo.append((len(par) - 1, s - 1))
  return dt.ordered_shape(par, dep, rnk, gamma)


def expected_accepted_counts(shape: dt.Shape, table: tuple) -> float:
  """The count model's expected accepted drafts of a shape: the i-th of c siblings (in index order, whatever
  their rank labels) is reached with table[c - 1][i] times its parent's reach."""
  sibs = {}
  for j in range(1, len(shape.parent)):
    sibs.setdefault(shape.parent[j], []).append(j)
  reach = [1.0] * len(shape.parent)
  for i in range(1, len(shape.parent)):
    kids = sibs[shape.parent[i]]
    reach[i] = reach[shape.parent[i]] * table[len(kids) - 1][kids.index(i)]
  return float(sum(reach[1:]))


def expected_accepted(shape: dt.Shape, accept: tuple) -> float:
  """The model's expected accepted drafts of a shape: the sum of its nodes' reach probabilities."""
  reach = [1.0]
  for i in range(1, len(shape.parent)):
    reach.append(reach[shape.parent[i]] * accept[shape.depth[i] - 1][shape.rank[i]])
  return float(sum(reach[1:]))
