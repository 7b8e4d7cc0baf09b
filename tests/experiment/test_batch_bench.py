"""loopspec_jax/experiment/batch_bench.py (loopspec-batch-bench) with a fake `generate`: rows per batch size,
ratios to the first method, where a method stops paying, and the table."""

import types

import ml_collections

import loopspec_jax
from loopspec_jax.experiment import batch_bench


def test_benchmark_rows_and_table(monkeypatch):
  def fake_generate(model, prompts, *, max_new_tokens, method, temperature, seed, mesh):
    b = len(prompts)
    tps = {"ar": 10.0 * b, "loopspec": 40.0}[method.name]  # AR scales with the batch, LoopSpec does not here
    stats = {"tokens_per_second": tps, "tokens_generated": 4 * b, "decode_seconds": 0.1, "ticks": 3}
    return types.SimpleNamespace(stats=stats, tokens=[[1]] * b)

  monkeypatch.setattr(loopspec_jax, "generate", fake_generate)
  cfg = ml_collections.ConfigDict(
      dict(
          seed=0,
          methods="ar;loopspec:2,8",
          batch_sizes="1,4,8",
          prompt_len=3,
          max_new_tokens=4,
          temperature=0.0,
          repeats=2,
      )
  )
  model = types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=11))
  said = []
  rows = batch_bench.benchmark(model, cfg, progress=said.append)
  assert [r["batch"] for r in rows] == [1, 4, 8] and len(said) == 6
  ls = "loopspec(d1=2,d2=8)"
  assert [r[ls]["speedup_vs_ar"] for r in rows] == [4.0, 1.0, 0.5] and rows[0][ls]["identical_to_ar"]
  assert batch_bench.stops_paying(rows, "ar", ls) == 4 and batch_bench.stops_paying(rows[:1], "ar", ls) is None
  text = batch_bench.markdown(rows, ["ar", ls])
  assert "| 1 | 10.0 | 40.0 | 4.00x | yes |" in text and text.endswith(f"{ls} stops paying at B = 4.")
