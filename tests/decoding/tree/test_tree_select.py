"""Static node-selection rules for drafted pools (`decoding/tree/select.py`), on hand-made pools (no model)."""

import jax.numpy as jnp
import numpy as np
import pytest

from loopspec_jax.decoding.tree import select
from loopspec_jax.decoding.tree import self_spec

# root; a, b at depth 1; c under a, d under b; e under c, f under d (scores: cumulative log-probabilities)
TOK = jnp.asarray([[10, 11, 12, 13, 14, 15, 16]])
SCORE = jnp.asarray([[0.0, -0.1, -1.0, -0.2, -1.1, -0.3, -1.2]])
PARENT = jnp.asarray([[0, 0, 0, 1, 2, 3, 4]])
DEPTH = jnp.asarray([[0, 1, 1, 2, 2, 3, 3]])


def rows(tree):
  return [np.asarray(getattr(tree, k))[0].tolist() for k in ("tokens", "parent", "depth", "valid")]


def test_by_score_is_self_spec_select():
  want = self_spec.select(TOK, SCORE, PARENT, DEPTH, 3)
  got = select.by_score(TOK, SCORE, PARENT, DEPTH, 3)
  assert rows(got) == rows(want) == [[10, 11, 13, 15], [0, 0, 1, 2], [0, 1, 2, 3], [True] * 4]


def test_by_level_keeps_quotas_and_drops_orphans():
  assert rows(select.by_level(TOK, SCORE, PARENT, DEPTH, (1, 1, 1))) == rows(
      select.by_score(TOK, SCORE, PARENT, DEPTH, 3)
  )
  # two at depth 3: f's parent d is not kept, so f is invalid
  got = rows(select.by_level(TOK, SCORE, PARENT, DEPTH, (1, 1, 2)))
  assert got[0] == [10, 11, 13, 15, 16] and got[3] == [True, True, True, True, False]
  assert got[1][:4] == [0, 0, 1, 2]
  got = rows(select.by_level(TOK, SCORE, PARENT, DEPTH, (2, 2, 0)))
  assert got == [[10, 11, 12, 13, 14], [0, 0, 0, 1, 2], [0, 1, 1, 2, 2], [True] * 5]


def test_by_level_quota_past_a_levels_candidates_is_invalid():
  got = rows(select.by_level(TOK, SCORE, PARENT, DEPTH, (3, 1)))  # depth 1 has only two candidates
  assert sum(got[3]) == 4 and got[0][:4] == [10, 11, 12, 13] and got[1][:4] == [0, 0, 0, 1]


def test_even_quotas():
  assert select.even_quotas(4, 6, 32) == (4, 6, 6, 6, 5, 5)
  assert select.even_quotas(2, 3, 6) == (2, 2, 2) and select.even_quotas(4, 1, 3) == (3,)
  with pytest.raises(ValueError, match="do not fit"):
    select.even_quotas(2, 2, 10)
