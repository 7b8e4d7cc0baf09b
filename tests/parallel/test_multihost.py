"""Multi-process runs for real: several processes on localhost (gloo CPU collectives), one mesh spanning them.

`launch/local.sh --processes N --cpu-devices K` starts N processes of `experiments.multihost_check` as one
jax.distributed run; each decodes on a ('data', 'model') mesh over all N x K devices and checks its tokens
against a one-device decode in the same process and against every other process (a gathered digest); process 0
alone writes the result file. A process killed on purpose (`kill_process`) must make the others exit non-zero
with a recognisable message within a bounded time, never hang. The settings resolution and error messages of
`parallel.distributed` are checked in-process.

Default tests stay small (2 processes x 2 devices, a random tiny Ouro model, a few tokens; multi-process JAX
start-up and compiles dominate on 2 cores); the slow tests run the full method x sampling matrix, 4 processes,
a killed coordinator and a mid-run kill.
"""

import json
import os
import re
import subprocess
import time

import jax
import pytest

from loopspec_configs import multihost as multihost_config
from loopspec_experiments import multihost_check
from loopspec_jax.parallel import distributed

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LOCAL = os.path.join(_ROOT, "launch", "local.sh")
# Outputs are compared within one compiler setting (each process's own one-device reference, and the single-
# process run of the slow test use the same flags), so the faster-compiling codegen flags cannot hide a difference.
_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
_LAUNCH_TIMEOUT_S = 900  # a hard cap on any one launch; the tests assert much tighter bounds where it matters
# The messages a survivor of a dead process ends with: ours (`distributed.exit_on_failure`) or JAX's (the
# coordination service stopping every process after the heartbeat timeout).
_PEER_DEATH = re.compile(
    r"another process died or failed|Terminating process because the JAX distributed service detected fatal errors"
)


def _launch(tmp_path, processes: int, cpu_devices: int, *overrides: str, heartbeat_s: int = 20) -> dict:
  """Runs `launch/local.sh --processes P --cpu-devices K experiments.multihost_check` with the overrides.

  Returns {'rc', 'seconds', 'output', 'lines': {process: [lines]}, 'runs': {process: {label: run}},
  'exit': {process: exit code}, 'out_dir'}."""
  out_dir = str(tmp_path / f"out_{processes}x{cpu_devices}")
  env = dict(
      os.environ,
      XLA_FLAGS=_XLA_FLAGS,
      LOOPSPEC_HEARTBEAT_TIMEOUT=str(heartbeat_s),
      LOOPSPEC_INIT_TIMEOUT="180",
      LOOPSPEC_SHUTDOWN_TIMEOUT="60",
  )
  for k in ("LOOPSPEC_COORDINATOR", "JAX_COORDINATOR_ADDRESS", "LOOPSPEC_PROCESS_ID", "JAX_PROCESS_ID"):
    env.pop(k, None)
  cmd = ["bash", _LOCAL, "--processes", str(processes), "--cpu-devices", str(cpu_devices)]
  cmd += ["experiments.multihost_check", *overrides, f"--config.out_dir={out_dir}"]  # a --config=... comes first
  t0 = time.monotonic()
  p = subprocess.run(cmd, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=_LAUNCH_TIMEOUT_S)
  seconds = time.monotonic() - t0
  output = p.stdout + p.stderr
  lines, runs = {}, {}
  for line in output.splitlines():
    m = re.match(r"\[p(\d+)\] (.*)$", line)
    if not m:
      continue
    i, text = int(m.group(1)), m.group(2)
    lines.setdefault(i, []).append(text)
    if text.startswith(multihost_check.RUN_PREFIX):
      run = json.loads(text[len(multihost_check.RUN_PREFIX) :])
      assert run["process"] == i
      runs.setdefault(i, {})[run["label"]] = run
  exits = {int(a): int(b) for a, b in re.findall(r"^local\.sh: process (\d+) exited with (\d+)", output, re.M)}
  return dict(rc=p.returncode, seconds=seconds, output=output, lines=lines, runs=runs, exit=exits, out_dir=out_dir)


def _tail(res, n: int = 6000) -> str:
  return res["output"][-n:]


