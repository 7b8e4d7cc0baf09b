"""Multi-process (multi-host) start-up: `initialize_from_env()`, bounded timeouts, fail-fast exits, rank-tagged logs.

Every process of a multi-process run executes the same program (`--worker=all` in launch/tpu_vm.sh,
`launch/local.sh --processes N` on one machine); each must call `initialize_from_env()` before touching
devices. Settings come from the arguments, else from the environment (this module defines no flags; an
experiment that wants some passes their values as arguments):
  LOOPSPEC_COORDINATOR / JAX_COORDINATOR_ADDRESS   host:port of process 0
  LOOPSPEC_NUM_PROCESSES / JAX_NUM_PROCESSES        number of processes
  LOOPSPEC_PROCESS_ID / JAX_PROCESS_ID              this process's index
  LOOPSPEC_INIT_TIMEOUT                             seconds to wait for every process to join (default 300)
  LOOPSPEC_HEARTBEAT_TIMEOUT                        seconds without a heartbeat before a process counts as
                                                    dead and every other process is stopped (default 100)
  LOOPSPEC_SHUTDOWN_TIMEOUT                         seconds the exit barrier waits for the others (default 300)
  LOOPSPEC_CPU_DEVICES                              simulated CPU devices of this process (local runs)
On a Cloud TPU VM slice with several hosts (TPU_WORKER_HOSTNAMES lists more than one) JAX discovers them
itself. A single process is a no-op. Results are written by process 0 only
(`loopspec_experiments.common.is_main_process`).

On CPU the processes talk through gloo (TCP) collectives. A process that dies makes the others fail instead of
hanging: a collective that needs it fails at once ("Connection closed by peer"), and the coordination service
stops every process after the heartbeat timeout. `exit_on_failure()` turns such an error into one clear line
on stderr and an immediate exit with `EXIT_PEER_FAILURE` (a normal exit would first wait at the shutdown
barrier for the dead process).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Optional, Sequence

from absl import logging
import jax
from jax._src import xla_bridge  # backends_are_initialized: no public equivalent
from jax.experimental import multihost_utils
import numpy as np

_initialized = False

# jax.distributed.initialize's argument -> (environment variable, default seconds: JAX's own defaults)
TIMEOUTS = {
    "initialization_timeout": ("LOOPSPEC_INIT_TIMEOUT", 300),
    "heartbeat_timeout_seconds": ("LOOPSPEC_HEARTBEAT_TIMEOUT", 100),
    "shutdown_timeout_seconds": ("LOOPSPEC_SHUTDOWN_TIMEOUT", 300),
}
EXIT_FAILURE = 3  # exit code of a multi-process run that failed in this process (`exit_on_failure`)
EXIT_PEER_FAILURE = 75  # ... because another process died or failed (EX_TEMPFAIL)
# Substrings of the runtime errors that mean another process is gone (gloo TCP, the coordination service).
PEER_FAILURE_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "gloo",
    "heartbeat",
    "coordination service",
    "barrier",
    "unavailable:",
    "deadline_exceeded",
    "socket closed",
)


def _env(*names):
  """The value of the first of these environment variables that is set and non-empty, else None."""
  for n in names:
    if os.environ.get(n):
      return os.environ[n]
  return None


def _int_setting(name: str, value, minimum: int) -> int:
  """`value` (an int or a string from the environment) as an int >= minimum, else a ValueError naming it."""
  try:
    out = int(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be an integer, got {value!r}") from None
  if out < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {out}")
  return out


def settings_from_env(
    coordinator_address: Optional[str] = None, num_processes: Optional[int] = None, process_id: Optional[int] = None
) -> dict:
  """The resolved (coordinator_address, num_processes, process_id, auto) of this process."""
  coord = coordinator_address or _env("LOOPSPEC_COORDINATOR", "JAX_COORDINATOR_ADDRESS")
  num = num_processes or _env("LOOPSPEC_NUM_PROCESSES", "JAX_NUM_PROCESSES")
  pid = process_id if process_id is not None else _env("LOOPSPEC_PROCESS_ID", "JAX_PROCESS_ID")
  hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
  return {
      "coordinator_address": coord,
      "num_processes": None if num is None else int(num),
      "process_id": None if pid is None else int(pid),
      "auto": coord is None and len(hosts) > 1,
  }


def timeouts_from_env(**given) -> dict:
  """The three timeouts of `jax.distributed.initialize` (keys of TIMEOUTS): argument, else environment, else
  JAX's default; each a whole number of seconds >= 1 (a bad value is a ValueError naming its variable)."""
  unknown = sorted(set(given) - set(TIMEOUTS))
  if unknown:
    raise TypeError(f"unknown timeout(s) {unknown}; known: {sorted(TIMEOUTS)}")
  out = {}
  for key, (var, default) in TIMEOUTS.items():
    value = given.get(key)
    name = key
    if value is None and _env(var) is not None:
      value, name = _env(var), var
    out[key] = default if value is None else _int_setting(name, value, 1)
  return out


def _check_coordinator(address: str) -> None:
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"coordinator address must be host:port, got {address!r}")


def set_cpu_devices(count) -> None:
  """Makes this process's CPU backend hold `count` (simulated) devices; must run before jax starts a backend
  (a backend that already exists with another count is an error, not a silent mismatch)."""
  count = _int_setting("LOOPSPEC_CPU_DEVICES", count, 1)
  if xla_bridge.backends_are_initialized():
    have = len(jax.local_devices(backend="cpu"))
    if have != count:
      raise RuntimeError(f"LOOPSPEC_CPU_DEVICES={count}, but jax already started with {have} CPU devices")
    return
  jax.config.update("jax_num_cpu_devices", count)


