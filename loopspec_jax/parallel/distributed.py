"""Multi-process (multi-host TPU) start-up: `initialize_from_env()` and rank-tagged logging.

Every process of a multi-host run executes the same program (`--worker=all` in launch/tpu_vm.sh); each
must call `initialize_from_env()` before touching devices. Settings come from the arguments, else from the
environment (this module defines no flags; an experiment that wants some passes their values as arguments):
  LOOPSPEC_COORDINATOR / JAX_COORDINATOR_ADDRESS   host:port of process 0
  LOOPSPEC_NUM_PROCESSES / JAX_NUM_PROCESSES        number of processes
  LOOPSPEC_PROCESS_ID / JAX_PROCESS_ID              this process's index
On a Cloud TPU VM slice with several hosts (TPU_WORKER_HOSTNAMES lists more than one) JAX discovers them
itself. A single process is a no-op. Results are written by process 0 only
(`loopspec_jax.experiments.common.is_main_process`).
"""

from __future__ import annotations

import os
from typing import Optional

from absl import logging
import jax

_initialized = False


def _env(*names):
  """The value of the first of these environment variables that is set and non-empty, else None."""
  for n in names:
    if os.environ.get(n):
      return os.environ[n]
  return None


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


def initialize_from_env(
    coordinator_address: Optional[str] = None, num_processes: Optional[int] = None, process_id: Optional[int] = None
) -> bool:
  """Calls `jax.distributed.initialize` when this is one of several processes; returns whether it did."""
  global _initialized
  if _initialized:
    return True
  s = settings_from_env(coordinator_address, num_processes, process_id)
  if s["auto"]:  # multi-host Cloud TPU slice: JAX reads the topology from the TPU metadata
    jax.distributed.initialize()
  elif s["coordinator_address"] and (s["num_processes"] or 1) > 1:
    if s["process_id"] is None:
      raise ValueError("a multi-process run needs a process id (process_id= or LOOPSPEC_PROCESS_ID)")
    jax.distributed.initialize(
        coordinator_address=s["coordinator_address"], num_processes=s["num_processes"], process_id=s["process_id"]
    )
  else:
    return False  # a single process
  _initialized = True
  log_rank(
      "jax.distributed initialised: %d processes, %d devices (%d local)",
      jax.process_count(),
      jax.device_count(),
      jax.local_device_count(),
  )
  return True


def log_rank(msg: str, *args, level: int = logging.INFO):
  """Logs with a '[process i/n]' prefix (every process logs; results are written by process 0 only)."""
  logging.log(level, f"[process {jax.process_index()}/{jax.process_count()}] {msg}", *args)
