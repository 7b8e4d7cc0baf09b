"""LoopSpec's second proposal at depth d2 and its ablation variants (the paper's Table 3).

Two choices define the second proposal of a lane whose first draft is x1 ~ q1:

  second  "residual" (the paper's): q2 = norm(max(0, p_d2 - q1)) with q2[x1] = 0;
          "masked" (the ablation):  q2 = norm(p_d2) with q2[x1] = 0 (the depth-d2 readout, x1 masked out).
  gate    True  (the paper's "decrease" gate): propose only when p_d2[x1] < q1[x1] (x1 looks likely to be
                rejected) and the masked mass is positive;
          False ("always"): propose whenever the masked mass is positive.

The release names the same runs `gate-decrease` / `gate-always` and `proposal-residual` / `proposal-masked-q2`.
Table 3 compares: no second proposal (d2=None), masked without gate, residual without gate, residual with gate.

Every variant keeps decoding exact: the cascade verification (`verify.verify_cascade`) returns exactly p_R
for ANY q2 with x2 ~ q2, and no gate looks at the verification uniforms. Greedy decoding works on one-hot
distributions, where "residual" proposes argmax p_d2 iff it differs from x1 (with or without the gate), so
the greedy "masked" variant is defined on the logits instead: x2 = the d2 readout's argmax with x1 excluded
(its runner-up when it agrees with x1); ungated, it always proposes.
"""

from __future__ import annotations

import jax.numpy as jnp

from loopspec_jax.decoding import sampling

SECOND_KINDS = ("residual", "masked")
SECOND_ALIASES = {"masked-q2": "masked"}  # the release's spelling
GATE_ALIASES = {"decrease": True, "always": False, "true": True, "false": False}


def normalize_second(second):
  """'residual' / 'masked' (the release's 'masked-q2' too) or None (default: residual) -> the canonical name."""
  if second is None:
    return None
  if not isinstance(second, str) or SECOND_ALIASES.get(second, second) not in SECOND_KINDS:
    raise ValueError(f"second must be one of {SECOND_KINDS} (or 'masked-q2'), got {second!r}")
  return SECOND_ALIASES.get(second, second)


def normalize_gate(gate):
  """True / False, or the release's 'decrease' / 'always' (also 'true' / 'false', 1 / 0) -> bool; None stays."""
  if gate is None or isinstance(gate, bool):
    return gate
  if isinstance(gate, int) and gate in (0, 1):
    return bool(gate)
  if isinstance(gate, str) and gate.lower() in GATE_ALIASES:
    return GATE_ALIASES[gate.lower()]
  raise ValueError(f"gate must be True / False (or 'decrease' / 'always'), got {gate!r}")


def propose(key, q1, x1, p_d2, *, second: str = "residual", gate: bool = True, min_mass: float = 0.0):
  """The second proposal of one lane -> (open bool, x2 int32, q2 [V]); q1, p_d2 [V] processed distributions.

  Closed: x2 = -1 and q2 = 0. `min_mass` (gated only): the least mass of the unnormalised proposal for which
  the gate opens (`LoopSpec.gate_mass`). second='residual', gate=True is `verify.second_proposal` exactly."""
  q1 = jnp.asarray(q1, jnp.float32)
  p_d2 = jnp.asarray(p_d2, jnp.float32)
  base = jnp.maximum(0.0, p_d2 - q1) if second == "residual" else p_d2
  r = base.at[x1].set(0.0)
  s = jnp.sum(r)
  is_open = s > 0
  if gate:
    is_open = is_open & (s >= min_mass) & (p_d2[x1] < q1[x1])
  q2 = jnp.where(is_open, r / jnp.where(s > 0, s, 1.0), 0.0)
  x2 = jnp.where(is_open, sampling.sample_token(key, q2), -1).astype(jnp.int32)
  return is_open, x2, q2


def propose_greedy(logits_d2, x1, *, second: str = "residual", gate: bool = True):
  """Greedy second proposals of lanes: logits_d2 [..., V], x1 [...] -> (open [...] bool, x2 [...] int32).

  'residual' (either gate) and gated 'masked': x2 = argmax, open iff x2 != x1. Ungated 'masked': x2 = the
  argmax with x1 excluded, always open."""
  if second == "masked" and not gate:
    vocab = jnp.arange(logits_d2.shape[-1])
    masked = jnp.where(vocab == x1[..., None], -jnp.inf, logits_d2)
    x2 = sampling.greedy_token(masked)
    return jnp.ones(x2.shape, bool), x2
  x2 = sampling.greedy_token(logits_d2)
  return x2 != x1, x2
