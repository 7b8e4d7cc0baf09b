#!/bin/bash
# Interleaved before/after tick timing on tiny-raven: round 1 before then after, round 2 after then before.
# BEFORE: a plain export of main's loopspec_jax (git archive 1bab645 loopspec_jax | tar -x -C $BEFORE).
# Usage: scripts/results/lanes/tick_compare.sh OUT_DIR CONFIG...
set -u
out=$1; shift
BEFORE=${BEFORE:-/tmp/lanes_before}
run() { side=$1; shift; if [ "$side" = before ]; then PYTHONPATH=$BEFORE timeout 1500 python -u -P scripts/results/lanes/tick_time.py "$out/$side.jsonl" "$@"; else timeout 1500 python -u -P scripts/results/lanes/tick_time.py "$out/$side.jsonl" "$@"; fi; }
run before "$@"; run after "$@"; run after "$@"; run before "$@"