def _assert_all_agree(res, processes: int, labels) -> dict:
  """Every process ran every label, matched its one-device reference and holds the same tokens."""
  assert res["rc"] == 0, _tail(res)
  assert res["exit"] == {i: 0 for i in range(processes)}, _tail(res)
  assert sorted(res["runs"]) == list(range(processes)), _tail(res)
  first = res["runs"][0]
  assert sorted(first) == sorted(labels), sorted(first)
  for i in range(processes):
    for label in labels:
      run = res["runs"][i][label]
      assert run["reference_equal"] and run["same_on_every_process"], (i, label, run)
      assert run["tokens"] == first[label]["tokens"], (i, label)
      assert run["padded_batch"] == 4, run  # 3 requests padded to the data axis (2 or 4)
  return {label: first[label]["tokens"] for label in labels}


def _assert_only_process_0_wrote(res, processes: int, tokens: dict):
  assert sorted(os.listdir(res["out_dir"])) == [multihost_check.RESULT_FILE]
  with open(os.path.join(res["out_dir"], multihost_check.RESULT_FILE)) as f:
    written = json.load(f)
  assert written["written_by"] == 0 and written["processes"] == processes
  assert {k: v["tokens"] for k, v in written["runs"].items()} == tokens
  for i in range(1, processes):
    assert not any(t.startswith("[process") and "wrote" in t for t in res["lines"][i])


def _assert_survivors_fail_fast(res, killed: int, processes: int, bound_s: float):
  """The killed process died of SIGKILL; every other exited non-zero with a recognisable message, in time."""
  assert res["exit"].get(killed) == 137, _tail(res)
  assert sorted(res["exit"]) == list(range(processes)), _tail(res)
  for i in range(processes):
    if i == killed:
      continue
    assert res["exit"][i] != 0, _tail(res)
    assert any(_PEER_DEATH.search(t) for t in res["lines"][i]), "\n".join(res["lines"][i][-40:])
  assert "still running" not in res["output"], "local.sh had to kill a survivor: " + _tail(res)
  assert res["rc"] != 0
  assert res["seconds"] < bound_s, (res["seconds"], _tail(res))


# ---------------------------------------------------------------------------------------------------
# Default tests
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow  # ~40 s: two processes start and compile every decoder
def test_two_processes_decode_like_one_device_and_only_process_0_writes(tmp_path):
  """2 processes x 2 CPU devices, mesh (2, 2) spanning both: greedy and sampled LoopSpec, 3 requests padded to 4,
  on every process equal to a one-device decode; one result file, written by process 0."""
  res = _launch(tmp_path, 2, 2, "--config=multihost.py:quick")
  labels = ["loopspec(d1=1,d2=2)|greedy", "loopspec(d1=1,d2=2)|sample"]
  tokens = _assert_all_agree(res, 2, labels)
  assert all(len(t) == 4 for ts in tokens.values() for t in ts)
  assert tokens[labels[0]] != tokens[labels[1]]  # sampling did something
  assert "mesh 2x2 over 4 devices (2 local)" in "\n".join(res["lines"][1])
  _assert_only_process_0_wrote(res, 2, tokens)


@pytest.mark.slow  # ~45 s: two process starts, a kill and the heartbeat timeout
def test_killed_process_makes_the_other_fail_within_the_heartbeat_timeout(tmp_path):
  """Process 1 SIGKILLs itself before the first decode; process 0 must exit non-zero with a clear message
  within about the heartbeat timeout (10 s here) instead of waiting for it."""
  res = _launch(
      tmp_path,
      2,
      2,
      "--config.methods=ar",
      "--config.samplings=greedy",
      "--config.max_new_tokens=2",
      "--config.reference=false",
      "--config.kill_process=1",
      "--config.kill_after_runs=0",
      heartbeat_s=10,
  )
  _assert_survivors_fail_fast(res, killed=1, processes=2, bound_s=150)
  assert not os.path.exists(os.path.join(res["out_dir"], multihost_check.RESULT_FILE))


