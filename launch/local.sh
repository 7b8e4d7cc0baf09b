#!/usr/bin/env bash
# Runs an experiment module locally from the repository root, as one process or as several:
#   launch/local.sh experiments.demo --config.model=tiny-ouro [flags...]
#   launch/local.sh --dry-run experiments.bench --config=bench/bundled.py:quick     (only prints the command)
#   launch/local.sh --processes 2 --cpu-devices 2 experiments.multihost_check      (2 processes x 2 CPU devices)
# MODULE is a module of loopspec_experiments: `experiments.X` (or just `X`) is shorthand for
# `loopspec_experiments.X`; a full dotted name is used as given.
# Uses $PYTHON if set, else the checkout's .venv python if present, else python.
#
# Multi-process mode (--processes N, N > 1; or PROCESSES=N): starts N copies of the module on this machine as
# one jax.distributed run (loopspec_jax.parallel.distributed.initialize_from_env reads the settings): process 0
# hosts the coordinator on 127.0.0.1:PORT (--port, else a free port), the processes talk through gloo (TCP)
# collectives, and each line of output is prefixed with "[pI] ". Bounded timeouts, exported unless already set:
# LOOPSPEC_INIT_TIMEOUT (120 s), LOOPSPEC_HEARTBEAT_TIMEOUT (20 s), LOOPSPEC_SHUTDOWN_TIMEOUT (60 s).
# When a process fails, the others get GRACE seconds (--grace, default heartbeat timeout + 30) to exit on
# their own, then are killed; a summary line "local.sh: process I exited with RC" follows for every process,
# and the exit code is the first failure's (0 when all succeed).
# --cpu-devices K (or CPU_DEVICES=K) gives each process K simulated CPU devices (JAX_PLATFORMS=cpu, XLA_FLAGS
# --xla_force_host_platform_device_count=K appended to any XLA_FLAGS, and LOOPSPEC_CPU_DEVICES).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

usage() {
  echo "usage: $0 [--dry-run] [--processes N] [--cpu-devices K] [--port P] [--grace S] MODULE [flags...]" >&2
  exit 2
}

DRY_RUN=0
PROCESSES="${PROCESSES:-1}"
CPU_DEVICES="${CPU_DEVICES:-}"
PORT="${PORT:-}"
GRACE="${GRACE:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --processes|--cpu-devices|--port|--grace)
      [[ $# -ge 2 ]] || usage
      case "$1" in
        --processes) PROCESSES="$2" ;;
        --cpu-devices) CPU_DEVICES="$2" ;;
        --port) PORT="$2" ;;
        --grace) GRACE="$2" ;;
      esac
      shift 2 ;;
    --processes=*) PROCESSES="${1#*=}"; shift ;;
    --cpu-devices=*) CPU_DEVICES="${1#*=}"; shift ;;
    --port=*) PORT="${1#*=}"; shift ;;
    --grace=*) GRACE="${1#*=}"; shift ;;
    --) shift; break ;;
    -*) echo "error: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
if [[ $# -lt 1 ]]; then
  usage
fi
for pair in "processes:$PROCESSES" "cpu-devices:${CPU_DEVICES:-1}" "port:${PORT:-1}" "grace:${GRACE:-1}"; do
  if ! [[ "${pair#*:}" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: --${pair%%:*} must be a positive integer, got '${pair#*:}'" >&2
    exit 2
  fi
done

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
  loopspec_*.*) ;;
  experiments.*) MODULE="loopspec_$MODULE" ;;
  *.*) ;;
  *) MODULE="loopspec_experiments.$MODULE" ;;
esac
CMD=("$PY" -P -m "$MODULE" "$@")  # -P: the installed packages only, no file of the working directory

CPU_ENV=()
if [[ -n "$CPU_DEVICES" ]]; then
  CPU_ENV=(
    JAX_PLATFORMS=cpu
    "LOOPSPEC_CPU_DEVICES=$CPU_DEVICES"
    "XLA_FLAGS=${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=$CPU_DEVICES"
  )
fi

if [[ "$PROCESSES" -eq 1 ]]; then
  echo "+ (cd $ROOT &&$(printf ' %q' ${CPU_ENV[@]+"${CPU_ENV[@]}"} "${CMD[@]}"))"
  if [[ $DRY_RUN -eq 1 ]]; then
    exit 0
  fi
  exec env ${CPU_ENV[@]+"${CPU_ENV[@]}"} "${CMD[@]}"
fi

# ---- several processes -------------------------------------------------------------------------------------
if [[ -z "$PORT" ]]; then
  if [[ $DRY_RUN -eq 1 ]]; then
    PORT=PORT
  else
    PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  fi
