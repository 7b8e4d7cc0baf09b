"""A soak run of loopspec-serve: minutes of mixed load with faults against a server process on 127.0.0.1.

`soak(minutes, server_args)` starts `python -m loopspec_experiments.serve` (the real entry point, as its own
process) on a free local port, waits for /ready, then runs until the deadline:

  load     non-streamed and streamed completions (greedy and sampled, some with stop strings), chat completions,
           streams dropped after their first chunk, non-streamed requests abandoned by a 0.3 s client timeout
  faults   malformed JSON, a 5,000-digit integer, a lone-surrogate key, text/plain bodies, 1 MiB prompts, an
           unknown chat role, echo scoring, /tokenize of a long text, clients vanishing halfway through their
           body, slow clients holding a half-sent body for seconds, and the tokenizer's child process killed
           (kill -9 of the server's child processes)
  probes   /health every 0.2 s (latency), /metrics every second (engine_up)

then holds a half-sent body open and sends SIGTERM: the server must exit within its shutdown timeout (status 0,
or -15: uvicorn re-raises SIGTERM after its graceful shutdown). Every
request's outcome is counted by kind and status; a 5xx, an unexpected exception or a request that outlives its
deadline is a failure. Only 127.0.0.1 is contacted. The summary (a dict) is what `loopspec-serve-bench
--soak_minutes=N` prints and writes.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np

PROMPTS = ("ROMEO:\n", "JULIET:\n", "def fib(n):\n", "First Citizen:\n")
DEADLINE_S = 60.0  # no single request may take longer (the run's hang detector)
EXPECTED = {  # fault kind: the statuses it may get
    "malformed": {400},
    "huge_int": {400},
    "surrogate_key": {400},
    "text_plain": {415},
    "oversized": {400},
    "wizard_role": {400},
    "score": {200},
    "tokenize": {200},
}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _rss_mib(pid: int) -> float:
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  return float("nan")


def _children(pid: int) -> list:
  """Process ids whose parent is `pid` (the server's tokenizer processes)."""
  out = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry))
      except (OSError, ValueError, IndexError):
        pass
  return out


def _half_body(port: int) -> socket.socket:
  sock = socket.create_connection(("127.0.0.1", port), timeout=10)
  head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
  sock.sendall(head.encode() + b'{"model": "tiny-raven", ')
  return sock


class _Log:
  """Outcomes by kind: status counts, latencies, failures (thread-safe)."""

  def __init__(self):
    self.lock = threading.Lock()
    self.status = collections.defaultdict(collections.Counter)
    self.latency = collections.defaultdict(list)
    self.failures: list = []

  def add(self, kind: str, status, seconds: float, ok: bool = True, why: str = "") -> None:
    with self.lock:
      self.status[kind][str(status)] += 1
      self.latency[kind].append(seconds)
      if not ok or seconds > DEADLINE_S:
        self.failures.append(f"{kind}: {status} after {seconds:.2f} s {why}"[:300])


