"""loopspec-serve-bench: open-loop Poisson load against the serving engine, in process and over HTTP.

  loopspec-serve-bench --model=tiny-raven --methods='ar;loopspec:2,8' --rates=1,4,16 --num_requests=12

For each method (one engine each, compiled and warmed on every prompt first) and each arrival rate (requests/s;
0 = one request at a time, closed loop), requests arrive at Poisson times (seeded) with the demo prompts in
turn; the table reports throughput (generated tokens / span from the first arrival to the last completion),
time to first token (TTFT) and inter-token latency (ITL: the gap between a request's consecutive chunks, split
evenly over the chunk's tokens) p50 / p99 in ms, in process (`engine`) and through the HTTP server (`http`,
streamed completions over a local socket). Rate 0 also reports `generate`'s decode ms per token for the same
requests, and the engine's per-token overhead against it.

  loopspec-serve-bench --soak_minutes=10 --soak_out=results/serve_soak/<run>

runs the soak instead (loopspec_jax/serving/soak.py): `loopspec-serve` as its own process on 127.0.0.1 (with
`--soak_server_args`), N minutes of mixed load with faults (disconnects, malformed and oversized bodies, slow
and vanishing clients, the tokenizer process killed), /health probed throughout, then SIGTERM with a stalled
client; it prints (and writes to `soak_out`/summary.json) the outcome of every request by kind and status.
"""

from __future__ import annotations

from absl import flags

from loopspec_jax import methods
from loopspec_jax.experiment.load import arrivals
from loopspec_jax.experiment.load import one_at_a_time_overhead
from loopspec_jax.experiment.load import run_engine
from loopspec_jax.experiment.load import run_http
from loopspec_jax.experiment.load import serve_in_thread
from loopspec_jax.experiment.load import table
from loopspec_jax.experiment.prompts import demo_prompt_ids
from loopspec_experiments import common
from loopspec_experiments.serve import build_engine
from loopspec_jax.serving import Request

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "model", "tiny-raven", "Bundled model, checkpoint directory or random:<family>:<variant>.", flag_values=FLAGS
)
flags.DEFINE_string(
    "methods",
    "ar;loopspec:2,8",
    "';'-separated method specs of the registry (loopspec_jax.methods).",
    flag_values=FLAGS,
)
flags.DEFINE_string("rates", "0,2,8,32", "Arrival rates in requests/s (0: one request at a time).", flag_values=FLAGS)
flags.DEFINE_integer("num_requests", 12, "Requests per rate.", flag_values=FLAGS)
flags.DEFINE_integer("max_tokens", 48, "Tokens per request.", flag_values=FLAGS)
flags.DEFINE_integer("slots", 4, "Engine slots.", flag_values=FLAGS)
flags.DEFINE_integer("max_len", None, "Context per slot (default: the model's).", flag_values=FLAGS)
flags.DEFINE_integer("ticks_per_call", 16, "Loop iterations per device call.", flag_values=FLAGS)
flags.DEFINE_boolean(
    "greedy", True, "Greedy requests on greedy-only engines (else T=1, top-p 0.7 requests).", flag_values=FLAGS
)
flags.DEFINE_boolean("http", True, "Also measure through the HTTP server.", flag_values=FLAGS)
flags.DEFINE_integer("seed", 0, "Arrival-time seed.", flag_values=FLAGS)
flags.DEFINE_string("out", None, "Write the rows as JSON here.", flag_values=FLAGS)
flags.DEFINE_float(
    "soak_minutes", 0.0, "> 0: run the soak (mixed load with faults) this long instead.", flag_values=FLAGS
)
flags.DEFINE_string("soak_server_args", "", "Soak: extra loopspec-serve flags (space-separated).", flag_values=FLAGS)
flags.DEFINE_string("soak_out", None, "Soak: write summary.json into this directory.", flag_values=FLAGS)


def parse_methods(text: str) -> list:
  """'ar;loopspec:2,8;chain:2,6' -> [(label, EngineConfig kwargs)]: any spec of the registry
  (`loopspec_jax.methods`), the Method object itself as `method`."""
  return [(m.spec, {"method": m}) for m in methods.parse_list(text)]


def soak_main(f) -> int:
  """The soak (loopspec_jax/serving/soak.py): prints its report; exit 1 when anything failed."""
  import os

  from loopspec_jax.serving import soak

  run = soak.Soak(f.soak_minutes, f.soak_server_args.split(), model=f.model, seed=f.seed)
  print(f"soak: loopspec-serve on {run.base} for {f.soak_minutes:g} minutes ...", flush=True)
  summary = soak.run_and_report(run)
  if f.soak_out:
    os.makedirs(f.soak_out, exist_ok=True)
    common.atomic_write_json(os.path.join(f.soak_out, "summary.json"), summary)
  return 0 if summary["ok"] else 1


def main(argv):
  del argv

  f = FLAGS
  if f.soak_minutes > 0:
    return soak_main(f)
  rates = [float(x) for x in common.split_list(f.rates)]
  rows = []
  for label, kw in parse_methods(f.methods):
    model, engine = build_engine(
        f.model,
        slots=f.slots,
        max_len=f.max_len,
        ticks_per_call=f.ticks_per_call,
        greedy_only=f.greedy,
        max_queue=max(64, f.num_requests),
        **kw,
    )
    prompts = demo_prompt_ids(model)
    sampling = dict(temperature=0.0) if f.greedy else dict(temperature=1.0, top_p=0.7)
    reqs = [
        Request(prompt=prompts[i % len(prompts)], max_tokens=f.max_tokens, seed=i, **sampling)
        for i in range(f.num_requests)
    ]
    print(f"[{label}] compiling ...", flush=True)
    for p in prompts:  # every prefill bucket and the decode loop
      engine.generate(Request(prompt=p, max_tokens=2, **sampling))
    engine.start()
    base = None
    if f.http:
      base, stop_server = serve_in_thread(engine, "bench")
    for rate in rates:
      offsets = arrivals(rate, f.num_requests, f.seed)
      row = dict(method=label, rate=rate, path="engine", **run_engine(engine, reqs, offsets, rate == 0))
      if rate == 0:
        gen, eng = one_at_a_time_overhead(engine, model, reqs[: len(prompts)], kw, f.greedy)
        row.update(generate_ms_per_token=gen, engine_ms_per_token=eng)
      rows.append(row)
      print(table([row]).splitlines()[-1], flush=True)
      if base:
        row = dict(method=label, rate=rate, path="http", **run_http(base, "bench", reqs, offsets, rate == 0))
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    if base:
      stop_server()
    engine.stop()
  print(
      f"\n{f.model}, {f.num_requests} requests x {f.max_tokens} tokens per rate, {f.slots} slots, "
      f"context {f.max_len or 'of the model'}, {f.ticks_per_call} iterations per device call, "
      f"{'greedy' if f.greedy else 'T=1 top-p 0.7'}\n"
  )
  print(table(rows))
  if f.out:
    common.atomic_write_json(f.out, rows)
  return 0


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
