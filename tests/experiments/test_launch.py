"""Launch scripts: their dry runs print the intended commands and run nothing."""

import json
import os
import subprocess
import sys

from absl import flags
import pytest

from loopspec_jax.parallel import distributed

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


V5E16 = {"NAME": "ls-test", "ZONE": "us-west4-a", "ACCELERATOR": "v5litepod-16", "KEEP": "0", "EXISTING": "0"}


def _run(script, *args, **env):
  out = subprocess.run(
      ["bash", os.path.join(_ROOT, "launch", script), *args],
      cwd=_ROOT,
      capture_output=True,
      text=True,
      timeout=60,
      env=dict(os.environ, **env),
  )
  return out


def test_local_dry_run():
  out = _run("local.sh", "--dry-run", "experiments.plan_memory", "--config.meshes=2x4")
  assert out.returncode == 0, out.stderr
  assert "-m loopspec_experiments.plan_memory --config.meshes=2x4" in out.stdout  # the shorthand expanded
  for module in ("demo", "loopspec_experiments.demo"):
    out = _run("local.sh", "--dry-run", module)
    assert out.returncode == 0 and "-m loopspec_experiments.demo" in out.stdout, out.stdout


def test_local_multiprocess_dry_run_prints_one_command_per_process():
  out = _run(
      "local.sh",
      "--dry-run",
      "--processes",
      "3",
      "--cpu-devices",
      "2",
      "--port",
      "4567",
      "multihost_check",
      "--config.x=1",
  )
  assert out.returncode == 0, out.stderr
  cmds = [l for l in out.stdout.splitlines() if l.startswith("+ [p")]
  assert [c[: len("+ [p0]")] for c in cmds] == ["+ [p0]", "+ [p1]", "+ [p2]"]
  for i, c in enumerate(cmds):
    for part in (
        "LOOPSPEC_COORDINATOR=127.0.0.1:4567",
        "LOOPSPEC_NUM_PROCESSES=3",
        f"LOOPSPEC_PROCESS_ID={i} ",
        "LOOPSPEC_CPU_DEVICES=2",
        "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS=cpu",
        "LOOPSPEC_HEARTBEAT_TIMEOUT=",  # bounded timeouts, exported to every process
        "LOOPSPEC_INIT_TIMEOUT=",
        "LOOPSPEC_SHUTDOWN_TIMEOUT=",
        "-m loopspec_experiments.multihost_check --config.x=1",
    ):
      assert part in c, (part, c)
  # the environment's timeouts and XLA flags are kept; one process with simulated devices is one command
  out = _run(
      "local.sh",
      "--dry-run",
      "--processes=2",
      "demo",
      LOOPSPEC_HEARTBEAT_TIMEOUT="9",
      XLA_FLAGS="--xla_dump_to=/tmp/x",
  )
  assert out.returncode == 0 and "LOOPSPEC_HEARTBEAT_TIMEOUT=9 " in out.stdout and "127.0.0.1:PORT" in out.stdout
  out = _run("local.sh", "--dry-run", "--cpu-devices", "4", "demo", XLA_FLAGS="--xla_dump_to=/tmp/x")
  assert out.returncode == 0 and "+ [p" not in out.stdout
  assert "--xla_dump_to=/tmp/x\\ --xla_force_host_platform_device_count=4" in out.stdout, out.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--processes", "0", "demo"], "--processes must be a positive integer"),
        (["--cpu-devices", "x", "demo"], "--cpu-devices must be a positive integer"),
        (["--port"], "usage:"),
        (["--nodes", "2", "demo"], "unknown option --nodes"),
    ],
)
def test_local_rejects_bad_options(args, message):
  out = _run("local.sh", "--dry-run", *args)
  assert out.returncode == 2 and message in out.stderr, out.stderr


def test_tpu_vm_dry_run_creates_copies_installs_runs_fetches_and_deletes():
  out = _run(
      "tpu_vm.sh",
      "--dry-run",
      "experiments.batch_bench",
      "--config.max_new_tokens=16",
      **V5E16,
  )
  assert out.returncode == 0, out.stderr
  cmds = [l for l in out.stdout.splitlines() if l.startswith("+ ")]
  g = "+ gcloud compute tpus tpu-vm"
  assert cmds[0].startswith(
      f"{g} create ls-test --zone=us-west4-a --accelerator-type=v5litepod-16 " "--version=v2-alpha-tpuv5-lite"
  )
  assert any(c.startswith("+ tar czf") for c in cmds)
  scp = [c for c in cmds if c.startswith(f"{g} scp ")]
  assert "--worker=all" in scp[0] and "ls-test:" in scp[0]
  ssh = [c for c in cmds if c.startswith(f"{g} ssh ls-test")]
  assert len(ssh) == 2 and all("--worker=all" in c for c in ssh)
  assert "pip" in ssh[0] and "install" in ssh[0]
  assert "python3\\ -P\\ -m\\ loopspec_experiments.batch_bench\\ --config.max_new_tokens=16" in ssh[1]
  assert "--recurse" in scp[-1] and "--worker=0" in scp[-1]
  assert cmds[-1] == f"{g} delete ls-test --zone=us-west4-a --quiet"


