"""The paper's Table 3 (ablation of LoopSpec's second proposal) from `timing.benchmark`'s results
(`experiments/paper_table3.py` is the command): each LoopSpec method's variant, gamma as the release counts
it and as we do, its speed against AR (whole decode, and after each request's first token, estimated), the
release's split of first rejections, gate and lane figures; and the markdown table.
"""

from __future__ import annotations


def variant_of(method) -> str:
  """The Table-3 row name of a LoopSpec method: single, masked, residual, residual+gate (masked+gate too)."""
  if method.d2 is None:
    return "single"
  name = method.second or "residual"
  return name + ("+gate" if method.gate in (None, True) else "")


def after_first_seconds(res: dict) -> float:
  """Median decode seconds after each request's first token (the release's clock), estimated from counts:
  LoopSpec by its share of ticks after the first commit, AR by its share of tokens after the first."""
  if "first_token_ticks" in res:
    share = 1.0 - res["first_token_ticks"] / max(res["request_ticks"], 1)
  else:
    share = 1.0 - res["batch"] / max(res["tokens"], 1)
  return res["decode_seconds_median"] * share


def table_rows(results: dict, parsed: list, labels: list) -> list:
  """One row per LoopSpec method: its pair, variant and figures (AR is the reference, not a row)."""
  ar = results["ar"]
  ar_after = after_first_seconds(ar)
  rows = []
  for method, label in zip(parsed, labels):
    if method.name != "loopspec":
      continue
    r = results[label]
    rows.append(
        {
            "d1": method.d1,
            "d2": method.d2,
            "variant": variant_of(method),
            "spec": method.spec,
            "release_gamma": r["release_gamma"],
            "mean_accepted_length": r["mean_accepted_length"],
            "wall_clock_ratio_median": r["wall_clock_ratio_median"],
            "after_first_ratio_est": ar_after / max(after_first_seconds(r), 1e-12),
            "decode_seconds_median": r["decode_seconds_median"],
            "ar_decode_seconds_median": ar["decode_seconds_median"],
            "split": {k: r[f"release_{k}"] for k in ("first_reject", "second_skip", "second_accept", "second_reject")},
            "decode_tokens": r["release_decode_tokens"],
            "commits": r["commits"],
            "gate_open_rate": r["gate_open_rate"],
            "mean_live_lanes": r["mean_live_lanes"],
            "max_live_lanes": r["max_live_lanes"],
            "lane_capacity": r["lane_capacity"],
            "skipped_spawns": r["skipped_spawns"],
        }
    )
  return rows


def markdown(rows: list, meta: dict) -> str:
  """table3.md: one line per LoopSpec row, then the run's model, prompts, sampling, repeats and host."""
  head = (
      "| (d1, d2) | variant | gamma (release: decode tokens) | gamma (ours: all tokens) | speed vs AR (median) "
      "| speed after 1st token (est.) | 1st rejections: x2 skip / accept / reject | gate open | live lanes mean / max "
      "| lane capacity | skipped spawns |"
  )
  lines = [head, "|" + "---|" * 11]
  for r in rows:
    s = r["split"]
    pair = f"({r['d1']}, {r['d2'] if r['d2'] is not None else '-'})"
    lines.append(
        f"| {pair} | {r['variant']} | {r['release_gamma']:.2f} | {r['mean_accepted_length']:.2f} | "
        f"{r['wall_clock_ratio_median']:.3f}x | {r['after_first_ratio_est']:.3f}x | "
        f"{s['first_reject']}: {s['second_skip']} / {s['second_accept']} / {s['second_reject']} | "
        f"{r['gate_open_rate']:.2f} | {r['mean_live_lanes']:.1f} / {r['max_live_lanes']} | {r['lane_capacity']} | "
        f"{r['skipped_spawns']} |"
    )
  c = meta["config"]
  foot = (
      f"\n{meta['model']}, task {c['task']}: prompts {[i + 1 for i in c['prompt_select']]} x {c['max_new_tokens']} tokens, one request "
      f"at a time, T = {c['temperature']}, top-p {c['top_p']}, seed {c['seed']}, init_state {c['init_state']}; "
      f"medians of {c['repeats']} interleaved repeats. Host: {meta['machine']}; {meta['time']}."
  )
  return "\n".join(lines) + "\n" + foot
