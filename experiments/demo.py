"""The main job: decode a few prompts with autoregressive decoding and LoopSpec, greedy and sampled.

  loopspec-demo                      # bundled tiny-raven, LoopSpec at (d1, d2) = (2, 8)
  loopspec-demo --model=tiny-ouro    # bundled tiny-ouro, (1, 2)
  loopspec-demo --model=/path/to/checkpoint --d1=2 --d2=8

Prints the text of each method, decode tokens/s (after prefill, compiled), the wall-clock ratio, the mean
accepted length, and whether greedy LoopSpec reproduced the autoregressive tokens exactly.
"""
from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

import loopspec_jax  # noqa: E402

_MODEL = flags.DEFINE_string("model", "tiny-raven", "bundled model name or checkpoint directory")
_D1 = flags.DEFINE_integer("d1", None, "first proposal depth (default: the model's best known)")
_D2 = flags.DEFINE_integer("d2", None, "second proposal depth (default: the model's best known)")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "tokens to generate per prompt")
_SEED = flags.DEFINE_integer("seed", 0, "sampling seed")

PROMPTS = [
    "ROMEO:\nWhat light is this that breaks upon mine eyes?\n\nJULIET:\n",
    "Question: Natalia sold 48 clips in April and half as many in May. How many clips did she sell?\nAnswer:",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "KING HENRY:\nOnce more unto the",
]
BEST = {"huginn": (2, 8), "raven-llama": (2, 8), "raven-olmo": (2, 8), "ouro": (1, 2)}


def best_depths(model) -> tuple:
  """The (d1, d2) the theory and our sweeps favour for the model's family and depth."""
  r = model.config.recurrence
  d1, d2 = BEST.get(model.family, (1, 2))
  if r % d1 or not d1 < d2 < r or d2 % d1:
    d1, d2 = 1, None
  return d1, d2


def timed(model, prompts, **kw):
  """Runs once to compile, then again to time decoding after prefill."""
  loopspec_jax.generate(model, prompts, **kw)
  t0 = time.perf_counter()
  res = loopspec_jax.generate(model, prompts, **kw)
  res.stats["wall_seconds"] = time.perf_counter() - t0
  return res


def main(argv):
  del argv
  print(f"loading {_MODEL.value} ...", flush=True)
  model = loopspec_jax.load(_MODEL.value)
  d1, d2 = best_depths(model)
  d1 = _D1.value or d1
  d2 = _D2.value if _D2.value is not None else d2
  if model.tokenizer is not None:
    prompts = [model.encode(p) for p in PROMPTS]
  else:
    prompts = [[(7 * i + j) % model.config.vocab_size for j in range(12)] for i in range(len(PROMPTS))]
  print(f"model: {model.family}, R={model.recurrence}, LoopSpec (d1, d2) = ({d1}, {d2})", flush=True)
  settings = [("greedy", dict(temperature=0.0)), ("sampled T=1.0 top_p=0.7", dict(temperature=1.0, top_p=0.7))]
  for name, samp in settings:
    print(f"\n=== {name} ===", flush=True)
    results = {}
    for label, kw in (("autoregressive", dict(method="ar")),
                      ("loopspec", dict(method="loopspec", d1=d1, d2=d2))):
      print(f"[{label}] compiling and decoding {len(prompts)} prompts ...", flush=True)
      out = []
      stats = {"tokens": 0, "decode": 0.0, "acc": []}
      for i, p in enumerate(prompts):  # one request at a time, as the paper measures
        res = timed(model, [p], max_new_tokens=_MAX_NEW.value, seed=_SEED.value, request_ids=[i], **samp, **kw)
        out.append(res.tokens[0])
        stats["tokens"] += res.stats["tokens_generated"]
        stats["decode"] += res.stats["decode_seconds"]
        stats["acc"].append(res.stats["mean_accepted_length"])
      results[label] = (out, stats)
    ar_out, ar_st = results["autoregressive"]
    ls_out, ls_st = results["loopspec"]
    for i, p in enumerate(PROMPTS if model.tokenizer is not None else prompts):
      text = model.decode(ls_out[i]) if model.tokenizer is not None else ls_out[i]
      print(f"\n--- prompt {i}: {p!r}\n{text}")
    ar_tps = ar_st["tokens"] / ar_st["decode"]
    ls_tps = ls_st["tokens"] / ls_st["decode"]
    print(f"\nautoregressive: {ar_tps:8.1f} tokens/s")
    print(f"loopspec:       {ls_tps:8.1f} tokens/s   mean accepted length "
          f"{sum(ls_st['acc']) / len(ls_st['acc']):.2f} of {model.recurrence // d1}")
    print(f"wall-clock ratio (decode after prefill): {ar_st['decode'] / ls_st['decode']:.2f}x")
    if name == "greedy":
      print(f"greedy outputs identical: {ar_out == ls_out}")


def run():
  app.run(main)


if __name__ == "__main__":
  run()
