#!/usr/bin/env bash
# Runs an experiment module locally from the repository root:
#   launch/local.sh experiments.demo --config=configs/models/tiny_ouro.py [absl flags...]
#   launch/local.sh --dry-run experiments.demo ...     (only prints the command)
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

CMD=("$PY" -m "$@")
echo "+ (cd $ROOT &&$(printf ' %q' "${CMD[@]}"))"
if [[ $DRY_RUN -eq 1 ]]; then
  exit 0
fi
exec "${CMD[@]}"
