#!/usr/bin/env bash
# TPU twin of launch/bench_gpu.sh: the engine issue's benchmark on the bundled models, then the real-shape random
# Huginn-0125 (bf16), on one Cloud TPU VM through launch/tpu_vm.sh (created by the first run and kept for the
# second; delete it afterwards with `gcloud compute tpus tpu-vm delete $NAME --zone=$ZONE`).
#   launch/bench_tpu.sh              # settings as for tpu_vm.sh (NAME, ZONE, ACCELERATOR, ...)
#   launch/bench_tpu.sh --dry-run    # print the gcloud commands only
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DRY=()
[[ "${1:-}" == "--dry-run" ]] && DRY=(--dry-run)
"$HERE/tpu_vm.sh" "${DRY[@]}" --keep experiments.bench --config=bench/bundled.py:targets \
    --config.out_dir=results/bench_tpu
"$HERE/tpu_vm.sh" "${DRY[@]}" --existing experiments.bench --config=bench/default.py:huginn_0125 \
    --config.out_dir=results/bench_tpu_huginn
