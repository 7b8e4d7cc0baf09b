"""Method "auto": the planner's settings as a registered `Method` value, so the spec string "auto" (and
"auto:measure=8,replan=0") parses like every other method's in `generate`, the configs, the server and the demo.

Nothing here plans: `api.generate` and the serving engine hand an `Auto` to the planner (`planner.generate`,
`planner.engine_plan`), which sits above the registry and picks one of the registered exact methods per call.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import numpy as np

from loopspec_jax.config import ModelConfig
from loopspec_jax.decoding.draft import Draft
from loopspec_jax.decoding.method import Method
from loopspec_jax.models.model import LoopedModel

# New tokens before the re-plan, by default. Long enough for repeats to form in the generated text (the
# acceptance a probe on the prompt cannot see: bench_e512's greedy text lets prompt lookup verify 1.64 tokens
# per iteration over 64 tokens, results/bench_auto/epyc2-2026-12-04-e512-idle), short enough that the first
# pick's segment is a small part of a typical budget (64+); equal to the probe's default `measure`.
REPLAN = 16


@dataclasses.dataclass(frozen=True)
class Auto(Method):
  """The planner's choice for the requests of each `generate` call (loopspec_jax/planner.py's docstring);
  `probe_tokens`: prompt tokens of the depth-agreement probe (0: Theorem 2's envelope, no probe); `shortlist`:
  see `planner.rank` (HLO re-timing; compiles abstract loops, slow); `measure`: new tokens each shortlisted
  method decodes on the requests before the pick (0: the prediction alone), `candidates` of them at most
  besides AR, best predicted first (None: the whole `planner.measured_shortlist`; each one compiles); `rounds`:
  the probe's interleaved rounds; `replan`: new tokens decoded with the first pick before the probe re-runs on
  prompt + those tokens and picks again for the rest (`planner.generate`; 0: off, None: `REPLAN`);
  `draft_model`: a drafter to consider ('draft')."""

  name = "auto"
  probe_tokens: Optional[int] = 32
  shortlist: Optional[int] = 0
  measure: Optional[int] = 16
  rounds: Optional[int] = 5
  replan: Optional[int] = REPLAN
  candidates: Optional[int] = None
  draft_model: Union[LoopedModel, str, None] = dataclasses.field(default=None, compare=False)

  def __post_init__(self):
    if isinstance(self.draft_model, str):
      object.__setattr__(self, "draft_model", Draft(draft_model=self.draft_model).draft_model)

  def validate(self, cfg: ModelConfig) -> None:
    if self.rounds is not None and int(self.rounds) < 1:
      raise ValueError(f"auto: rounds must be >= 1, got {self.rounds}")
    for f in ("probe_tokens", "shortlist", "measure", "candidates"):
      if getattr(self, f) is not None and int(getattr(self, f)) < 0:
        raise ValueError(f"auto: {f} must be >= 0, got {getattr(self, f)}")
    r = self.replan
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0):
      raise ValueError(f"auto: replan must be an int >= 0 (new tokens before re-planning; 0: off), got {r!r}")

  def make_decoder(self, cfg: ModelConfig, *, greedy: bool, random_init: bool):
    raise ValueError("method='auto' is resolved per call by the planner (planner.generate) before a decoder is built")
