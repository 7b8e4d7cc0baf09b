"""Adaptive gamma (`gamma="auto"`): each request picks its draft length from its own past acceptance only.

The loop is compiled for a maximum gamma G (`AUTO_MAX_GAMMA`, static shapes); every round, request b drafts
and offers only its first g_b <= G proposals (the verify kernels accept at most g_b of them, see
`verify.verify_chain_upto`, and the drafting steps beyond the batch's largest g_b are skipped).

The rule. Per request, decayed counts of drafts accepted (`num`) and drafts examined by verification
(`den`: the accepted ones plus the first rejected one) give a running acceptance estimate
a = (num + PRIOR_RATE * PRIOR_WEIGHT) / (den + PRIOR_WEIGHT) (counts decay by DECAY per round). g_b maximises
expected tokens per unit of cost,

    E[tokens | g] / cost(g) = [(1 - a^(g+1)) / (1 - a)] / (g * draft_cost + fixed_cost),    g = 1..G,

the i.i.d.-acceptance model of Leviathan et al. with the method's costs in layer calls per position
(`draft_cost`: one drafting step; `fixed_cost`: the verify pass plus any drafting paid every round). The choice
depends only on outcomes of earlier rounds, never on the uniforms or drafts of the round it sets, so every
round is an ordinary speculative-sampling round with g_b drafts and decoding stays exact. With free drafts
(prompt lookup) the rule picks G. `generate(..., speculate_max_batch=K)` turns speculation off for batches
above K (compute-bound devices), as for every speculative method.
"""

from __future__ import annotations

import jax.numpy as jnp

from loopspec_jax.config import ModelConfig

AUTO_MAX_GAMMA = 8  # the compiled maximum draft length of gamma="auto"
DECAY = 0.8  # per-round decay of the acceptance counts (an effective memory of ~5 rounds)
PRIOR_RATE = 0.7  # the acceptance rate assumed before any round, ...
PRIOR_WEIGHT = 2.0  # ... worth this many examined drafts


def parse_gamma(method: str, gamma) -> tuple:
  """(compiled gamma, auto) of a method's `gamma` argument: an integer >= 1 or "auto"; ValueError otherwise."""
  if isinstance(gamma, str) and gamma == "auto":
    return AUTO_MAX_GAMMA, True
  if gamma is None or isinstance(gamma, (bool, str)) or int(gamma) != gamma or gamma < 1:
    raise ValueError(f"{method} needs an integer gamma >= 1, got {gamma!r} (or gamma='auto')")
  return int(gamma), False


def layer_calls(cfg: ModelConfig, depth: int, coda: bool = True) -> int:
  """Transformer-layer calls of one position run to recurrent depth `depth` (prelude, core steps, coda)."""
  pre = cfg.n_prelude if cfg.is_raven else 0
  post = cfg.n_coda if (cfg.is_raven and coda) else 0
  return pre + cfg.n_core * depth + post


def expected_tokens(a, g):
  """(1 - a^(g+1)) / (1 - a) = sum_{i=0..g} a^i: expected tokens of a round with g drafts at i.i.d.
  acceptance rate a (the accepted drafts plus one token from the target); any shapes that broadcast."""
  a = jnp.asarray(a, jnp.float32)
  g = jnp.asarray(g, jnp.float32)
  safe = jnp.where(a < 1.0, 1.0 - a, 1.0)
  return jnp.where(a < 1.0, (1.0 - a ** (g + 1.0)) / safe, g + 1.0)


def acceptance_estimate(num, den):
  """The running acceptance estimate [B] from the decayed counts (with the prior)."""
  return (num + PRIOR_RATE * PRIOR_WEIGHT) / (den + PRIOR_WEIGHT)


def choose_gamma(num, den, gamma_max: int, draft_cost: float, fixed_cost: float):
  """Per-request draft length g [B] int32 in 1..gamma_max maximising expected tokens per cost (module doc)."""
  a = acceptance_estimate(num, den)[:, None]  # [B, 1]
  g = jnp.arange(1, gamma_max + 1, dtype=jnp.float32)[None, :]  # [1, G]
  rate = expected_tokens(a, g) / (g * draft_cost + fixed_cost)
  return (jnp.argmax(rate, axis=1) + 1).astype(jnp.int32)


def update(num, den, n_acc, n_offered, live):
  """Counts after a round in which a request offered n_offered drafts [B] and n_acc [B] were accepted: the
  examined drafts are the accepted ones plus the first rejected one (none when all were accepted)."""
  examined = n_acc + (n_acc < n_offered).astype(n_acc.dtype)
  num = jnp.where(live, DECAY * num + n_acc, num)
  den = jnp.where(live, DECAY * den + examined, den)
  return num, den


def initial_counts(b: int) -> dict:
  """acc_num, acc_den [B] float32 before any round (the prior alone), as a state's constructor keywords."""
  z = jnp.zeros((b,), jnp.float32)
  return {"acc_num": z, "acc_den": z}