class Soak:
  """One soak run against a server process (see the module docstring)."""

  def __init__(self, minutes: float, server_args=(), model: str = "tiny-raven", seed: int = 0):
    self.minutes, self.server_args, self.model = float(minutes), list(server_args), model
    self.port = _free_port()
    self.base = f"http://127.0.0.1:{self.port}"
    self.log, self.rng = _Log(), random.Random(seed)
    self.stop = threading.Event()
    self.proc = None

  # ----- the server process ---------------------------------------------------------------------------
  def start_server(self, timeout: float = 1800.0) -> float:
    import requests

    cmd = [sys.executable, "-m", "loopspec_experiments.serve", f"--config.port={self.port}"]
    cmd += ["--config.host=127.0.0.1", "--config.access_log=false"] + self.server_args
    self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() < t0 + timeout:
      if self.proc.poll() is not None:
        raise RuntimeError(f"the server exited {self.proc.returncode}: {self.proc.stderr.read()[-2000:]}")
      try:
        if requests.get(self.base + "/ready", timeout=2).status_code == 200:
          return time.time() - t0
      except requests.RequestException:
        pass
      time.sleep(0.5)
    raise RuntimeError("the server did not become ready")

  # ----- workers ----------------------------------------------------------------------------------------
  def _timed(self, kind: str, fn, expected=(200,)) -> None:
    import requests

    t0 = time.perf_counter()
    try:
      status = fn()
    except requests.Timeout:
      status = "timeout"
    except requests.RequestException as e:
      self.log.add(kind, type(e).__name__, time.perf_counter() - t0, False, str(e))
      return
    self.log.add(kind, status, time.perf_counter() - t0, status in expected, "")

  def _post(self, path: str, body, timeout=DEADLINE_S, **kw):
    import requests

    return requests.post(self.base + path, json=body, timeout=timeout, **kw)

  def load_worker(self, wid: int) -> None:
    rng = random.Random(wid)
    while not self.stop.is_set():
      prompt, n = rng.choice(PROMPTS), rng.randint(1, 48)
      body = {"model": self.model, "prompt": prompt, "max_tokens": n, "temperature": rng.choice([0, 1.0])}
      body["seed"] = rng.randint(0, 1000)
      if rng.random() < 0.3:
        body["stop"] = [rng.choice(["\n", "e", "th", "O"])]
      kind = rng.choice(["plain", "plain", "stream", "stream", "chat", "drop", "abandon"])
      if kind == "plain":
        self._timed(kind, lambda: self._post("/v1/completions", body).status_code)
      elif kind in ("stream", "drop"):
        ok = ("dropped", 200) if kind == "drop" else (200,)  # a 1-token stream may end before its first read
        self._timed(kind, lambda: self._stream(dict(body, stream=True), drop=kind == "drop"), ok)
      elif kind == "chat":
        chat = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": n}
        self._timed(kind, lambda: self._post("/v1/chat/completions", chat).status_code)
      else:
        abandon = lambda: self._post("/v1/completions", dict(body, max_tokens=48), timeout=0.3).status_code
        self._timed(kind, abandon, ("timeout", 200))

  def _stream(self, body, drop: bool):
    with self._post("/v1/completions", body, stream=True) as r:
      if r.status_code != 200:
        return r.status_code
      for line in r.iter_lines():
        if drop and line.startswith(b"data: "):
          return "dropped"
        if line.startswith(b"data: ") and b'"error"' in line:
          return "error_event"
        if line == b"data: [DONE]":
          return 200
    return "no_done"

  def fault_worker(self) -> None:
    big = ("lorem ipsum " * (1 << 17))[: (1 << 20) - 100]
    faults = {
        "malformed": lambda: self._raw(b"{not json"),
        "huge_int": lambda: self._raw(b'{"model": "tiny-raven", "prompt": "a", "seed": ' + b"9" * 5000 + b"}"),
        "surrogate_key": lambda: self._raw(b'{"model": "tiny-raven", "prompt": "a", "\\ud800": 1}'),
        "text_plain": lambda: self._raw(b"{}", "text/plain"),
        "oversized": lambda: self._post("/v1/completions", {"model": self.model, "prompt": big}).status_code,
        "wizard_role": lambda: self._post(
            "/v1/chat/completions", {"model": self.model, "messages": [{"role": "wizard", "content": "hi"}]}
        ).status_code,
        "score": lambda: self._post(
            "/v1/completions",
            {"model": self.model, "prompt": "ROMEO:\n" * 4, "max_tokens": 0, "echo": True, "logprobs": 1},
        ).status_code,
        "tokenize": lambda: self._post("/tokenize", {"model": self.model, "prompt": big[:100_000]}).status_code,
    }
    kinds = list(faults) + ["vanish", "slow_client", "kill_tokenizer"]
    while not self.stop.is_set():
      kind = self.rng.choice(kinds)
      if kind in faults:
        self._timed(kind, faults[kind], EXPECTED[kind])
      elif kind == "vanish":
        t0 = time.perf_counter()
        _half_body(self.port).close()
        self.log.add(kind, "closed", time.perf_counter() - t0)
      elif kind == "slow_client":
        threading.Thread(target=self._slow_client, daemon=True).start()
      else:
        pids = _children(self.proc.pid)
        for pid in pids:
          try:
            os.kill(pid, signal.SIGKILL)
          except OSError:
            pass
        self.log.add(kind, f"killed_{len(pids)}", 0.0)
      self.stop.wait(0.2)

  def _slow_client(self) -> None:
    t0 = time.perf_counter()
    sock = _half_body(self.port)
    self.stop.wait(5.0)
    sock.close()
    self.log.add("slow_client", "held_5s", time.perf_counter() - t0)

  def _raw(self, data: bytes, kind: str = "application/json"):
    import requests

    r = requests.post(self.base + "/v1/completions", data=data, headers={"Content-Type": kind}, timeout=DEADLINE_S)
    return r.status_code

  def probe_worker(self, health: list, metrics: list) -> None:
    import requests

    session, last = requests.Session(), 0.0
    while not self.stop.is_set():
      t0 = time.perf_counter()
      r = session.get(self.base + "/health", timeout=DEADLINE_S)
      health.append(time.perf_counter() - t0)
      if r.status_code != 200:
        self.log.failures.append(f"/health {r.status_code}: {r.text[:200]}")
      if t0 - last > 1.0:
        last = t0
        text = session.get(self.base + "/metrics", timeout=DEADLINE_S).text
        metrics.append(text)
        if "loopspec_engine_up 1" not in text:
          self.log.failures.append("/metrics: engine_up is not 1")
      self.stop.wait(0.2)

  # ----- the run ------------------------------------------------------------------------------------------
  def run(self, load_threads: int = 3) -> dict:
    ready_s = self.start_server()
    rss0 = _rss_mib(self.proc.pid)
    health, metrics = [], []
    threads = [threading.Thread(target=self.load_worker, args=(i,)) for i in range(load_threads)]
    threads += [
        threading.Thread(target=self.fault_worker),
        threading.Thread(target=self.probe_worker, args=(health, metrics)),
    ]
    t0 = time.time()
    for t in threads:
      t.start()
    self.stop.wait(self.minutes * 60)
    self.stop.set()
    for t in threads:
      t.join(DEADLINE_S + 10)
    ran_s = time.time() - t0
    rss1 = _rss_mib(self.proc.pid)
    final = metrics[-1] if metrics else ""
    stalled = _half_body(self.port)  # SIGTERM while a client holds a half-sent body
    t_term = time.perf_counter()
    self.proc.send_signal(signal.SIGTERM)
    try:
      code = self.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      code = "killed after 120 s"
    shutdown_s = time.perf_counter() - t_term
    stalled.close()
    stderr = self.proc.stderr.read()
    return self._summary(ready_s, ran_s, rss0, rss1, health, final, code, shutdown_s, stderr)

  def _summary(self, ready_s, ran_s, rss0, rss1, health, final, code, shutdown_s, stderr) -> dict:
    def metric(name):
      for line in final.splitlines():
        if line.startswith(name + " "):
          return float(line.split()[1])
      return None

    kinds = {}
    for kind in sorted(self.log.status):
      lat = np.asarray(self.log.latency[kind])
      kinds[kind] = {
          "status": dict(sorted(self.log.status[kind].items())),
          "p50_s": round(float(np.median(lat)), 4),
          "p95_s": round(float(np.percentile(lat, 95)), 4),
          "max_s": round(float(lat.max()), 4),
      }
    h = np.asarray(health) if health else np.zeros(1)
    fivexx = sum(n for k in self.log.status.values() for s, n in k.items() if s.startswith("5"))
    internal = stderr.count("internal error") + stderr.count("engine loop failed")
    # uvicorn re-raises SIGTERM once its graceful shutdown is done: -15 is a clean exit
    failures = self.log.failures + ([f"exit status {code}"] if code not in (0, -signal.SIGTERM) else [])
    return {
        "minutes": self.minutes,
        "server_args": self.server_args,
        "ready_s": round(ready_s, 1),
        "ran_s": round(ran_s, 1),
        "requests": sum(sum(k.values()) for k in self.log.status.values()),
        "kinds": kinds,
        "status_5xx": fivexx,
        "health_probes": len(health),
        "health_p50_ms": round(float(np.median(h)) * 1e3, 2),
        "health_p99_ms": round(float(np.percentile(h, 99)) * 1e3, 2),
        "health_max_ms": round(float(h.max()) * 1e3, 2),
        "generated_tokens": metric("loopspec_generated_tokens_total"),
        "server_rss_mib": [round(rss0, 1), round(rss1, 1)],
        "shutdown_s": round(shutdown_s, 2),
        "exit_status": code,
        "server_log_errors": internal,
        "failures": failures[:50],
        "ok": not failures and fivexx == 0,
    }


def report(summary: dict) -> str:
  """The summary as the text the benchmark prints."""
  lines = [f"{'kind':<15}{'requests':>9}  {'p50 s':>8}{'p95 s':>8}{'max s':>8}  statuses"]
  for kind, k in summary["kinds"].items():
    n = sum(k["status"].values())
    lines.append(f"{kind:<15}{n:>9}  {k['p50_s']:>8.3f}{k['p95_s']:>8.3f}{k['max_s']:>8.3f}  {json.dumps(k['status'])}")
  rest = {k: v for k, v in summary.items() if k != "kinds"}
  return "\n".join(lines + [json.dumps(rest, indent=1)])


def run_and_report(run: Soak) -> dict:
  """Runs `run`, prints its report, returns the summary."""
  summary = run.run()
  print(report(summary), flush=True)
  return summary