fi
INIT_TIMEOUT="${LOOPSPEC_INIT_TIMEOUT:-120}"
HEARTBEAT_TIMEOUT="${LOOPSPEC_HEARTBEAT_TIMEOUT:-20}"
SHUTDOWN_TIMEOUT="${LOOPSPEC_SHUTDOWN_TIMEOUT:-60}"
GRACE="${GRACE:-$((HEARTBEAT_TIMEOUT + 30))}"
COMMON_ENV=(
  "LOOPSPEC_COORDINATOR=127.0.0.1:$PORT"
  "LOOPSPEC_NUM_PROCESSES=$PROCESSES"
  "LOOPSPEC_INIT_TIMEOUT=$INIT_TIMEOUT"
  "LOOPSPEC_HEARTBEAT_TIMEOUT=$HEARTBEAT_TIMEOUT"
  "LOOPSPEC_SHUTDOWN_TIMEOUT=$SHUTDOWN_TIMEOUT"
  ${CPU_ENV[@]+"${CPU_ENV[@]}"}
)
for ((i = 0; i < PROCESSES; i++)); do
  echo "+ [p$i] (cd $ROOT &&$(printf ' %q' env "${COMMON_ENV[@]}" "LOOPSPEC_PROCESS_ID=$i" "${CMD[@]}"))"
done
if [[ $DRY_RUN -eq 1 ]]; then
  exit 0
fi

declare -A PID_OF RC_OF
declare -a ORDER
kill_all() {
  local i
  for ((i = 0; i < PROCESSES; i++)); do
    if [[ -n "${PID_OF[$i]:-}" && -z "${RC_OF[$i]:-}" ]]; then
      kill -KILL "${PID_OF[$i]}" 2>/dev/null || true
    fi
  done
}
trap 'kill_all; exit 130' INT TERM

for ((i = 0; i < PROCESSES; i++)); do
  env "${COMMON_ENV[@]}" "LOOPSPEC_PROCESS_ID=$i" "${CMD[@]}" > >(sed -u "s/^/[p$i] /") 2>&1 &
  PID_OF[$i]=$!
  echo "local.sh: process $i started (pid ${PID_OF[$i]}) on 127.0.0.1:$PORT"
done

FIRST_FAIL=""
WATCHDOG=""
remaining=$PROCESSES
while [[ $remaining -gt 0 ]]; do
  running=()
  for ((i = 0; i < PROCESSES; i++)); do
    if [[ -z "${RC_OF[$i]:-}" ]]; then
      running+=("${PID_OF[$i]}")
    fi
  done
  done_pid=""
  wait -n -p done_pid "${running[@]}" && rc=0 || rc=$?
  finished=""
  for ((i = 0; i < PROCESSES; i++)); do
    if [[ -z "${RC_OF[$i]:-}" && "${PID_OF[$i]}" == "$done_pid" ]]; then
      finished=$i
    fi
  done
  if [[ -z "$finished" ]]; then
    continue
  fi
  RC_OF[$finished]=$rc
  ORDER+=("$finished")
  remaining=$((remaining - 1))
  if [[ $rc -ne 0 && -z "$FIRST_FAIL" ]]; then
    FIRST_FAIL=$finished
    if [[ $remaining -gt 0 ]]; then
      echo "local.sh: process $finished failed with exit code $rc; waiting up to ${GRACE}s for the others" >&2
      others=()
      for ((i = 0; i < PROCESSES; i++)); do
        if [[ -z "${RC_OF[$i]:-}" ]]; then
          others+=("$i:${PID_OF[$i]}")
        fi
      done
      (
        sleep "$GRACE"
        for entry in "${others[@]}"; do
          if kill -0 "${entry#*:}" 2>/dev/null; then
            echo "local.sh: process ${entry%%:*} still running ${GRACE}s after process $finished failed: killed" >&2
            kill -KILL "${entry#*:}" 2>/dev/null || true
          fi
        done
      ) &
      WATCHDOG=$!
    fi
  fi
done
if [[ -n "$WATCHDOG" ]]; then
  kill "$WATCHDOG" 2>/dev/null || true
fi
wait 2>/dev/null || true # the output filters

status=0
for i in "${ORDER[@]}"; do
  rc=${RC_OF[$i]}
  note=""
  if [[ $rc -gt 128 ]]; then
    note=" (signal $((rc - 128)))"
  fi
  echo "local.sh: process $i exited with $rc$note"
done
if [[ -n "$FIRST_FAIL" ]]; then
  status=${RC_OF[$FIRST_FAIL]}
fi
exit "$status"
