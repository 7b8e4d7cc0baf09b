"""`loopspec-aot`'s report (experiments/aot.py) without compiling: the merged table across result folders (each
grid row from the newest folder that has it, the rows asked for that none has) and the reduced-depth overrides."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from loopspec_configs import aot as aot_config
from loopspec_experiments import aot as report
from loopspec_jax.analysis import aot


def _row(model, method, hbm, **kw):
  row = {
      "model": model,
      "method": method,
      "target": "tpu:v5e:2x2",
      "mesh": "1x1",
      "batch": 1,
      "context": 2048,
      "compiled": True,
      "argument_bytes": 1e9,
      "temp_bytes": hbm - 1e9,
      "hbm_bytes": hbm,
      "fits": True,
      "loop_copies": 0,
  }
  return {**row, **kw}


def _folder(path, rows):
  path.mkdir()
  (path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def test_merged_rows_take_each_key_from_the_newest_folder(tmp_path):
  old = _folder(
      tmp_path / "old",
      [_row("ouro:1p4b", "ar", 7e9), _row("ouro:1p4b", "tree", 9e9, loop_copies=26), _row("ouro:1p4b", "ar", 5e9)],
  )  # a folder's later row of a key is its rerun
  new = _folder(tmp_path / "new", [_row("ouro:1p4b", "tree", 6e9)])
  rows = report.merged_rows([new, old])
  assert [(r["method"], r["hbm_bytes"], r["loop_copies"], r["from"]) for r in rows] == [
      ("tree", 6e9, 0, "new"),
      ("ar", 5e9, 0, "old"),
  ]
  asked = [("ouro:1p4b", m, "tpu:v5e", (1, 1), 1, 2048) for m in ("ar", "tree", "mtp")]
  report.write_merged(str(tmp_path), [new, old], asked)
  assert [json.loads(l)["from"] for l in (tmp_path / "merged.jsonl").read_text().splitlines()] == ["new", "old"]
  text = (tmp_path / "merged.md").read_text()
  assert text.splitlines()[0].endswith("| from |")
  assert "| tree | tpu:v5e:2x2 | 1x1 | 1 | 2048 | 1.00 | 5.00 | 6.00 |" in text and " new |" in text
  not_compiled = text.split("Not compiled")[1]
  assert not_compiled.startswith(": 1 of the 3 rows asked")
  assert "| tpu:v5e:2x2 | 1x1 | 1 | 2048 | ouro:1p4b: mtp |" in not_compiled and "tree" not in not_compiled
  listing = (tmp_path / "not_compiled.md").read_text()
  assert "| ouro:1p4b | mtp | tpu:v5e:2x2 | 1x1 | 1 | 2048 |" in listing and "| tree |" not in listing


def test_overrides_parse_integer_fields():
  assert report.parse_overrides("n_core=2, recurrence=4") == {"n_core": 2, "recurrence": 4}
  assert report.parse_overrides("") == {}
  with pytest.raises(ValueError, match="not <field>=<integer>"):
    report.parse_overrides("dtype=float32")


def test_full_preset_is_the_union_of_its_grids_each_row_once():
  """`--config=configs/aot.py:full`: every method of every model on one v5e chip (Huginn-0125's on v5p too),
  AR and LoopSpec on each generation (b1 / b8, 2048 / 8192) and at batch 8 on the v5e-8 and v5e-16 meshes; rows
  the grids share once."""
  rows = report.grid(aot_config.get_config("full"))
  assert len(rows) == len(set(rows))
  one_chip = [r for r in rows if r[2:] == ("tpu:v5e", (1, 1), 1, 2048)]
  assert len(one_chip) == 4 * 12  # 4 models x every registered method
  v5p = [r for r in rows if r[2:] == ("tpu:v5p", (1, 1), 1, 2048)]
  assert len(v5p) == 12 + 3 * 2 and {r[0] for r in v5p if r[1] == "mtp"} == {"huginn:0125"}  # + AR, LS of 3
  assert len(rows) == 242
  assert ("huginn:0125", "ar", "tpu:v6e", (1, 1), 8, 8192) in rows
  assert ("ouro:2p6b", "loopspec:d1=1,d2=2", "tpu:v5e:4x4", (2, 8), 8, 2048) in rows
  assert not [r for r in rows if r[3] != (1, 1) and (r[4] != 8 or r[1] not in ("ar",) and "d2" not in r[1])]
  assert (
      len(report.grid(aot_config.get_config())) == 12 + 3 * 2
  )  # the default: every method at the first model, AR / LoopSpec


def test_unknown_grid_field_is_refused():
  c = aot_config.get_config()
  c.grids = (dict(method="ar"),)
  with pytest.raises(ValueError, match="unknown fields \\['method'\\]"):
    report.grid(c)


def _killed(*args):
  os.kill(os.getpid(), signal.SIGKILL)


def _echo(*args):
  return {"args": list(args)}


def test_a_row_compiled_apart_returns_its_row_or_dies_alone():
  """`isolate`: each row in a fresh process; one the kernel kills becomes a row not compiled, with the reason."""
  key = ("ouro:2p6b", "eagle", "tpu:v5e:2x2", "1x1", 1, 2048)
  assert report.measure_apart(key, (1, "a"), _echo) == {"args": [1, "a"]}
  row = report.measure_apart(key, (), _killed)
  assert tuple(row[k] for k in report.KEY) == key and row["compiled"] is False and row["fits"] is None
  assert "process died" in row["error"] and set(report.ROW_FIELDS) <= set(row)
  assert "| ouro:2p6b | eagle |" in report.memory_markdown([row])


def _running_children(pid: int) -> list:
  """The live (not zombie) children of `pid`, from /proc."""
  try:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
      kids = [int(k) for k in fh.read().split()]
  except FileNotFoundError:
    return []
  return [kid for kid in kids if _alive(kid)]


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as fh:
      return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads children from Linux /proc")
def test_a_terminated_run_takes_its_compiling_child_with_it():
  """SIGTERM to `loopspec-aot` (a killed job, a timeout) ends the row's compiling process too: none is left
  running orphaned, holding memory and a core (it happened: a killed run's compile went on for minutes)."""
  code = (
      "import signal, time\n"
      "from loopspec_experiments import aot as report\n"
      "signal.signal(signal.SIGTERM, report._exit_on_sigterm)\n"
      "report.measure_apart(('m', 'ar', 't', '1x1', 1, 1), (600,), time.sleep)\n"
  )
  parent, kids = subprocess.Popen([sys.executable, "-c", code]), []
  try:
    deadline = time.monotonic() + 60
    while not _running_children(parent.pid) and time.monotonic() < deadline:
      time.sleep(0.1)
    time.sleep(1.0)
    kids = _running_children(parent.pid)
    assert kids, "measure_apart started no child"
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not any(_alive(k) for k in kids)
  finally:  # a failing run leaves nothing behind either
    for pid in [parent.pid, *kids]:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    parent.wait()


def test_a_row_refused_before_compiling_shows_its_floor_and_no_hbm():
  """A row `aot.over_hbm` refused: its arguments are a floor (`≥`), its HBM not the compiler's (none ran)."""
  key = ("huginn:0125", "ar", "tpu:v4:2x2x1", "1x1", 8, 8192)
  row = dict(zip(report.KEY, key), compiled=False, error=aot.over_hbm(189.83e9, aot.parse_target("tpu:v4")))
  row.update(dict.fromkeys(report.ROW_FIELDS), argument_bytes=189.83e9, fits=False)
  line = report.memory_markdown([row]).splitlines()[-1]
  assert "| ≥ 189.83 | - | - (arguments over HBM, not compiled) | 16.37 | **no** | - |" in line
  del row["loop_copies"]  # a row of tpu_costs' folder has no such field: shown as none
  assert report.memory_markdown([row]).splitlines()[-1] == line


@pytest.mark.skipif(aot.tpu_unavailable() is not None, reason=f"TPU compiler: {aot.tpu_unavailable()}")
def test_a_measured_row_has_every_field():
  """One row compiled at the fixture's size: its key, every figure `ROW_FIELDS` names, and the parser's."""
  row = report.measure("huginn:tiny", "ar", "tpu:v5e", (1, 1), 1, 32, "bfloat16")
  assert tuple(row[k] for k in report.KEY) == ("huginn:tiny", "ar", "tpu:v5e:2x2", "1x1", 1, 32)
  assert row["compiled"] and row["error"] is None and row["fits"] is True and row["loop_copies"] == 0
  assert all(row[k] is not None for k in report.ROW_FIELDS), [k for k in report.ROW_FIELDS if row[k] is None]


def test_methods_table_puts_each_methods_v5p_row_beside_its_v5e_row():
  """methods.md: one line per (model, method) at b1 / 2048 on one v5e chip, in `aot.METHOD_SPECS` order, with
  the v5p chip's arguments / temporaries where that row exists; other rows (meshes, batch 8) left out."""

  def row(method, target, compiled, hbm, **kw):
    key = dict(zip(report.KEY, ("huginn:0125", method, target, "1x1", 1, 2048)))
    figures = dict.fromkeys(report.ROW_FIELDS)
    return {**key, **figures, "compiled": compiled, "hbm_bytes": hbm, "fits": compiled, **kw}

  rows = [
      row("tree", "tpu:v5e:2x2", False, 17.16e9),
      row("tree", "tpu:v5p:2x2x1", True, 17.4e9, argument_bytes=12.95e9, temp_bytes=4.4e9, loop_copies=0),
      row("ar", "tpu:v5e:2x2", True, 15.46e9, loop_copies=0),
      {**row("ar", "tpu:v5e:2x4", True, 8.3e9), "mesh": "1x8", "batch": 8},
  ]
  lines = report.methods_markdown(rows).splitlines()[2:]
  assert lines == [
      "| huginn:0125 | ar | 15.46 | yes | - | - | - | 0 |",
      "| huginn:0125 | tree | 17.16 (refused) | **no** | 12.95 | 4.40 | yes | 0 |",
  ]
