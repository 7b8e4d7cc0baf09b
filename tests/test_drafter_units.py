"""Drafter pieces whose bugs keep output exact but draft worse, on hand-made inputs (no decode loop):

- lookahead's n-gram ring buffer after it wrapped: the newest n-grams are proposed first (n-gram number q
  lives in slot q % P), and the Jacobi update keeps writing at the ring's next slot;
- head training targets: a head that outputs the right one-hot target has (near) zero loss at its offset
  (Medusa head i: the token i + 2 after the feature's position; MTP: t_{i+2} from the feature at i and
  t_{i+1}), and a head one offset off does not.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loopspec_jax.decoding.tree import lookahead as la
from loopspec_jax.heads import medusa
from loopspec_jax.heads import mtp

build_tree = jax.jit(la.build_tree, static_argnums=2)
jacobi_update = jax.jit(la.jacobi_update)
per_head_xent = jax.jit(medusa.per_head_xent)
top1_hits = jax.jit(medusa.top1_hits)


def wrapped_state(added: int, slots: int = 6):
  """A pool of `slots` whose n-grams numbered added - slots .. added - 1 all start with token 7 and hold their
  number: n-gram q is (7, q, q + 50) in slot q % slots."""
  pool = np.zeros((1, slots, 3), np.int32)
  for q in range(added - slots, added):
    pool[0, q % slots] = (7, q, q + 50)
  return la.LookaheadState(window=jnp.asarray([[11, 12]]), pool=jnp.asarray(pool), added=jnp.asarray([added]))


@pytest.mark.parametrize("added", [9, 14])
def test_wrapped_pool_proposes_the_newest_ngrams_first(added):
  tree = build_tree(jnp.asarray([7]), wrapped_state(added), 4)
  newest = [added - 1 - i for i in range(4)]
  assert tree.tokens[0].tolist()[3:] == [t for q in newest for t in (q, q + 50)]
  assert tree.valid[0].tolist() == [True] * 11


def test_jacobi_update_after_a_wrap_overwrites_the_oldest_slot():
  """added = 9 (slots 6): the next n-grams are numbers 9, 10, 11 in slots 3, 4, 5 (the oldest ones)."""
  state = wrapped_state(9)
  tokens = jnp.asarray([[1, 2, 3, 7, 0, 0, 0, 0, 0, 0]])
  y = jnp.asarray([[11, 20, 21, 0, 0]])
  out = jacobi_update(state, tokens, jnp.asarray([3]), y, jnp.asarray([1]), jnp.asarray([True]))
  assert int(out.added[0]) == 12
  pool = np.asarray(out.pool[0]).tolist()
  assert pool[3:] == [[3, 7, 11], [7, 11, 20], [11, 12, 21]] and pool[:3] == np.asarray(state.pool[0]).tolist()[:3]
  tree = build_tree(jnp.asarray([7]), out, 2)  # the newest n-gram starting with 7 is number 10: (7, 11, 20)
  assert tree.tokens[0].tolist()[3:5] == [11, 20]


# ---------------------------------------------------------------------------------------------------
# Head training targets
# ---------------------------------------------------------------------------------------------------
V, T, K = 16, 10, 3
BIG = 60.0


def medusa_oracle(tokens, offset: int):
  """Medusa params whose head i, at feature position t (features: one-hot positions), puts BIG on
  tokens[t + i + offset] (a zero MLP: head_logits = feature @ proj)."""
  proj = np.zeros((K, T, V), np.float32)
  for i in range(K):
    for t in range(T):
      if t + i + offset < T:
        proj[i, t, tokens[t + i + offset]] = BIG
  return {"w": jnp.zeros((K, T, T)), "b": jnp.zeros((K, T)), "proj": jnp.asarray(proj)}


def test_medusa_head_with_the_right_one_hot_target_has_zero_loss():
  tokens = np.random.default_rng(0).integers(0, V, size=T).astype(np.int32)
  feats = jnp.eye(T)[None]  # position t's feature is one-hot t
  right = per_head_xent(medusa_oracle(tokens, 2), feats, jnp.asarray(tokens[None]))
  np.testing.assert_allclose(np.asarray(right), 0.0, atol=1e-6)
  for off in (1, 3):
    wrong = per_head_xent(medusa_oracle(tokens, off), feats, jnp.asarray(tokens[None]))
    assert np.all(np.asarray(wrong) > 1.0), (off, wrong)
  hits, counts = top1_hits(medusa_oracle(tokens, 2), feats, jnp.asarray(tokens[None]))
  assert np.asarray(hits).tolist() == np.asarray(counts).tolist() == [T - 2 - i for i in range(K)]


def markov(seq_len: int, seed: int = 0):
  """tokens [1, seq_len] of a deterministic chain: t_{j+1} = (3 t_j + 1) % V."""
  t = [int(np.random.default_rng(seed).integers(V))]
  for _ in range(seq_len - 1):
    t.append((3 * t[-1] + 1) % V)
  return jnp.asarray([t], jnp.int32)


@pytest.mark.parametrize("shift", [0, 1])
def test_mtp_module_with_the_right_one_hot_target_has_zero_loss(shift, monkeypatch):
  """mtp.loss scores logits(feature at i, t_{i+1}) against t_{i+2}: an oracle that returns one-hot of the
  chain's successor of t_{i+1} (shift 0) has zero loss and full accuracy; one that predicts t_{i+1}
  itself (shift 1: one offset short) does not."""
  step = lambda t: (3 * t + 1) % V if shift == 0 else t
  oracle = lambda mp, tp, feature, next_tokens, cfg: BIG * jax.nn.one_hot(step(next_tokens), V)
  monkeypatch.setattr(mtp, "logits", oracle)
  tgt = markov(T)
  nll, acc = mtp.loss(None, None, jnp.zeros((1, T, 4)), tgt, None)
  if shift == 0:
    assert float(nll) < 1e-6 and float(acc) == 1.0
  else:
    assert float(nll) > 1.0 and float(acc) < 0.5