def initialize_from_env(
    coordinator_address: Optional[str] = None,
    num_processes: Optional[int] = None,
    process_id: Optional[int] = None,
    *,
    local_device_ids: Optional[Sequence[int]] = None,
    cpu_devices: Optional[int] = None,
    **timeouts,
) -> bool:
  """Calls `jax.distributed.initialize` when this is one of several processes; returns whether it did.

  Timeouts (`initialization_timeout`, `heartbeat_timeout_seconds`, `shutdown_timeout_seconds`) bound how long
  a process waits for the others to join, how long a silent process is tolerated, and the exit barrier; see
  `timeouts_from_env`. `cpu_devices` (or LOOPSPEC_CPU_DEVICES) sets this process's CPU device count first.
  Settings are validated before anything connects.
  """
  global _initialized
  if _initialized:
    return True
  s = settings_from_env(coordinator_address, num_processes, process_id)
  t = timeouts_from_env(**timeouts)
  cpu = cpu_devices if cpu_devices is not None else _env("LOOPSPEC_CPU_DEVICES")
  if cpu is not None:
    set_cpu_devices(cpu)
  if s["auto"]:  # multi-host Cloud TPU slice: JAX reads the topology from the TPU metadata
    jax.distributed.initialize(**t)
  elif s["coordinator_address"] and (s["num_processes"] or 1) > 1:
    _check_coordinator(s["coordinator_address"])
    n, pid = s["num_processes"], s["process_id"]
    if pid is None:
      raise ValueError("a multi-process run needs a process id (process_id= or LOOPSPEC_PROCESS_ID)")
    if not 0 <= pid < n:
      raise ValueError(f"process id {pid} is outside [0, {n}) for {n} processes")
    print(  # before the connect: a process that never gets through says where it waited, and how long
        f"loopspec: process {pid}/{n} joining the coordinator at {s['coordinator_address']} "
        f"(waits up to {t['initialization_timeout']} s for all {n} processes)",
        file=sys.stderr,
        flush=True,
    )
    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") is None:
      jax.config.update("jax_cpu_collectives_implementation", "gloo")  # older jax: no CPU collectives by default
    jax.distributed.initialize(
        coordinator_address=s["coordinator_address"],
        num_processes=n,
        process_id=pid,
        local_device_ids=local_device_ids,
        **t,
    )
    if jax.process_count() != n:
      raise RuntimeError(f"jax.distributed started {jax.process_count()} processes, expected {n}")
  else:
    return False  # a single process
  _initialized = True
  log_rank(
      "jax.distributed initialised: %d processes, %d devices (%d local); timeouts %s",
      jax.process_count(),
      jax.device_count(),
      jax.local_device_count(),
      t,
  )
  return True


def broadcast_json(obj):
  """Process 0's `obj` (anything `json` serialises) on every process; a collective every process must call.

  For what process 0 alone decides or reads (e.g. the rows a resumed sweep already holds, from a file only
  process 0 may see), so that every process takes the same path through the collectives that follow."""
  if jax.process_count() == 1:
    return obj
  data = np.frombuffer(json.dumps(obj, sort_keys=True).encode(), np.uint8) if jax.process_index() == 0 else None
  size = int(multihost_utils.broadcast_one_to_all(np.asarray(0 if data is None else data.size, np.int64)))
  buf = data if data is not None else np.zeros(size, np.uint8)
  out = np.asarray(multihost_utils.broadcast_one_to_all(buf), np.uint8)
  return json.loads(out.tobytes().decode())


def is_peer_failure(exc: BaseException) -> bool:
  """Whether an exception reads like another process died or failed (gloo / coordination-service errors)."""
  text = f"{type(exc).__name__}: {exc}".lower()
  return any(m in text for m in PEER_FAILURE_MARKERS)


def failure_message(exc: BaseException) -> tuple:
  """(exit code, one-line message) of a multi-process run that failed with `exc` in this process."""
  first = (str(exc).strip().splitlines() or [""])[0][:400]
  where = f"process {jax.process_index()}/{jax.process_count()}"
  if is_peer_failure(exc):
    return EXIT_PEER_FAILURE, (
        f"loopspec: {where}: another process died or failed (a collective or the coordination service lost "
        f"it): {type(exc).__name__}: {first}"
    )
  return EXIT_FAILURE, f"loopspec: {where} failed: {type(exc).__name__}: {first}"


@contextlib.contextmanager
def exit_on_failure():
  """Around the body of a multi-process program: an exception (a dead peer's failed collective, or any other)
  prints one clear line to stderr and exits this process at once with EXIT_PEER_FAILURE / EXIT_FAILURE.

  Why exit at once: after a peer died, a normal exit waits at the shutdown barrier (up to the shutdown timeout)
  and then aborts with a fatal log; the other processes learn of this one's exit through the coordination
  service. A single process (or an uninitialised run) re-raises unchanged.
  """
  try:
    yield
  except BaseException as exc:  # pylint: disable=broad-except
    if not _initialized or jax.process_count() == 1 or isinstance(exc, (SystemExit, KeyboardInterrupt)):
      raise
    code, msg = failure_message(exc)
    logging.error("%s", msg)
    sys.stdout.flush()
    print(msg, file=sys.stderr, flush=True)
    os._exit(code)  # pylint: disable=protected-access


def log_rank(msg: str, *args, level: int = logging.INFO):
  """Logs with a '[process i/n]' prefix (every process logs; results are written by process 0 only)."""
  logging.log(level, f"[process {jax.process_index()}/{jax.process_count()}] {msg}", *args)
