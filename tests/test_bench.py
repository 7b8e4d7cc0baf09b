"""The side-by-side benchmark runs end to end and reports the fields outside tools read."""
import json

import chex
from absl.testing import absltest

from experiments import bench
from experiments import common


class BenchTest(chex.TestCase):

  def test_benchmark_tiny_model_side_by_side(self):
    model = common.resolve_model("random:tiny_huginn", contraction=0.05, seed=0)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    methods = ["ar", "chain:d1=2,gamma=3", "loopspec:d1=2", "loopspec:d1=2,d2=4"]
    res = bench.benchmark(model, prompts, methods, {"temperature": 0.0}, max_new_tokens=8, repeats=1,
                          progress=False)
    self.assertEqual(list(res), ["ar", "chain(d1=2,gamma=3)", "loopspec(d1=2)", "loopspec(d1=2,d2=4)"])
    for label, r in res.items():
      self.assertTrue(r["identical_to_ar"], label)  # greedy speculative output equals AR token for token
      self.assertEqual(r["tokens"], 16)
      self.assertGreater(r["wall_clock_ratio_median"], 0.0)
      self.assertGreater(r["mean_accepted_length"], 0.0)
    self.assertAlmostEqual(res["ar"]["wall_clock_ratio_median"], 1.0)
    # With a contractive core, most first proposals are accepted.
    self.assertGreater(res["loopspec(d1=2,d2=4)"]["mean_accepted_length"], 2.0)
    rows = [{"model": "tiny", "task": "random", "sampling": "greedy", "method": k, **v} for k, v in res.items()]
    table = bench.markdown_table(rows)
    self.assertIn("loopspec(d1=2,d2=4)", table)
    json.dumps(rows, default=common._json_default)

  def test_parse_method(self):
    self.assertEqual(common.parse_method("loopspec:d1=2,d2=8"), ("loopspec", {"d1": 2, "d2": 8}))
    self.assertEqual(common.parse_method("loopspec:d1=2,d2=none"), ("loopspec", {"d1": 2, "d2": None}))
    self.assertEqual(common.parse_method("ar"), ("ar", {}))


if __name__ == "__main__":
  absltest.main()
