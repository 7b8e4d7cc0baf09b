"""method="auto" beside every fixed candidate, in one run: wall clock of whole `generate` calls.

For each model and sampling, every method decodes every prompt (one request at a time) once untimed (compiles;
auto plans here, its plan cached for the process), then `repeats` interleaved rounds (method order rotated)
time the whole `generate` call. The table gives medians over rounds, the ratio to AR of the same round, auto's
ratio to the fastest fixed method, auto's pick (with re-planning: both picks, the second's probe x AR) and the
first pick's predicted vs probe-measured vs benchmark-measured ms per iteration, and the host load.

  python -m loopspec_experiments.bench_auto --config=bench/auto.py
"""

from __future__ import annotations

import time

from absl import flags
from ml_collections import config_flags

from loopspec_jax.experiment.auto_bench import run_row
from loopspec_jax.experiment.auto_bench import table
from loopspec_jax.experiment.prompts import load_prompt_set
from loopspec_experiments import common

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("bench/auto.py"), "Benchmark settings.", flag_values=FLAGS
)


def main(argv):
  del argv
  cfg = _CONFIG.value
  blocks = []
  for spec in common.split_list(cfg.models):
    task, num, repeats, specs = cfg.runs[spec]
    model = common.resolve_model(spec, seed=cfg.seed)
    prompts = load_prompt_set(task, model, num, cfg.prompt_len, cfg.seed)
    for samp in common.split_list(cfg.samplings):
      print(f"{spec} {samp}: {len(prompts)} prompts, {specs}", flush=True)
      rows = run_row(
          model, prompts, list(specs), dict(cfg.sampling_settings[samp]), cfg.max_new_tokens, repeats, cfg.seed
      )
      blocks.append({"model": spec, "sampling": samp, "task": task, "rows": rows})
      md = table(blocks)
      print(md, flush=True)
      meta = {
          "machine": common.machine_description(),
          "time": time.strftime("%Y-%m-%d %H:%M:%S"),
          "config": cfg.to_dict(),
      }
      common.write_report(cfg.out_dir, "bench", {"meta": meta, "blocks": blocks}, f"Machine: {meta['machine']}\n\n{md}")
      common.release_compiled()


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
