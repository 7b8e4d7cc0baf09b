"""Medusa-1 heads against chain and tree self-speculation on the bundled tiny-raven (greedy, issue 27).

  python -P results/heads/bench_medusa.py --out results/heads/<host>-<date> [--repeats 1] [--new 96]

Per task (8 held-out GSM8K and 8 Shakespeare prompts, one batch of 8 each, cut to their last max_len // 2
tokens as loopspec-bench and results/trees/bench_trees.py do), every method runs once to compile, then
`repeats` timed runs interleaved (the order rotates). Reported: tau (tokens per full-depth verify pass),
accepted drafts and nodes per pass, draft cost share, median decode seconds and speed against AR, and whether
the tokens equal AR's. Per-level acceptance of each Medusa tree size is measured by replaying AR's greedy
continuation (which medusa's output equals): from the features of the whole sequence (one full-sequence
forward at depth R), each round's tree is rebuilt exactly as the decoder builds it and walked along AR's
tokens; level j's acceptance = P(n_acc >= j | n_acc >= j - 1) over rounds. Also each head's top-1 accuracy
(head i against the token i + 2 ahead) and its top-`branch` hit rate on those continuations.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

import loopspec_jax as lj
from loopspec_jax.decoding.tree import medusa as dm
from loopspec_jax.experiments import bench
from loopspec_jax.heads import medusa as hm

HEADS = "tiny-raven-medusa"
SIZES = (8, 16, 32)
METHODS = ("ar", "chain:d1=2,gamma=6", "tree:d1=2,gamma=6,branch=4,tree_nodes=32") + tuple(
    f"medusa:tree_nodes={n},branch=4" for n in SIZES
)


def run_task(model, heads, task, prompts, new, repeats, log):
  secs, res = {m: [] for m in METHODS}, {}
  for rep in range(repeats + 1):  # rep 0 compiles
    order = METHODS[rep % len(METHODS) :] + METHODS[: rep % len(METHODS)]
    for m in order:
      kw = {"heads": heads} if m.startswith("medusa") else {}
      r = lj.generate(model, prompts, max_new_tokens=new, method=m, seed=0, **kw)
      if rep:
        secs[m].append(r.stats["decode_seconds"])
      res[m] = r
      log(f"{task} rep {rep} {m}: {r.stats['decode_seconds']:.2f}s tau {r.stats.get('tokens_per_pass', 1):.2f}")
  ar_med = statistics.median(secs["ar"])
  rows = []
  for m in METHODS:
    st = res[m].stats
    rows.append(
        {
            "task": task,
            "method": m,
            "tau": st.get("tokens_per_pass", 1.0),
            "accepted_per_pass": st.get("accepted", 0) / max(st.get("rounds", 1), 1),
            "nodes_per_pass": st.get("nodes_per_pass", 0.0),
            "draft_cost_share": st.get("draft_cost_share", 0.0),
            "decode_seconds": secs[m],
            "decode_seconds_median": statistics.median(secs[m]),
            "speed_vs_ar_median": ar_med / statistics.median(secs[m]),
            "tokens": st["tokens_generated"],
            "identical_to_ar": res[m].tokens == res["ar"].tokens,
        }
    )
  return rows, res["ar"].tokens


_features = jax.jit(hm.features, static_argnames=("cfg",))
_trees = jax.jit(dm.build_tree, static_argnames=("branch", "tree_nodes"))
_logits = jax.jit(hm.head_logits)


def replay(model, heads, prompts, continuations, tree_nodes: int, branch: int = 4) -> dict:
  """Accepted-length histogram of medusa's rounds on AR's greedy continuations (module docstring)."""
  k = int(heads.config["num_heads"])
  n_acc_all, top1, topb, cnt = [], np.zeros(k), np.zeros(k), np.zeros(k)
  for p, c in zip(prompts, continuations):
    seq = np.asarray(list(p) + list(c), np.int32)
    feats = _features(model.params, jnp.asarray(seq[None]), model.config)[0]  # [T, E]
    # tree for a root at position q is built from the feature at q - 1 (zeros when q = 0)
    prev = jnp.concatenate([jnp.zeros_like(feats[:1]), feats[:-1]], axis=0)
    tree = jax.device_get(_trees(heads.params, prev, jnp.asarray(seq), branch=branch, tree_nodes=tree_nodes))
    top = np.asarray(jax.lax.top_k(_logits(heads.params, feats), branch)[1])  # [T, k, branch]
    for i in range(k):
      t = np.arange(len(p) - 1, len(seq) - i - 2)
      top1[i] += np.sum(top[t, i, 0] == seq[t + i + 2])
      topb[i] += np.sum(np.any(top[t, i, :] == seq[t + i + 2][:, None], axis=1))
      cnt[i] += len(t)
    q, end = len(p) - 1, len(seq) - 1
    while q < end:
      node, n = 0, 0
      while q + n + 1 <= end:
        nxt = seq[q + n + 1]
        kids = [j for j in range(1, tree.tokens.shape[1]) if tree.parent[q, j] == node and tree.tokens[q, j] == nxt]
        if not kids:
          break
        node, n = kids[0], n + 1
      n_acc_all.append(n)
      q += n + 1
  n_acc = np.asarray(n_acc_all)
  levels = [float(np.sum(n_acc >= j) / max(np.sum(n_acc >= j - 1), 1)) for j in range(1, k + 1)]
  return {
      "tree_nodes": tree_nodes,
      "rounds": int(len(n_acc)),
      "tau_replayed": float(np.mean(n_acc + 1)),
      "level_acceptance": levels,
      "head_top1": (top1 / cnt).tolist(),
      "head_topk": (topb / cnt).tolist(),
  }


def table(rows) -> str:
  head = "| task | method | tau | accepted/pass | nodes/pass | draft share | decode s (median) | speed vs AR | = AR |"
  lines = [head, "|" + "---|" * 9]
  for r in rows:
    lines.append(
        f"| {r['task']} | {r['method']} | {r['tau']:.2f} | {r['accepted_per_pass']:.2f} | {r['nodes_per_pass']:.1f} | "
        f"{r['draft_cost_share']:.3f} | {r['decode_seconds_median']:.2f} | {r['speed_vs_ar_median']:.2f}x | "
        f"{'yes' if r['identical_to_ar'] else 'no'} |"
    )
  return "\n".join(lines)


def level_table(levels) -> str:
  k = len(levels[0]["level_acceptance"])
  head = "| task | tree_nodes | rounds | tau (replayed) | " + " | ".join(f"level {j + 1}" for j in range(k)) + " |"
  lines = [head, "|" + "---|" * (4 + k)]
  for r in levels:
    lv = " | ".join(f"{a:.1%}" for a in r["level_acceptance"])
    lines.append(f"| {r['task']} | {r['tree_nodes']} | {r['rounds']} | {r['tau_replayed']:.2f} | {lv} |")
  heads = " | ".join(f"head {i} (t+{i + 2})" for i in range(k))
  lines += ["", f"| task | {heads} |", "|" + "---|" * (1 + k)]
  for r in levels:
    if r["tree_nodes"] == SIZES[0]:
      cells = " | ".join(f"{a:.1%} / {b:.1%}" for a, b in zip(r["head_top1"], r["head_topk"]))
      lines.append(f"| {r['task']} (top-1 / top-4) | {cells} |")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  ap.add_argument("--repeats", type=int, default=1)
  ap.add_argument("--new", type=int, default=96)
  ap.add_argument("--num", type=int, default=8)
  ap.add_argument("--heads", default=HEADS, help="a head directory or bundled name")
  ap.add_argument("--tasks", default="gsm8k,shakespeare")
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  logf = open(os.path.join(args.out, "log.txt"), "a")

  def log(msg):
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    print(line, flush=True)
    logf.write(line + "\n")
    logf.flush()

  model, heads = lj.load("tiny-raven"), lj.load_heads(args.heads)
  rows, levels = [], []
  for task in args.tasks.split(","):
    prompts = bench.load_prompt_set(task, model, args.num, 0, 0)
    r, ar_tokens = run_task(model, heads, task, prompts, args.new, args.repeats, log)
    rows += r
    for n in SIZES:
      levels.append(dict(task=task, **replay(model, heads, prompts, ar_tokens, n)))
      log(f"{task} replay tree_nodes={n}: {levels[-1]}")
    with open(os.path.join(args.out, "results.json"), "w") as f:
      json.dump({"rows": rows, "levels": levels}, f, indent=1)
  text = table(rows) + "\n\n" + level_table(levels) + "\n"
  with open(os.path.join(args.out, "table.md"), "w") as f:
    f.write(text)
  print(text)
  print(subprocess.run(["uptime"], capture_output=True, text=True).stdout)


if __name__ == "__main__":
  main()