@pytest.mark.parametrize(
    "accel,zone,version",
    [("v4-8", "us-central2-b", "tpu-ubuntu2204-base"), ("v5litepod-8", "us-west4-a", "v2-alpha-tpuv5-lite")],
)
def test_tpu_vm_defaults_keep_and_existing(accel, zone, version):
  out = _run("tpu_vm.sh", "--dry-run", "--keep", "experiments.plan_memory", ACCELERATOR=accel, NAME="x")
  assert out.returncode == 0, out.stderr
  assert f"create x --zone={zone} --accelerator-type={accel} --version={version}" in out.stdout
  assert "+ gcloud compute tpus tpu-vm delete" not in out.stdout and "# keeping x" in out.stdout
  out = _run("tpu_vm.sh", "--dry-run", "--existing", "experiments.plan_memory", ACCELERATOR=accel, NAME="x")
  assert " create " not in out.stdout and "+ gcloud compute tpus tpu-vm delete" not in out.stdout


def test_tpu_vm_env_experiment_and_bad_accelerator():
  out = _run(
      "tpu_vm.sh",
      EXPERIMENT="experiments.plan_memory",
      ARGS="--config.meshes=1x8 --config.batches=1",
      DRY_RUN="1",
      NAME="y",
      PROJECT="my-proj",
  )
  assert out.returncode == 0, out.stderr
  assert "--project=my-proj" in out.stdout
  assert "loopspec_experiments.plan_memory\\ --config.meshes=1x8\\ --config.batches=1" in out.stdout
  bad = _run("tpu_vm.sh", "--dry-run", "experiments.plan_memory", ACCELERATOR="v3-8")
  assert bad.returncode == 2 and "unsupported ACCELERATOR" in bad.stderr
  usage = _run("tpu_vm.sh", "--dry-run", EXPERIMENT="")
  assert usage.returncode == 2


def test_bench_gpu_dry_run_uses_the_package_module():
  out = _run("bench_gpu.sh", "--dry-run")
  assert out.returncode == 0, out.stderr
  assert "-m loopspec_experiments.bench --config=bench/bundled.py:targets" in out.stdout
  assert "--config=bench/default.py:huginn_0125" in out.stdout
  assert "-m loopspec_experiments.cost_report --config=cost/calibrate.py" in out.stdout  # the device's check


@pytest.mark.slow  # ~40 s: four processes, each compiling; --dry-run is checked by the default suite
def test_bench_gpu_cpu_rehearsal_runs_every_step_at_tiny_sizes(tmp_path):
  """`--cpu`: the accelerator script's own steps on this CPU (no install), so it works the day a GPU is lent."""
  out = subprocess.run(
      ["bash", os.path.join(_ROOT, "launch", "bench_gpu.sh"), "--cpu"],
      cwd=_ROOT,
      capture_output=True,
      text=True,
      timeout=900,
      env=dict(os.environ, OUT=str(tmp_path), PYTHON=f"{sys.executable} -P"),
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert out.stdout.count("+ ") == 4 and "pip install" not in out.stdout
  rows = json.load(open(tmp_path / "cost_calibration" / "calibration.json"))["rows"]
  assert rows and all("predicted_ms" in r and "measured_ms" in r for r in rows)
  assert os.listdir(tmp_path / "bench_gpu") and os.listdir(tmp_path / "bench_gpu_huginn")


def test_distributed_settings_and_single_process_noop(monkeypatch):
  for k in (
      "LOOPSPEC_COORDINATOR",
      "JAX_COORDINATOR_ADDRESS",
      "LOOPSPEC_NUM_PROCESSES",
      "JAX_NUM_PROCESSES",
      "LOOPSPEC_PROCESS_ID",
      "JAX_PROCESS_ID",
      "TPU_WORKER_HOSTNAMES",
  ):
    monkeypatch.delenv(k, raising=False)
  assert distributed.initialize_from_env() is False  # one process: nothing to initialise
  monkeypatch.setenv("LOOPSPEC_COORDINATOR", "10.0.0.2:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("LOOPSPEC_PROCESS_ID", "3")
  s = distributed.settings_from_env()
  assert s == {"coordinator_address": "10.0.0.2:1234", "num_processes": 4, "process_id": 3, "auto": False}
  assert distributed.settings_from_env(process_id=0)["process_id"] == 0
  monkeypatch.delenv("LOOPSPEC_COORDINATOR")
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w0,w1,w2,w3")
  assert distributed.settings_from_env()["auto"] is True


def test_distributed_defines_no_flags():
  assert not [name for name in flags.FLAGS if name.startswith("dist_")]
  assert not flags.FLAGS.flags_by_module_dict().get(distributed.__name__)


def test_bench_tpu_dry_run_runs_both_benchmarks():
  out = _run("bench_tpu.sh", "--dry-run")
  assert out.returncode == 0, out.stderr
  assert "bench/bundled.py:targets" in out.stdout and "bench/default.py:huginn_0125" in out.stdout
  assert "experiments.cost_report\\ --config=cost/calibrate.py" in out.stdout
