"""Benchmark configs (`loopspec-bench --config=bench/<name>.py[:preset]`)."""
