"""Randomly initialised heads of every head method for a fixture target (tests of the head methods' wiring:
api checks, serving, mesh), and the methods' entry points that validation must never reach."""

import jax

from loopspec_jax.decoding import common
from loopspec_jax.decoding.tree import eagle as eagle_decoder
from loopspec_jax.decoding.tree import medusa as medusa_decoder
from loopspec_jax.decoding.tree import mtp as mtp_decoder
from loopspec_jax.heads import artefact
from loopspec_jax.heads import dflash
from loopspec_jax.heads import eagle
from loopspec_jax.heads import medusa
from loopspec_jax.heads import mtp

KINDS = ("medusa", "eagle", "mtp")
# a small envelope of each (the fixtures' R = 8, context 64)
ENVELOPES = {
    "medusa": dict(tree_nodes=6, branch=2),
    "eagle": dict(gamma=3, branch=2, tree_nodes=6),
    "mtp": dict(gamma=2, branch=2),
    "dflash": dict(gamma=3),  # not in KINDS: its own tests are tests/decoding/tree/test_dflash.py
}
LOOPS = {"medusa": medusa_decoder, "eagle": eagle_decoder, "mtp": mtp_decoder}


def random_heads(kind: str, model, seed: int = 1) -> artefact.Heads:
  """A head of `kind` for `model` whose drafts are neither trivial nor all equal."""
  key = jax.random.PRNGKey(seed)
  if kind == "medusa":
    return medusa.make_heads(model, 3, key, scale=1.0)
  if kind == "eagle":
    config = eagle.head_config(model.config, "final")
    return artefact.Heads(eagle.KIND, eagle.init_params(config, key), config, artefact.target_signature(model))
  if kind == "mtp":
    return mtp.make_heads(model, mtp.init_params(model.config, key), 0.3)
  if kind == "dflash":
    config = dflash.head_config(model.config)
    return artefact.Heads(dflash.KIND, dflash.init_params(config, key), config, artefact.target_signature(model))
  raise ValueError(kind)


def spec_kwargs(kind: str, model, seed: int = 1) -> dict:
  """generate's keyword arguments of a head method: method, heads and its small envelope."""
  return dict(method=kind, heads=random_heads(kind, model, seed), **ENVELOPES[kind])


def never_called(kind: str) -> list:
  """(module, attribute) pairs of the programs a refused request must not reach."""
  return [(common, "prefill_state"), (LOOPS[kind], "decode_loop")]
