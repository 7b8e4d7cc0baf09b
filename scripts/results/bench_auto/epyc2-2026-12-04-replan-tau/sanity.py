"""bench_e512 greedy, the bench's prompt, 64 new tokens: auto (replan 16) picks, identity, and a wall-clock sanity check."""

import json, time
import loopspec_jax as lj
from loopspec_experiments import bench, common

model = common.resolve_model("random:huginn:bench_e512", seed=0)
prompt = bench.load_prompt_set("random", model, 1, 32, 0)[0]
gen = lambda m: lj.generate(model, [prompt], max_new_tokens=64, method=m, seed=0, request_ids=[0])
ar = gen("ar")
lk = gen("lookup:ngram=3,gamma=4")
t0 = time.perf_counter()
au = gen("auto")
t1 = time.perf_counter()
p = au.stats["plan"]
print("first call s", round(t1 - t0, 1), "picks", p["picks"], "identical", au.tokens == ar.tokens, flush=True)
print("plan 1:", p["reason"])
print("plan 2:", p["replan"].get("reason", p["replan"]))
for name, pl in (("probe 1", p), ("probe 2", p["replan"])):
  for r in pl.get("top", []):
    print(
        name,
        r["method"],
        "tok/iter %.3f ms/iter %.1f x_ar %s" % (r["tokens_per_iteration"], r["iteration_ms"], r.get("x_ar")),
    )
print("plan seconds", p["plan_seconds"], p["replan"].get("plan_seconds"), flush=True)
walls = {"ar": [], "lookup": [], "auto": []}
for rep in range(3):
  for name, m in (("ar", "ar"), ("lookup", "lookup:ngram=3,gamma=4"), ("auto", "auto"))[rep:] + (
      ("ar", "ar"),
      ("lookup", "lookup:ngram=3,gamma=4"),
      ("auto", "auto"),
  )[:rep]:
    t0 = time.perf_counter()
    r = gen(m)
    walls[name].append(time.perf_counter() - t0)
    if name == "auto":
      assert r.tokens == ar.tokens and r.stats["plan"]["cached"]
print("walls", json.dumps(walls))
med = {k: sorted(v)[1] for k, v in walls.items()}
print("median s", med, "auto/lookup %.3f auto/ar %.3f" % (med["auto"] / med["lookup"], med["auto"] / med["ar"]))
print(
    "auto segments",
    [
        (s["method"], s["tokens"], s["ticks"], round(s["decode_seconds"], 3), round(s["prefill_seconds"], 3))
        for s in r.stats["segments"]
    ],
)
