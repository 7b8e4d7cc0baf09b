"""The paper's Table 3 (ablation of LoopSpec's second proposal) on a bundled model, in one interleaved run.

  python -m loopspec_experiments.paper_table3                          # configs/paper/table3.py
  python -m loopspec_experiments.paper_table3 --config=paper/table3.py:quick

Every method of the config (AR first, then LoopSpec per depth pair and variant) decodes every prompt one
request at a time through `timing.benchmark` (loopspec_jax/experiment/timing.py: a compiling warm-up, then
`repeats` interleaved repeats with the method order rotated). Per row: gamma as the release counts it (decode tokens only, from its second-proposal
split) beside our older figure over every token, the wall-clock ratio against AR (median over repeats, the
same repeat's AR), the same ratio over decode time after each request's first token (an estimate: the share
of ticks after the first commit; AR: of its tokens), the release's split of first rejections, gate-open rate,
live lanes and skipped spawns (0: skip-free). Writes table3.json and table3.md under `out_dir`.
"""

from __future__ import annotations

import time

from absl import flags
from ml_collections import config_flags

from loopspec_jax import methods as methods_lib
from loopspec_jax.experiment import timing
from loopspec_jax.experiment.prompts import load_prompt_set
from loopspec_jax.experiment.table3 import markdown
from loopspec_jax.experiment.table3 import table_rows
from loopspec_experiments import common

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("paper/table3.py"), "Table 3 settings.", flag_values=FLAGS
)


def main(argv):
  del argv
  cfg = _CONFIG.value
  model = common.resolve_model(cfg.model, seed=0)
  prompts = load_prompt_set(cfg.task, model, cfg.num_prompts, cfg.prompt_len, cfg.seed)
  prompts = [prompts[i] for i in cfg.prompt_select]
  parsed = methods_lib.parse_list(list(cfg.methods))
  labels = timing.row_labels(parsed)
  sampling = {"temperature": cfg.temperature, "top_p": cfg.top_p, "init_state": cfg.init_state}
  print(f"{cfg.model}, {cfg.task}: {len(prompts)} prompts, {len(parsed)} methods", flush=True)
  results = timing.benchmark(
      model, prompts, list(cfg.methods), sampling, max_new_tokens=cfg.max_new_tokens, repeats=cfg.repeats, seed=cfg.seed
  )
  if common.is_main_process():  # the raw figures first: a long run is never lost to a formatting error
    common.atomic_write_json(f"{cfg.out_dir}/raw.json", {"config": cfg.to_dict(), "methods": results})
  rows = table_rows(results, parsed, labels)
  meta = {
      "model": cfg.model,
      "machine": common.machine_description(),
      "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
      "config": cfg.to_dict(),
      "ar_tokens_per_second_median": results["ar"]["tokens_per_second_median"],
      "ar_decode_seconds_all": results["ar"]["decode_seconds_all"],
  }
  table = markdown(rows, meta)
  print(table)
  if common.is_main_process():
    common.write_report(cfg.out_dir, "table3", {"meta": meta, "rows": rows, "methods": results}, table)


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
