"""bench_trees config of the Sequoia-shape run (results/trees_shape/): configs/bench/trees.py with this
run's methods (the tree variants beside chain) and one timed repeat.

  python -P -m loopspec_experiments.bench_trees --config=scripts/results/trees_shape/bench_config.py \
      --config.out_dir=results/trees_shape/epyc2-2026-12-03
  python -P -m loopspec_experiments.bench_trees --config=scripts/results/trees_shape/bench_config.py:t1 \
      --config.out_dir=results/trees_shape/epyc2-2026-12-03-t1
  python -P -m loopspec_experiments.bench_trees --config=scripts/results/trees_shape/bench_config.py:t1b \
      --config.out_dir=results/trees_shape/epyc2-2026-12-04-t1b
  python -P -m loopspec_experiments.bench_trees --config=scripts/results/trees_shape/bench_config.py:kseq \
      --config.out_dir=results/trees_shape/epyc2-2026-12-04-kseq
"""

import importlib.util
import os

_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "bench", "trees.py")
_spec = importlib.util.spec_from_file_location("bench_trees_config", _path)
trees = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trees)

E = "gamma=6,branch=4,tree_nodes=32"
METHODS = ["ar", "chain:d1=1,gamma=6", "chain:d1=2,gamma=6"]
for _extra in ("", ",shape=sequoia", ",drafts=sample", ",drafts=distinct", ",drafts=distinct,shape=sequoia"):
  METHODS += [f"tree:d1=1,{E}{_extra}", f"tree:d1=2,{E}{_extra}"]


# the T = 1 run (preset "t1"): the sampled-draft trees only (top-k drafts at T = 1 measured 1.57 / 1.60 / 1.55
# / 1.56 in results/trees/epyc2-2026-12-03-table; drafts=sample with the ACCEPT_GUESS shape in
# results/trees_sampled/epyc2-2026-12-03, same prompts and seed)
T1_METHODS = ["ar", "chain:d1=1,gamma=6", "chain:d1=2,gamma=6"]
for _extra in (",drafts=sample,shape=sequoia", ",drafts=distinct,shape=sequoia"):
  T1_METHODS += [f"tree:d1=1,{E}{_extra}", f"tree:d1=2,{E}{_extra}"]


# the T = 1 re-run with the sampled acceptance vectors (preset "t1b", results/trees_shape/epyc2-2026-12-04-t1b):
# the t1 rows (their default Sequoia vector is now the sampled one of their drafts mode) and the top-k drafts
# on the Sequoia shape of the sampled top-k vector
T1B_METHODS = T1_METHODS + [f"tree:d1=1,{E},shape=sequoia", f"tree:d1=2,{E},shape=sequoia"]


# SpecTr's K-SEQ on the same i.i.d. sampled trees (preset "kseq", results/trees_shape/epyc2-2026-12-04-kseq):
# the t1 rows (SpecInfer with / without replacement) and drafts=kseq on the Sequoia shape of its count table
KSEQ_METHODS = T1_METHODS + [f"tree:d1=1,{E},drafts=kseq,shape=sequoia", f"tree:d1=2,{E},drafts=kseq,shape=sequoia"]


def get_config(arg=None):
  c = trees.get_config(None)
  c.methods = list(METHODS)
  c.repeats = 1
  c.out_dir = "results/trees_shape/bench"
  if arg in ("t1", "t1b", "kseq"):
    c.methods = list({"t1": T1_METHODS, "t1b": T1B_METHODS, "kseq": KSEQ_METHODS}[arg])
    c.samplings = ["T1"]
  elif arg:
    raise ValueError(f"unknown preset {arg!r}; known: t1, t1b, kseq")
  return c
