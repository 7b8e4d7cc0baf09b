"""The planner's measured probe: each shortlisted method decodes a few tokens of the requests themselves, in
interleaved rounds, and is rated against AR in the same round (`measure`), with sampled probes on the next
seed's keys (`probe_run`). `planner.make_plan` ranks by these rates; nothing here picks.
"""

from __future__ import annotations

import functools
from typing import List, Tuple

from loopspec_jax.decoding.autoregressive import AR
from loopspec_jax.decoding.method import Method


def probe_run(run, sampling=None):
  """The `run` the measured probe calls: a sampled call's probe draws from the next seed's keys, so that the
  pick does not depend on the very draws its decode then makes (were it chosen on them, the sampled output
  would lean toward what the picked method happens to accept well: exact per method, biased by the choice).
  `sampling`: the call's `common.Sampling` (`run` takes it as its `sampling` keyword); greedy or None: `run`
  itself."""
  if sampling is None or sampling.greedy:
    return run
  return functools.partial(run, sampling=sampling.next_seed())


def _sample(result) -> Tuple[float, float]:
  """(seconds / iteration, tokens / iteration per request) of one probe run."""
  c = result.counts
  iters = max(c.totals.get("iterations", 0), 1)
  return c.totals["decode_seconds"] / iters, c.tokens / c.requests / iters


def measure(run, shortlist: List[Method], budget: int, rounds: int = 5) -> dict:
  """method -> (tokens / iteration, seconds / iteration, rate / AR's rate) of `budget` new tokens of these
  requests. One untimed run each compiles (into the method's own jit cache, which the planned call then
  reuses); then `rounds` short rounds, each running every candidate once in an order rotated by one per
  round. Each candidate's rate is compared with AR's IN THE SAME ROUND (so a host whose load drifts between
  rounds shifts both alike), and the figure kept is the median over rounds of that ratio (with the median
  round's seconds and tokens per iteration): results/bench_auto/vm-2026-12-03 saw the fastest of 2 rounds
  reward whichever candidate met a quiet moment of a loaded host (its pick's probe was 5x too fast).
  shortlist[0] must be AR."""
  if not isinstance(shortlist[0], AR):
    raise ValueError("measure: the shortlist's first method must be AR (the in-round reference)")
  for m in shortlist:
    run(m, budget)
  per = {m: [] for m in shortlist}
  n = len(shortlist)
  for r in range(rounds):
    got = {}
    for i in range(n):
      m = shortlist[(i + r) % n]
      got[m] = _sample(run(m, budget))
    ar_rate = got[shortlist[0]][1] / got[shortlist[0]][0]
    for m, (sec, tok) in got.items():
      per[m].append((tok / sec / ar_rate, sec, tok))
  out = {}
  for m, v in per.items():
    ratio, sec, tok = sorted(v)[len(v) // 2]
    out[m] = (tok, sec, ratio)
  return out
