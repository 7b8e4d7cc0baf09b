"""Benchmark of the decoding methods on a contractive R=32 Raven-style model (issue: LoopSpec decoding).

loopspec-bench                                  # this config (the default)
loopspec-bench --config=bench/default.py:quick  # CI-sized
loopspec-bench --config=bench/default.py:huginn_0125   # real-shape random Huginn-0125 in bf16 (accelerators)
loopspec-bench --config=bench/default.py:memory_bound  # Huginn-0125's layout at E = 512: memory-bound on a CPU
loopspec-bench --config=bench/default.py:cpu_rehearsal # tiny: launch/bench_{gpu,tpu}.sh --cpu
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.models = ["random:huginn:bench_r32"]  # 'random:<family>:<variant>', bundled model names or checkpoint dirs
  c.model_label = "bench-raven-r32 (contractive, random)"
  c.contraction = ml_collections.FieldReference(0.05, field_type=float)  # 'random:' models only; none: as drawn
  c.seed = 0
  c.tasks = ["random"]
  c.num_prompts = 3
  c.prompt_len = 32
  c.max_new_tokens = 128
  c.repeats = 3
  c.samplings = ["greedy"]
  c.sampling_settings = {"greedy": {"temperature": 0.0}, "sample": {"temperature": 1.0, "top_p": 0.7}}
  c.methods = ["ar", "chain:d1=2,gamma=6", "loopspec:d1=2", "loopspec:d1=2,d2=8"]
  c.methods_by_model = {}
  c.dtype = "float32"
  c.out_dir = "results/bench"
  if arg == "huginn_0125":  # the real Huginn-0125 shape (3.5B parameters), random contractive weights, bf16
    c.models = ["random:huginn:0125"]
    c.model_label = "huginn-0125 shape (random, contractive, bf16)"
    c.dtype = "bfloat16"
    c.num_prompts = 2
    c.max_new_tokens = 64
    c.methods = ["ar", "chain:d1=2,gamma=8", "loopspec:d1=2,d2=8"]
    c.out_dir = "results/bench_huginn_0125"
  elif arg == "memory_bound":  # weights (64M float32 parameters) far larger than the caches, as on an accelerator
    c.models = ["random:huginn:bench_e512"]
    c.model_label = "huginn-e512 (random, contractive)"
    c.num_prompts = 2
    c.max_new_tokens = 96
    c.repeats = 2
    c.methods = ["ar", "chain:d1=2,gamma=8", "loopspec:d1=2", "loopspec:d1=2,d2=8"]
    c.out_dir = "results/bench_memory_bound"
  elif arg == "quick":
    c.num_prompts = 1
    c.max_new_tokens = 16
    c.repeats = 1
    c.out_dir = "results/bench_quick"
  elif arg == "cpu_rehearsal":  # launch/bench_{gpu,tpu}.sh --cpu: the accelerator scripts' steps at tiny sizes
    c.models = ["random:huginn:tiny"]
    c.model_label = "huginn:tiny (random)"
    c.num_prompts = 1
    c.prompt_len = 8
    c.max_new_tokens = 2
    c.repeats = 1
    c.methods = ["ar"]  # one compile per step: the rehearsal checks the script path, not the speed
    c.out_dir = "results/bench_cpu_rehearsal"
  elif arg:
    raise ValueError(f"unknown preset {arg!r}; known: quick, huginn_0125, memory_bound, cpu_rehearsal")
  return c
