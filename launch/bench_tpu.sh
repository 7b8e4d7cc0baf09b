#!/usr/bin/env bash
# TPU twin of launch/bench_gpu.sh: the engine issue's benchmark on the bundled models, then the real-shape random
# Huginn-0125 (bf16), then the cost-model calibration on the chip, on one Cloud TPU VM through launch/tpu_vm.sh
# (created by the first run and kept for the others; delete it afterwards with
# `gcloud compute tpus tpu-vm delete $NAME --zone=$ZONE`).
#   launch/bench_tpu.sh              # settings as for tpu_vm.sh (NAME, ZONE, ACCELERATOR, ...)
#   launch/bench_tpu.sh --dry-run    # print the gcloud commands only
#   launch/bench_tpu.sh --cpu        # rehearsal: the same experiment steps through launch/local.sh on this CPU at
#                                    # tiny sizes (results in $OUT, default a new temporary directory)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODE=run
case "${1:-}" in
  --dry-run) MODE=print ;;
  --cpu) MODE=cpu ;;
  "") ;;
  *) echo "usage: $0 [--dry-run | --cpu]" >&2; exit 2 ;;
esac
if [[ $MODE == cpu ]]; then
  export JAX_PLATFORMS=cpu
  OUT="${OUT:-$(mktemp -d)}"
  STEP1=(experiments.bench --config=bench/default.py:cpu_rehearsal --config.out_dir="$OUT/bench_tpu")
  STEP2=(experiments.bench --config=bench/default.py:cpu_rehearsal --config.dtype=bfloat16 --config.out_dir="$OUT/bench_tpu_huginn")
  STEP3=(experiments.cost_report --config=cost/calibrate.py:tiny --config.out_dir="$OUT/cost_calibration")
  for step in STEP1 STEP2 STEP3; do
    declare -n args="$step"
    echo "+ launch/local.sh ${args[*]}"
    "$HERE/local.sh" "${args[@]}"
  done
  exit 0
fi
DRY=()
[[ $MODE == print ]] && DRY=(--dry-run)
"$HERE/tpu_vm.sh" "${DRY[@]}" --keep experiments.bench --config=bench/bundled.py:targets \
    --config.out_dir=results/bench_tpu
"$HERE/tpu_vm.sh" "${DRY[@]}" --existing --keep experiments.bench --config=bench/default.py:huginn_0125 \
    --config.out_dir=results/bench_tpu_huginn
"$HERE/tpu_vm.sh" "${DRY[@]}" --existing experiments.cost_report --config=cost/calibrate.py
