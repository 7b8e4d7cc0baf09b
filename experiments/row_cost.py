"""What bounds LoopSpec against AR on this machine: the cost of one core step on M rows against one row.

A LoopSpec tick runs d1 core steps on the G = R / d1 lanes of its pipeline (G rows, each attending to the cache
block of its own depth) and commits at most one token; an AR token runs R core steps on one row. Per token
both do the same arithmetic (R row-steps) and read the same KV bytes, so a tick is cheaper than an AR token
only by what running G rows in one product saves over running one row G times. Where the weights are
read from memory for every step (an accelerator, or a CPU with a model larger than its caches) that saving is
nearly G-fold; where they stay in the caches it is small, and no engine can make up for it.

This measures, on the host it runs on, t(M): one core step (the model's real `looped.core_step`, its
weights in decode form, every row attending to T cached positions of its own per core layer) on M rows, in a
jitted `lax.fori_loop` (medians of interleaved repeats), and an AR token of `generate(method="ar")` at the
same cache length. A tick costs at least d1 t(G) (its core steps alone: no pre, coda, LM head, speculative
entries or lane table), so

    LoopSpec / AR  <=  tokens per tick x t_AR / (d1 t(G)),

with tokens per tick at most 1 (and N / (N + G - 1) for an N-token request decoded without one rejection:
the pipeline fills once). That bound leaves out everything a tick does besides its core steps; the second
table measures the whole tick against an AR token at several cache lengths T (`generate`, one random prompt
of T - N tokens, LoopSpec with a single proposal at the model's d1): both read the same KV bytes per token (each
of the R depths attends to its own cache slot), so where their costs grow alike with T the tick's saving on
weights is all LoopSpec has. Writes row_cost.json / .md to out_dir.

  loopspec-row-cost                                    # the bundled models
  loopspec-row-cost --config=row_cost.py:memory_bound  # huginn:bench_e512 (weights larger than the caches)

Settings: configs/row_cost.py.
"""

from __future__ import annotations

import os
import time

from absl import flags
from ml_collections import config_flags

# re-exported: tests read these names here
from loopspec_jax.experiment.row_cost import ar_token_loop  # noqa: F401
from loopspec_jax.experiment.row_cost import check_cache_length
from loopspec_jax.experiment.row_cost import decode_costs
from loopspec_jax.experiment.row_cost import measure
from loopspec_jax.experiment.row_cost import ratio_bound  # noqa: F401
from loopspec_jax.experiment.row_cost import slope_per_position  # noqa: F401
from loopspec_jax.experiment.row_cost import summarize
from loopspec_jax.experiment.row_cost import tables
from loopspec_experiments import common

FLAGS = flags.FlagValues()  # this script's own flags (several experiments may be imported into one process)
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("row_cost.py"), "Row-cost settings.", flag_values=FLAGS
)


def main(argv):
  del argv
  c = _CONFIG.value
  rows_wanted = [int(x) for x in common.split_list(c.rows)]
  contexts = [int(x) for x in common.split_list(c.decode_contexts)]
  if min(rows_wanted, default=1) < 1 or c.steps_per_call < 1:
    raise ValueError(f"rows ({c.rows}) and steps_per_call ({c.steps_per_call}) must be >= 1")
  models = {}
  for spec in common.split_list(c.models):  # every model and cache length checked before anything compiles
    models[spec] = common.resolve_model(
        spec, contraction=c.contraction if spec.startswith("random:") else None, seed=c.seed
    )
    check_cache_length(models[spec].config, c.context, c.new_tokens)
    for t in contexts:
      check_cache_length(models[spec].config, t, c.decode_new_tokens)
  per_model = []
  for spec, model in models.items():
    d1 = common.best_depths(model)[0]
    g = model.config.recurrence // d1
    rows = sorted(set(rows_wanted) | {1, g})
    res = measure(model, rows, c.context, c.new_tokens, c.steps_per_call, c.repeats, c.seed)
    costs = decode_costs(model, d1, contexts, c.decode_new_tokens, c.repeats, c.seed) if contexts else None
    per_model.append((spec, res, summarize(spec, model, res, d1, c.new_tokens, costs)))
    common.release_compiled()
    print(f"{spec}: done", flush=True)
  meta = {
      "machine": common.machine_description(),
      "time": time.strftime("%Y-%m-%d %H:%M:%S"),
      "loadavg": os.getloadavg(),
      "config": c.to_dict(),
  }
  text = (
      f"Machine: {meta['machine']}; load average {meta['loadavg'][0]:.2f}. T = {c.context} cached positions per "
      f"row, medians of {c.repeats} interleaved rounds.\n\n{tables(per_model, c.new_tokens)}"
  )
  print(text)
  payload = {"meta": meta, "models": [{"spec": n, "measured": r, "summary": s} for n, r, s in per_model]}
  common.write_report(c.out_dir, "row_cost", payload, text)


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
