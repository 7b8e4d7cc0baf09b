#!/usr/bin/env bash
# Runs an experiment module on a Cloud TPU VM (all workers of a multi-host slice), then fetches the results:
#   create the VM (unless EXISTING=1) -> copy the project -> install it -> run on --worker=all -> fetch -> delete
#
#   launch/tpu_vm.sh [--dry-run] [--keep] [--existing] MODULE [flags...]
#   NAME=ls-v5e16 ZONE=us-west4-a ACCELERATOR=v5litepod-16 launch/tpu_vm.sh \
#       experiments.batch_bench --config.mesh=v5e_16
#   launch/tpu_vm.sh --dry-run experiments.plan_memory --config.meshes=2x4   (only prints the gcloud commands)
# MODULE: `experiments.X` (or `X`) is shorthand for `loopspec_experiments.X`; a full dotted name is kept.
#
# Settings (environment, or the flags above):
#   NAME          TPU VM name (default loopspec-$USER)
#   ZONE          zone (default us-central2-b for v4, us-west4-a for v5e)
#   ACCELERATOR   v4-8 | v5litepod-8 | v5litepod-16 (default v4-8)
#   VERSION       TPU runtime (default per accelerator: tpu-ubuntu2204-base / v2-alpha-tpuv5-lite)
#   PROJECT       gcloud project (default: gcloud's configured one)
#   EXPERIMENT    module to run if not given as the first argument; ARGS: its flags if none are given
#   RESULTS       results folder on the VM, fetched from worker 0 (default results)
#   KEEP=1        do not delete the VM at the end;  EXISTING=1  use an existing VM (never deleted)
#   DRY_RUN=1     print the commands instead of running them
# Multi-host slices (v5litepod-16: 4 hosts) run one process per host; the experiment calls
# loopspec_jax.parallel.distributed.initialize_from_env(), which lets JAX discover the slice; only process 0 writes.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

DRY_RUN="${DRY_RUN:-0}"
KEEP="${KEEP:-0}"
EXISTING="${EXISTING:-0}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --keep) KEEP=1; shift ;;
    --existing) EXISTING=1; shift ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) break ;;
  esac
done
if [[ $# -ge 1 ]]; then
  EXPERIMENT="$1"
  shift
  EXP_ARGS=("$@")
else
  EXPERIMENT="${EXPERIMENT:-}"
  read -r -a EXP_ARGS <<< "${ARGS:-}"
fi
if [[ -z "$EXPERIMENT" ]]; then
  echo "usage: $0 [--dry-run] [--keep] [--existing] MODULE [flags...]   (or EXPERIMENT=... ARGS=...)" >&2
  exit 2
fi

case "$EXPERIMENT" in
  loopspec_*.*) ;;
  experiments.*) EXPERIMENT="loopspec_$EXPERIMENT" ;;
  *.*) ;;
  *) EXPERIMENT="loopspec_experiments.$EXPERIMENT" ;;
esac

ACCELERATOR="${ACCELERATOR:-v4-8}"
case "$ACCELERATOR" in
  v4-*) DEFAULT_ZONE=us-central2-b; DEFAULT_VERSION=tpu-ubuntu2204-base ;;
  v5litepod-*) DEFAULT_ZONE=us-west4-a; DEFAULT_VERSION=v2-alpha-tpuv5-lite ;;
  *) echo "unsupported ACCELERATOR=$ACCELERATOR (v4-8, v5litepod-8, v5litepod-16)" >&2; exit 2 ;;
esac
NAME="${NAME:-loopspec-${USER:-user}}"
ZONE="${ZONE:-$DEFAULT_ZONE}"
VERSION="${VERSION:-$DEFAULT_VERSION}"
RESULTS="${RESULTS:-results}"
REMOTE_DIR=loopspec_jax
TARBALL="/tmp/${NAME}-project.tar.gz"
LOCAL_RESULTS="$ROOT/results/tpu/$NAME"

GCLOUD=(gcloud compute tpus tpu-vm)
COMMON=(--zone="$ZONE")
if [[ -n "${PROJECT:-}" ]]; then
  COMMON+=(--project="$PROJECT")
fi

run() {  # prints a command, runs it unless --dry-run
  echo "+$(printf ' %q' "$@")"
  if [[ "$DRY_RUN" != 1 ]]; then
    "$@"
  fi
}

REMOTE_CMD="cd ~/$REMOTE_DIR && python3 -P -m$(printf ' %q' "$EXPERIMENT" "${EXP_ARGS[@]}")"
INSTALL_CMD="mkdir -p ~/$REMOTE_DIR && tar xzf ~/$(basename "$TARBALL") -C ~/$REMOTE_DIR && cd ~/$REMOTE_DIR && \
python3 -m pip install -q -U 'jax[tpu]' -f https://storage.googleapis.com/jax-releases/libtpu_releases.html && \
python3 -m pip install -q -e ."

cleanup() {
  if [[ "$KEEP" != 1 && "$EXISTING" != 1 ]]; then
    run "${GCLOUD[@]}" delete "$NAME" "${COMMON[@]}" --quiet
  else
    echo "# keeping $NAME (delete with: ${GCLOUD[*]} delete $NAME ${COMMON[*]} --quiet)"
  fi
}

if [[ "$EXISTING" != 1 ]]; then
  run "${GCLOUD[@]}" create "$NAME" "${COMMON[@]}" --accelerator-type="$ACCELERATOR" --version="$VERSION"
fi
if [[ "$DRY_RUN" != 1 ]]; then
  trap cleanup EXIT
fi
run tar czf "$TARBALL" -C "$ROOT" --exclude=.venv --exclude=.git --exclude=results --exclude=__pycache__ .
run "${GCLOUD[@]}" scp "$TARBALL" "$NAME:~/" "${COMMON[@]}" --worker=all
run "${GCLOUD[@]}" ssh "$NAME" "${COMMON[@]}" --worker=all --command="$INSTALL_CMD"
run "${GCLOUD[@]}" ssh "$NAME" "${COMMON[@]}" --worker=all --command="$REMOTE_CMD"
run mkdir -p "$LOCAL_RESULTS"
run "${GCLOUD[@]}" scp --recurse "$NAME:~/$REMOTE_DIR/$RESULTS" "$LOCAL_RESULTS" "${COMMON[@]}" --worker=0
if [[ "$DRY_RUN" == 1 ]]; then
  cleanup
fi
