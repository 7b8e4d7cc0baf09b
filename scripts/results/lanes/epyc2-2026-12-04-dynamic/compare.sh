#!/bin/bash
# Interleaved before/after timing on tiny-raven: before, after, after, before (one process each: compile once,
# then REPEATS timed decodes). BEFORE: a plain export of main's loopspec_jax (git archive 0d018fd loopspec_jax).
# Usage: compare.sh OUT_DIR REPEATS CONFIG...
set -u
out=$1; rep=$2; shift 2
here=$(dirname "$0")
BEFORE=${BEFORE:-/tmp/lw_before}
AFTER=${AFTER:-}  # optional: a frozen copy of this checkout's loopspec_jax (else the working tree)
run() { side=$1; shift; if [ "$side" = before ]; then PYTHONPATH=$BEFORE timeout 1800 python -u -P $here/measure.py "$out/$side.jsonl" $rep "$@"; else PYTHONPATH=$AFTER timeout 1800 python -u -P $here/measure.py "$out/$side.jsonl" $rep "$@"; fi; }
run before "$@"; run after "$@"; run after "$@"; run before "$@"
