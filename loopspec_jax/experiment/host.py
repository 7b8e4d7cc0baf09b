"""The machine a benchmark ran on: what its wall-clock ratios depend on (processor, cores, caches, backend)."""

from __future__ import annotations

import glob
import os
import platform

import jax


def cpu_model() -> str:
  """The processor's model name (/proc/cpuinfo; platform.processor() elsewhere): ratios on a CPU depend on it."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def machine_description() -> str:
  """Host, processor, cores and jax backend: what a benchmark's ratios depend on."""
  return (
      f"{platform.node()} {platform.machine()} ({cpu_model()}), {os.cpu_count()} CPU cores, jax {jax.__version__} on "
      f"{jax.devices()[0].platform}"
  )


def _cache_bytes(text: str):
  """A sysfs cache size ('32768K', '8M', '512') in bytes, or None when it is not a size."""
  text = text.strip().upper()
  unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
  digits = text.rstrip("KMG")
  return int(digits) * unit if digits.isdigit() else None


def last_level_cache_bytes(
    default: int = 32 << 20, pattern: str = "/sys/devices/system/cpu/cpu0/cache/index*/size"
) -> int:
  """The largest CPU cache of this host (Linux sysfs: cpu0's highest-level unified cache), or `default` where
  the kernel does not say."""
  sizes = []
  for path in glob.glob(pattern):
    try:
      with open(path) as f:
        size = _cache_bytes(f.read())
    except OSError:
      continue
    if size is not None:
      sizes.append(size)
  return max(sizes) if sizes else default
