"""Multi-process check: `generate` on one mesh spanning every process equals a one-device run, on every process.

Run it as N processes (`launch/local.sh --processes 2 --cpu-devices 2 experiments.multihost_check` on one
machine: gloo collectives over localhost), or as a single process (a no-op distributed start, the same
checks on the local devices). Every process

- starts `jax.distributed` from the environment (`parallel.distributed.initialize_from_env`, bounded timeouts),
- checks that it runs process 0's settings and takes process 0's prompts (`distributed.broadcast_json`),
- places the parameters on a ('data', 'model') mesh over all devices of all processes (`mesh`: 'auto' =
  processes x local devices, or 'DxM') and decodes every method x sampling setting with
  `loopspec_jax.generate(..., mesh=mesh)` (the batch is padded to the data axis; the outputs are gathered to
  every process by `parallel.sharding.to_host`),
- decodes the same requests without a mesh on its first local device (`reference`: what one process computes)
  and requires the tokens to be equal,
- requires every process to hold the same tokens (a digest gathered across processes),
- prints one `MULTIHOST_RESULT {json}` line; process 0 alone writes <out_dir>/multihost.json.

Fault injection (what the tests use to check that a dead process never leaves the others hanging):
`kill_process=k` makes process k SIGKILL itself once `kill_after_runs` runs are done (0: before the first);
the others go on to their next collective, which fails, and exit with `distributed.EXIT_PEER_FAILURE` and a
one-line message (or are stopped by the coordination service after the heartbeat timeout).

  launch/local.sh --processes 2 --cpu-devices 2 experiments.multihost_check --config.max_new_tokens=8
Settings: configs/multihost.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import zlib

from absl import flags
import jax
from jax.experimental import multihost_utils
from ml_collections import config_flags
import numpy as np

import loopspec_jax
from loopspec_jax import methods as methods_lib
from loopspec_experiments import common
from loopspec_jax.parallel import distributed
from loopspec_jax.parallel import sharding

RUN_PREFIX = "MULTIHOST_RUN "  # one line per checked run, on every process
RESULT_PREFIX = "MULTIHOST_RESULT "  # one line per process at the end
RESULT_FILE = "multihost.json"


FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", common.config_path("multihost.py"), "Multi-process check settings.", flag_values=FLAGS
)


def parse_mesh_shape(text: str, num_processes: int, device_count: int) -> tuple:
  """(data, model) from 'auto' (processes x devices per process) or 'DxM'; must use every device."""
  if text == "auto":
    shape = (num_processes, device_count // num_processes)
  else:
    parts = str(text).lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
      raise ValueError(f"mesh must be 'auto' or 'DxM' (e.g. 2x2), got {text!r}")
    shape = (int(parts[0]), int(parts[1]))
  if shape[0] * shape[1] != device_count:
    raise ValueError(f"mesh {shape[0]}x{shape[1]} must use all {device_count} devices of the {num_processes} processes")
  return shape


def make_prompts(cfg, vocab_size: int) -> list:
  """`num_prompts` token-id lists of lengths in [min_prompt_len, max_prompt_len], the same on every process."""
  if not 1 <= cfg.min_prompt_len <= cfg.max_prompt_len:
    raise ValueError(f"need 1 <= min_prompt_len <= max_prompt_len, got {cfg.min_prompt_len}, {cfg.max_prompt_len}")
  if cfg.num_prompts < 1:
    raise ValueError(f"num_prompts must be >= 1, got {cfg.num_prompts}")
  rng = np.random.default_rng(cfg.seed)
  lengths = rng.integers(cfg.min_prompt_len, cfg.max_prompt_len + 1, size=cfg.num_prompts)
  return [[int(t) for t in rng.integers(1, vocab_size, size=int(n))] for n in lengths]


def runs_of(cfg) -> list:
  """[(label, Method, sampling kwargs)] of every method x sampling setting, validated."""
  out = []
  methods = methods_lib.parse_list(str(cfg.methods))
  samplings = common.split_list(cfg.samplings)
  if not methods or not samplings:
    raise ValueError("methods and samplings must each name at least one entry")
  for samp in samplings:
    if samp not in cfg.sampling_settings:
      raise ValueError(f"unknown sampling {samp!r}; known: {sorted(cfg.sampling_settings)}")
    for method in methods:
      out.append((f"{method.label}|{samp}", method, dict(cfg.sampling_settings[samp])))
  return out


def digest(tokens) -> int:
  """A checksum of a list of token lists (compared across processes)."""
  return zlib.crc32(json.dumps(tokens).encode())


def same_on_every_process(value: int) -> list:
  """The `value` of every process (a collective: each process must call it), in process order."""
  if jax.process_count() == 1:
    return [int(value)]
  return [int(v) for v in np.asarray(multihost_utils.process_allgather(np.asarray([value], np.int64))).reshape(-1)]


def _say(msg: str) -> None:
  print(f"[process {jax.process_index()}/{jax.process_count()}] {msg}", flush=True)


def check(cfg) -> dict:
  """Runs every (method, sampling) on the spanning mesh and checks it; returns this process's report."""
  procs, devices = jax.process_count(), jax.device_count()
  shape = parse_mesh_shape(cfg.mesh, procs, devices)
  runs = runs_of(cfg)
  if cfg.kill_process is not None and not 0 <= cfg.kill_process < procs:
    raise ValueError(f"kill_process {cfg.kill_process} is not a process of {procs}")
  if cfg.kill_process is not None and not 0 <= cfg.kill_after_runs <= len(runs):
    raise ValueError(f"kill_after_runs must be in [0, {len(runs)}], got {cfg.kill_after_runs}")
  settings = distributed.broadcast_json(cfg.to_dict())  # every process must run the same settings
  if settings != json.loads(json.dumps(cfg.to_dict(), sort_keys=True)):
    raise ValueError(f"process {jax.process_index()} runs other settings than process 0: {cfg.to_dict()} != {settings}")
  local = common.resolve_model(cfg.model, contraction=cfg.contraction, seed=cfg.seed)
  prompts = distributed.broadcast_json(make_prompts(cfg, local.config.vocab_size))  # process 0's prompts
  mesh = sharding.make_mesh(shape)
  spans = sorted({d.process_index for d in mesh.devices.flat})
  if spans != list(range(procs)):
    raise RuntimeError(f"mesh {shape} spans processes {spans}, not all {procs}")
  # as `load(..., mesh=)` places a model: heads laid out for the mesh, the config following the parameters
  model = sharding.shard_model(local, mesh)
  _say(f"mesh {shape[0]}x{shape[1]} over {devices} devices ({jax.local_device_count()} local), {len(runs)} runs")
  report = {
      "process": jax.process_index(),
      "processes": procs,
      "devices": devices,
      "local_devices": jax.local_device_count(),
      "mesh": list(shape),
      "model": cfg.model,
      "prompts": prompts,
      "runs": {},
  }
  for i, (label, method, samp) in enumerate(runs):
    _maybe_kill(cfg, i)
    args = dict(max_new_tokens=cfg.max_new_tokens, method=method, seed=cfg.seed, **samp)
    t0 = time.perf_counter()
    out = loopspec_jax.generate(model, prompts, mesh=mesh, **args)
    seconds = time.perf_counter() - t0
    entry = {"tokens": out.tokens, "seconds": round(seconds, 3), "padded_batch": out.stats.get("padded_batch")}
    if cfg.reference:
      ref = loopspec_jax.generate(local, prompts, **args)
      entry["reference_equal"] = ref.tokens == out.tokens
      if not entry["reference_equal"]:
        raise AssertionError(f"{label}: mesh tokens {out.tokens} != one-device tokens {ref.tokens}")
    digests = same_on_every_process(digest(out.tokens))
    entry["same_on_every_process"] = len(set(digests)) == 1
    if not entry["same_on_every_process"]:
      raise AssertionError(f"{label}: processes hold different tokens (digests {digests})")
    report["runs"][label] = entry
    _say(f"{label}: {seconds:.1f} s, equal to one device: {entry.get('reference_equal')}, same on all processes")
    print(RUN_PREFIX + json.dumps(dict(entry, label=label, process=jax.process_index())), flush=True)
  _maybe_kill(cfg, len(runs))
  if cfg.kill_process is not None:  # the survivors reach one more collective, which must fail
    same_on_every_process(0)
  return report


def _maybe_kill(cfg, runs_done: int) -> None:
  """Fault injection: SIGKILL this process if it is `kill_process` and `kill_after_runs` runs are done."""
  if cfg.kill_process == jax.process_index() and runs_done == cfg.kill_after_runs:
    _say(f"fault injection: SIGKILL to myself after {runs_done} runs")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv):
  del argv
  cfg = _CONFIG.value
  distributed.initialize_from_env()
  with distributed.exit_on_failure():
    report = check(cfg)
    print(RESULT_PREFIX + json.dumps(report), flush=True)
    if common.is_main_process():
      os.makedirs(cfg.out_dir, exist_ok=True)
      common.atomic_write_json(os.path.join(cfg.out_dir, RESULT_FILE), dict(report, written_by=jax.process_index()))
      _say(f"wrote {os.path.join(cfg.out_dir, RESULT_FILE)}")


def run():
  common.run(main, FLAGS)


if __name__ == "__main__":
  run()