def test_timeouts_and_settings_are_validated_before_connecting(monkeypatch):
  for k in ("LOOPSPEC_INIT_TIMEOUT", "LOOPSPEC_HEARTBEAT_TIMEOUT", "LOOPSPEC_SHUTDOWN_TIMEOUT"):
    monkeypatch.delenv(k, raising=False)
  assert distributed.timeouts_from_env() == {
      "initialization_timeout": 300,
      "heartbeat_timeout_seconds": 100,
      "shutdown_timeout_seconds": 300,
  }
  monkeypatch.setenv("LOOPSPEC_HEARTBEAT_TIMEOUT", "7")
  t = distributed.timeouts_from_env(initialization_timeout=30)
  assert t["heartbeat_timeout_seconds"] == 7 and t["initialization_timeout"] == 30
  monkeypatch.setenv("LOOPSPEC_SHUTDOWN_TIMEOUT", "soon")
  with pytest.raises(ValueError, match="LOOPSPEC_SHUTDOWN_TIMEOUT must be an integer"):
    distributed.timeouts_from_env()
  with pytest.raises(ValueError, match="heartbeat_timeout_seconds must be >= 1"):
    distributed.timeouts_from_env(heartbeat_timeout_seconds=0, shutdown_timeout_seconds=5)
  with pytest.raises(TypeError, match="unknown timeout"):
    distributed.timeouts_from_env(heartbeat=5)
  monkeypatch.delenv("LOOPSPEC_SHUTDOWN_TIMEOUT")
  with pytest.raises(ValueError, match=r"process id 2 is outside \[0, 2\)"):
    distributed.initialize_from_env("127.0.0.1:1234", 2, 2)
  with pytest.raises(ValueError, match="host:port"):
    distributed.initialize_from_env("127.0.0.1", 2, 0)
  with pytest.raises(RuntimeError, match="already started with"):
    distributed.set_cpu_devices(len(jax.local_devices()) + 1)


def test_broadcast_json_is_the_identity_in_one_process():
  obj = {"rows": [{"key": "a", "x": 1.5}], "n": None}
  assert distributed.broadcast_json(obj) is obj


def test_failure_messages_name_a_dead_peer():
  gloo = RuntimeError("UNKNOWN: Gloo AllGather failed: [pair.cc:547] Connection closed by peer [127.0.0.1]:9614")
  assert distributed.is_peer_failure(gloo)
  code, msg = distributed.failure_message(gloo)
  assert code == distributed.EXIT_PEER_FAILURE and "another process died or failed" in msg and "Gloo" in msg
  code, msg = distributed.failure_message(ValueError("bad mesh"))
  assert code == distributed.EXIT_FAILURE and "failed: ValueError: bad mesh" in msg


def test_multihost_check_rejects_bad_settings():
  cfg = multihost_config.get_config()
  assert multihost_check.parse_mesh_shape("auto", 2, 4) == (2, 2)
  assert multihost_check.parse_mesh_shape("1x4", 2, 4) == (1, 4)
  with pytest.raises(ValueError, match="must use all 4 devices"):
    multihost_check.parse_mesh_shape("1x2", 2, 4)
  with pytest.raises(ValueError, match="'auto' or 'DxM'"):
    multihost_check.parse_mesh_shape("2by2", 2, 4)
  assert [r[0] for r in multihost_check.runs_of(cfg)][:3] == [
      "ar|greedy",
      "chain(d1=1,gamma=2)|greedy",
      "loopspec(d1=1,d2=2)|greedy",
  ]
  cfg.samplings = "greedy,hot"
  with pytest.raises(ValueError, match="unknown sampling 'hot'"):
    multihost_check.runs_of(cfg)
  cfg.samplings = "greedy"
  cfg.methods = "beam:d1=1"
  with pytest.raises(ValueError, match="unknown method 'beam'"):
    multihost_check.runs_of(cfg)
  cfg.min_prompt_len = 0
  with pytest.raises(ValueError, match="min_prompt_len"):
    multihost_check.make_prompts(cfg, 64)


# ---------------------------------------------------------------------------------------------------
# Slow tests: the full matrix, 4 processes, a killed coordinator, a kill in the middle of the runs
# ---------------------------------------------------------------------------------------------------
FULL_LABELS = [f"{m}|{s}" for s in ("greedy", "sample") for m in ("ar", "chain(d1=1,gamma=2)", "loopspec(d1=1,d2=2)")]


