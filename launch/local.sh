#!/usr/bin/env bash
# Runs an experiment module locally from the repository root:
#   launch/local.sh experiments.demo --config.model=tiny-ouro [flags...]
#   launch/local.sh --dry-run experiments.bench --config=bench/bundled.py:quick     (only prints the command)
# MODULE is a module of loopspec_jax.experiments: `experiments.X` (or just `X`) is shorthand for
# `loopspec_jax.experiments.X`; a full dotted name is used as given.
# Uses $PYTHON if set, else the checkout's .venv python if present, else python.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then
  DRY_RUN=1
  shift
fi
if [[ $# -lt 1 ]]; then
  echo "usage: $0 [--dry-run] MODULE [flags...]" >&2
  exit 2
fi

if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PY="$ROOT/.venv/bin/python"
else
  PY=python
fi

MODULE="$1"
shift
case "$MODULE" in
  loopspec_jax.*) ;;
  experiments.*) MODULE="loopspec_jax.$MODULE" ;;
  *.*) ;;
  *) MODULE="loopspec_jax.experiments.$MODULE" ;;
esac
CMD=("$PY" -m "$MODULE" "$@")
echo "+ (cd $ROOT &&$(printf ' %q' "${CMD[@]}"))"
if [[ $DRY_RUN -eq 1 ]]; then
  exit 0
fi
exec "${CMD[@]}"
