#!/usr/bin/env bash
# One prepared command for a CUDA machine: install the project with CUDA JAX, run the engine issue's benchmark on
# the bundled models (AR, chain, LoopSpec; greedy and sampled) and on a real-shape random Huginn-0125 in bf16,
# then the cost-model calibration on the device (predicted vs measured iterations: the projection's check there).
#   launch/bench_gpu.sh              # install + run, results in results/bench_gpu*/ and results/cost_calibration/
#   launch/bench_gpu.sh --dry-run    # print the commands only
#   launch/bench_gpu.sh --cpu        # rehearsal: the same steps on this machine's CPU at tiny sizes, with the
#                                    # current python ($PYTHON, else python), nothing installed, results in $OUT
#                                    # (default: a new temporary directory)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODE=run
case "${1:-}" in
  --dry-run) MODE=print ;;
  --cpu) MODE=cpu ;;
  "") ;;
  *) echo "usage: $0 [--dry-run | --cpu]" >&2; exit 2 ;;
esac
if [[ $MODE == cpu ]]; then
  export JAX_PLATFORMS=cpu
  PY="${PYTHON:-python}"
  OUT="${OUT:-$(mktemp -d)}"
  SETUP=()
  # tiny sizes (bench/default.py:cpu_rehearsal): a random huginn:tiny, one 8-token prompt, 2 new tokens
  BUNDLED="--config=bench/default.py:cpu_rehearsal --config.out_dir=$OUT/bench_gpu"
  HUGINN="--config=bench/default.py:cpu_rehearsal --config.dtype=bfloat16 --config.out_dir=$OUT/bench_gpu_huginn"
  CALIBRATE="--config=cost/calibrate.py:tiny --config.out_dir=$OUT/cost_calibration"
else
  VENV="${VENV:-$ROOT/.venv-gpu}"
  PY="$VENV/bin/python"
  SETUP=("python3 -m venv $VENV" "$VENV/bin/pip install --upgrade pip" "$VENV/bin/pip install .[dev] jax[cuda12]")
  BUNDLED="--config=bench/bundled.py:targets --config.out_dir=results/bench_gpu"
  HUGINN="--config=bench/default.py:huginn_0125 --config.out_dir=results/bench_gpu_huginn"
  CALIBRATE="--config=cost/calibrate.py"
fi
CMDS=(
  "${SETUP[@]}"
  "$PY -c 'import jax; print(jax.devices())'"
  "$PY -m loopspec_experiments.bench $BUNDLED"
  "$PY -m loopspec_experiments.bench $HUGINN"
  "$PY -m loopspec_experiments.cost_report $CALIBRATE"
)
for c in "${CMDS[@]}"; do
  echo "+ $c"
  if [[ $MODE != print ]]; then
    bash -c "$c"
  fi
done