@pytest.mark.slow
def test_full_matrix_on_two_processes_equals_one_process(tmp_path):
  """AR, chain and LoopSpec, greedy and sampled, on 2 processes x 2 devices (mesh (2, 2)) equal the same check
  run as one process with 4 devices (mesh (1, 4), and a one-device reference in both)."""
  multi = _launch(tmp_path / "multi", 2, 2)
  tokens = _assert_all_agree(multi, 2, FULL_LABELS)
  _assert_only_process_0_wrote(multi, 2, tokens)
  single = _launch(tmp_path / "single", 1, 4)
  assert single["rc"] == 0, _tail(single)
  with open(os.path.join(single["out_dir"], multihost_check.RESULT_FILE)) as f:
    one = json.load(f)
  assert one["processes"] == 1 and one["mesh"] == [1, 4]
  assert {k: v["tokens"] for k, v in one["runs"].items()} == tokens
  greedy = [tokens[f"{m}|greedy"] for m in ("ar", "chain(d1=1,gamma=2)", "loopspec(d1=1,d2=2)")]
  assert greedy[0] == greedy[1] == greedy[2]  # lossless: every greedy method equals AR


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["4x2", "2x4"])
def test_four_processes_span_one_mesh(tmp_path, mesh):
  """4 processes x 2 devices: the data axis (4x2) or the model axis (2x4: heads and vocabulary split across
  processes) crosses process boundaries; tokens equal each process's one-device decode."""
  res = _launch(
      tmp_path,
      4,
      2,
      f"--config.mesh={mesh}",
      "--config.methods=ar;loopspec:d1=1,d2=2",
      "--config.samplings=greedy,sample",
      "--config.max_new_tokens=6",
  )
  labels = [f"{m}|{s}" for s in ("greedy", "sample") for m in ("ar", "loopspec(d1=1,d2=2)")]
  tokens = _assert_all_agree(res, 4, labels)
  _assert_only_process_0_wrote(res, 4, tokens)


@pytest.mark.slow
@pytest.mark.parametrize("killed,after", [(0, 1), (2, 1)])
def test_killed_process_mid_run_stops_every_other(tmp_path, killed, after):
  """3 processes; process `killed` (0: the coordinator) dies after one checked run: the others fail in their
  next collective or at the heartbeat timeout, each with a recognisable message, and none hangs."""
  res = _launch(
      tmp_path,
      3,
      2,
      "--config.mesh=3x2",
      "--config.methods=ar;loopspec:d1=1,d2=2",
      "--config.samplings=greedy",
      "--config.max_new_tokens=4",
      "--config.reference=false",
      f"--config.kill_process={killed}",
      f"--config.kill_after_runs={after}",
      heartbeat_s=10,
  )
  _assert_survivors_fail_fast(res, killed=killed, processes=3, bound_s=400)
  for i in range(3):
    assert "ar|greedy" in res["runs"].get(i, {}), _tail(res)  # the first run completed everywhere


@pytest.mark.slow
def test_sweep_on_two_processes_writes_each_row_once(tmp_path):
  """`loopspec-sweep` (its tiny preset) run as 2 processes appends every configuration's row once."""
  out_dir = tmp_path / "sweep"
  env = dict(os.environ, XLA_FLAGS=_XLA_FLAGS, LOOPSPEC_HEARTBEAT_TIMEOUT="20")
  cmd = [
      "bash",
      _LOCAL,
      "--processes",
      "2",
      "--cpu-devices",
      "2",
      "experiments.sweep",
      "--config=sweeps/default.py:tiny",
  ]
  cmd += [f"--config.out_dir={out_dir}", "--config.progress=false", "--config.depths_json=none"]
  p = subprocess.run(cmd, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=_LAUNCH_TIMEOUT_S)
  assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
  with open(out_dir / "sweep.jsonl") as f:
    keys = [json.loads(line)["key"] for line in f if line.strip()]
  assert len(keys) == len(set(keys)) == 3, len(keys)  # AR, LoopSpec (1, 4), chain gamma 2
