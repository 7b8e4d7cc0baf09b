#!/usr/bin/env bash
# One prepared command for a CUDA machine: install the project with CUDA JAX, run the engine issue's benchmark on
# the bundled models (AR, chain, LoopSpec; greedy and sampled) and on a real-shape random Huginn-0125 in bf16.
#   launch/bench_gpu.sh              # install + run, results in results/bench_gpu/
#   launch/bench_gpu.sh --dry-run    # print the commands only
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-$ROOT/.venv-gpu}"
CMDS=(
  "python3 -m venv $VENV"
  "$VENV/bin/pip install --upgrade pip"
  "$VENV/bin/pip install .[dev] jax[cuda12]"
  "$VENV/bin/python -c 'import jax; print(jax.devices())'"
  "$VENV/bin/python -m loopspec_jax.experiments.bench --config=bench/bundled.py:targets --config.out_dir=results/bench_gpu"
  "$VENV/bin/python -m loopspec_jax.experiments.bench --config=bench/default.py:huginn_0125 --config.out_dir=results/bench_gpu_huginn"
)
for c in "${CMDS[@]}"; do
  echo "+ $c"
  if [[ "${1:-}" != "--dry-run" ]]; then
    bash -c "$c"
  fi
done
