"""Drafter pieces whose bugs keep output exact but draft worse, on hand-made inputs (no decode loop):

- lookahead's n-gram ring buffer after it wrapped: the newest n-grams are proposed first (n-gram number q
  lives in slot q % P), and the Jacobi update keeps writing at the ring's next slot;
- EAGLE's drafting levels: each runs at the position the head was trained at and reads the output of the
  row that proposed it;
- the draft-model tree's drafter cache equals a prefill of the committed tokens (catch-up window);
- head training targets: a head that outputs the right one-hot target has (near) zero loss at its offset
  (Medusa head i: the token i + 2 after the feature's position; MTP: t_{i+2} from the feature at i and
  t_{i+1}), and a head one offset off does not.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import head_helpers
import helpers
import loopspec_jax as lj
from loopspec_jax.decoding.tree import draft_tree as dt
from loopspec_jax.decoding.tree import eagle as eagle_decoder
from loopspec_jax.decoding.tree import lookahead as la
from loopspec_jax.heads import eagle as eagle_heads
from loopspec_jax.heads import medusa
from loopspec_jax.heads import mtp
from loopspec_jax.models import kvcache
from loopspec_jax.models import looped

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


# ---------------------------------------------------------------------------------------------------
# EAGLE's drafting levels against the layout the head was trained in (heads/eagle.py `unrolled`)
# ---------------------------------------------------------------------------------------------------
def test_eagle_levels_sit_where_training_put_them_and_read_their_parents_feature(monkeypatch):
  """`unrolled`: step k of row j reads x_{j+k} and (k > 1) its own step k - 1 output, at position j + k - 1.
  In a round the last pending row is j = p0 - 1 (level 0 = step 1), so drafting level l (step l + 1) must
  run at p0 + l - 1, and each frontier query must read the output h of the row whose logits proposed it."""
  model = helpers.tiny_model("huginn:tiny")
  heads = head_helpers.random_heads("eagle", model)
  cfg, gamma, branch = model.config, 3, 2
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 60, size=(2, 16)), jnp.int32)
  lengths = jnp.asarray([5, 9], jnp.int32)
  width = eagle_heads.feature_width(heads.config)
  st = eagle_decoder.initial_state(None, tokens, lengths, None, cfg=cfg, gamma=gamma, width=width)
  params = looped.prepare_params(model.params, cfg)
  calls = []
  original = eagle_heads.step

  def spy(hp, tparams, toks, feature, pos, self_mask, ctx, cfg):
    h, k, v = original(hp, tparams, toks, feature, pos, self_mask, ctx, cfg)
    calls.append((toks, feature, pos, h))
    return h, k, v

  monkeypatch.setattr(eagle_heads, "step", spy)

  @jax.jit
  def levels(params, hp, st):
    calls.clear()
    eagle_decoder.draft_tree(
        params, hp, st, cfg=cfg, feature=heads.config["feature"], gamma=gamma, branch=branch, tree_nodes=5
    )
    return [(f, p, h, looped.readout_logits(params, h, cfg)) for _, f, p, h in calls], [c[0] for c in calls]

  out, toks = levels(params, heads.params, st)
  assert len(out) == gamma
  p0 = np.asarray(lengths) - 1
  np.testing.assert_array_equal(np.asarray(out[0][1])[:, 0], p0 - 1)  # level 0: the last pending row, j = p0 - 1
  for lvl in range(1, gamma):
    feat, pos, _, _ = out[lvl]
    np.testing.assert_array_equal(np.asarray(pos), np.broadcast_to((p0 + lvl - 1)[:, None], pos.shape))
    _, _, h_prev, lg_prev = out[lvl - 1]
    if lvl == 1:  # level 0 ran the pending rows; its output at the last one feeds every depth-1 candidate
      h_prev = jnp.take_along_axis(h_prev, (lengths - 2 - st.extra.q0)[:, None, None], axis=1)
      lg_prev = looped.readout_logits(params, h_prev, cfg)
    proposed = np.asarray(jax.lax.top_k(lg_prev, branch)[1])  # [B, rows, branch]
    for b in range(2):
      for j in range(branch):
        t = int(toks[lvl][b, j])
        rows = [r for r in range(proposed.shape[1]) if t in proposed[b, r]]
        assert any(np.allclose(feat[b, j], h_prev[b, r], atol=1e-5) for r in rows), (lvl, b, j, rows)


# ---------------------------------------------------------------------------------------------------
# The draft-model tree's drafter cache (decoding/tree/draft_tree.py catch-up window)
# ---------------------------------------------------------------------------------------------------
def test_draft_tree_drafter_cache_equals_a_prefill_of_the_committed_tokens(monkeypatch):
  """The target as its own drafter (greedy): every round accepts all gamma drafts and commits gamma + 1
  tokens, so the catch-up window must cover gamma + 1 positions; afterwards the drafter's cache holds, at
  every position up to the last round's root, what a prefill of the committed tokens holds."""
  model = helpers.tiny_model("huginn:tiny", 0.05)
  final = {}
  original = dt.decode_loop

  def keep(*args, **kw):
    final["state"] = out = original(*args, **kw)
    return out

  monkeypatch.setattr(dt, "decode_loop", keep)
  gamma = 3
  prompts = [[5, 6, 7], [40, 41, 42, 43, 44]]
  res = lj.generate(
      model, prompts, max_new_tokens=12, method="draft", draft_model=model, gamma=gamma, branch=2, tree_nodes=4
  )
  assert res.stats["accepted_per_pass"] == gamma, res.stats  # every round commits gamma + 1
  st = final["state"]
  cfg = model.config
  layout = kvcache.CacheLayout.of(cfg, 1)
  b, t = st.tokens.shape
  fresh = kvcache.prefill(
      looped.prepare_params(model.params, cfg),
      st.tokens,
      st.length,
      kvcache.empty_cache(cfg, layout, b, t),
      cfg,
      layout,
      (cfg.recurrence,),
  )
  covered = np.arange(t)[None, :] < (np.asarray(st.length) - gamma - 1)[:, None]  # [B, T] up to the last root
  for got, want in zip(jax.tree_util.tree_leaves(st.extra), jax.tree_util.tree_leaves(fresh)):
    g, w = np.asarray(got), np.asarray(want)  # [..., B, KV, T, D]
    sel = covered[:, None, :, None]
    np.testing.assert_allclose(np.where(sel, g, 0), np.where(sel, w, 0), atol=2e-4)
