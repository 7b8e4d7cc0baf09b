"""Plots of the depth analysis (matplotlib, Agg backend): apart from the metrics, so that measuring and
summarizing depths (`depth_metrics`) never imports matplotlib."""

from __future__ import annotations

import os

import numpy as np

from loopspec_jax.analysis import theory


def plot_depths(summary: dict, path: str, title: str = ""):
  """Log-log plot of mean TV and greedy disagreement by depth with the fitted power laws (PNG via Agg)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  d = np.asarray(summary["depths"], float)
  fig, ax = plt.subplots(figsize=(6, 4))
  for key, label, marker in (("mean_tv", "E[TV(p_r, p_R)]", "o"), ("disagreement", "P(argmax p_r != argmax p_R)", "s")):
    y = np.asarray(summary[key], float)
    ok = y > 0
    ax.plot(d[ok], y[ok], marker=marker, ls="-", label=label)
  grid = np.linspace(1, max(d[-1] - 1, 1.5), 100)
  for key, style, label in (("envelope", "k--", "envelope"), ("least_squares", "k:", "least squares")):
    f = summary["fits"].get(key)
    if f:
      ax.plot(
          grid,
          theory.power_law(grid, f["beta"], f["alpha"]),
          style,
          label=f"{label}: {f['beta']:.3g} r^-{f['alpha']:.2f}",
      )
  t2 = summary.get("theorem2")
  if t2:
    for x, c in zip(t2["optimal_continuous"], ("tab:red", "tab:purple")):
      ax.axvline(x, color=c, alpha=0.4, lw=1)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("depth r")
  ax.set_ylabel("distance to depth R")
  ax.set_title(title or f"readout distance by depth (R={summary['recurrence']}, {summary['positions']} positions)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
