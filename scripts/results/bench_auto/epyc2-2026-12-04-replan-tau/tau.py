"""Lookup's tokens / iteration on prompt + N greedy AR tokens of bench_e512 (the bench's prompt)."""

import json, sys, time
import loopspec_jax as lj
from loopspec_experiments import bench, common

model = common.resolve_model("random:huginn:bench_e512", seed=0)
prompt = bench.load_prompt_set("random", model, 1, 32, 0)[0]
MAX_NEW, MEASURE = 64, 16
ar = lj.generate(model, [prompt], max_new_tokens=MAX_NEW, method="ar").tokens[0]
print("AR text", ar, flush=True)
rows = []
for n in (0, 4, 8, 12, 16, 20, 24, 32, 40, 48):
  ext = prompt + ar[:n]
  rem = MAX_NEW - n
  probe = lj.generate(model, [ext], max_new_tokens=min(MEASURE, rem), method="lookup:ngram=3,gamma=4")
  rest = lj.generate(model, [ext], max_new_tokens=rem, method="lookup:ngram=3,gamma=4")
  row = dict(
      N=n,
      probe_tau=probe.stats["tokens_per_tick"],
      rest_tau=rest.stats["tokens_per_tick"],
      probe_equal_ar=probe.tokens[0] == ar[n : n + MEASURE],
      rest_equal_ar=rest.tokens[0] == ar[n:],
  )
  rows.append(row)
  print(json.dumps(row), flush=True)
json.dump({"prompt": prompt, "ar": ar, "rows": rows}, open("/tmp/replan/tau.json", "w"), indent=1)
