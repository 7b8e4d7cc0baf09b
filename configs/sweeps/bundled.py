"""(d1, d2, gamma) sweeps of the bundled trained models (issue 13): tiny-raven (R = 32) and tiny-ouro (R = 4).

  loopspec-measure-depths --config=sweeps/depths.py:tiny_raven      # depth curves first (every task, 24 x 64)
  loopspec-sweep --config=sweeps/bundled.py:tiny_raven              # GSM8K greedy, the engine grid + chain
  loopspec-sweep --config=sweeps/bundled.py:tiny_raven_lanes        # d1 = 1 with lane capacity 128: no skips
  loopspec-sweep --config=sweeps/bundled.py:tiny_raven_sample       # GSM8K sampled (T = 1, top-p 0.7), reduced
  loopspec-sweep --config=sweeps/bundled.py:tiny_raven_replay       # greedy gamma of EVERY feasible pair, all tasks
  loopspec-sweep --config=sweeps/bundled.py:tiny_ouro               # R = 4: the whole grid, greedy and sampled
  loopspec-sweep --config=sweeps/bundled.py:tiny_ouro_replay
  loopspec-sweep --config=sweeps/bundled.py:tiny_raven_baselines    # AR, chain, draft model, lookup, LoopSpec (2, 8)
  loopspec-sweep --config=sweeps/bundled.py:tiny_ouro_baselines     # the same at (1, 2); greedy and sampled both
  loopspec-sweep --config=sweeps/bundled.py:tiny_raven --config.mode=project   # H200 ratios at Huginn-0125
  loopspec-sweep --config=sweeps/bundled.py --config.mode=headline   # results/bundled/headline.md
  loopspec-sweep --config=sweeps/bundled.py:ci                      # test-sized: one task, two configurations

Engine rows time every configuration against AR passes interleaved with its own (`interleave_ar`), so the
wall-clock ratio survives load drift on a shared machine. Compiling one LoopSpec configuration takes 30-70 s on a
loaded 2-core CPU, so the engine grid is a cover of the feasible set (every d1, single proposal included, d2 near
and far, the pairs Theorem 2 and the fitted curve predict), and the `*_replay` presets (mode "replay") give the
greedy gamma of every feasible pair and chain draft length on every task from the per-depth argmax agreement
along the AR continuation: greedy LoopSpec and chain commit exactly what that agreement says (the test suite
checks the engine's counts against it), so the replay costs one full-sequence forward per prompt and no compile
per configuration; the engine rows are checked against it (`replay_matches`).
"""

from loopspec_configs.sweeps import default

TASKS = "gsm8k,math500,mbpp,humaneval,shakespeare"


TREES = {  # the tree methods' rows of the baselines presets (issue 26's envelope; tiny-ouro at its R = 4)
    "tiny-raven": "tree:d1=2,gamma=6,branch=4,tree_nodes=32;lookahead:window=5,ngram=4,guesses=5",
    "tiny-ouro": "tree:d1=1,gamma=3,branch=4,tree_nodes=16;lookahead:window=5,ngram=4,guesses=5",
}
# the bundled heads' rows (issue 27; the MTP head drafts for tiny-raven-mtp, another target, so it has no row here)
HEADS = {
    "tiny-raven": "medusa:heads=tiny-raven-medusa,tree_nodes=16,branch=4;"
    "eagle:heads=tiny-raven-eagle,gamma=6,branch=4,tree_nodes=32",
    "tiny-ouro": "",
}


def baselines(c, model: str, pair: str):
  """The `*_baselines` presets: GSM8K greedy and sampled (T = 1, top-p 0.7), AR + chain (the model's chain
  depth) + the separate drafter tiny-raven-draft (gamma 4 and "auto"; it shares the bundled models' tokenizer)
  + prompt lookup (ngram 3, gamma 4) + the bundled heads (`HEADS`) + the tree methods (`TREES`) + LoopSpec at
  the paper's pair, all in one run."""
  c.samplings = "greedy,sample"
  c.num_prompts = 8  # on the loaded 2-core CPU: tiny-raven ~11 minutes, tiny-ouro ~4
  c.repeats = 3
  c.configs = pair
  c.draft_model = "tiny-raven-draft"
  c.draft_gammas = "4,auto"
  c.lookup_ngram = 3
  c.lookup_gammas = "4"
  c.extra_methods = ";".join(filter(None, (HEADS[model], TREES[model])))  # heads, tree self-spec., lookahead
  c.out_dir = f"results/bundled/{model}/sweep_baselines"
  c.replay_jsonl = f"results/bundled/{model}/sweep/replay.jsonl"  # gamma with every spawn granted (greedy)


def _common():
  """What every preset shares: GSM8K greedy engine rows, AR interleaved, and the modes' settings."""
  c = default.get_config()
  c.contraction = None
  c.model = "tiny-raven"
  c.tasks = "gsm8k"
  c.samplings = "greedy"
  c.num_prompts = 4  # engine rows (compile-bound here); gamma's many-prompt estimate is the replay's (24 prompts)
  c.max_new_tokens = 64
  c.repeats = 2
  c.interleave_ar = True
  c.mode = "engine"  # "engine": decode with generate; "replay": greedy gamma from the depth agreement (no decoding)
  c.replay_prompts = 24  # replay: prompts per task (the depth analysis's records are reused when present)
  c.depths_jsonl = ""  # replay: the depth analysis's per-prompt records ('' = <depths_json's folder>/depths.jsonl)
  # mode "project": per-iteration roofline cost of every swept loop at a real model's shape (analysis/cost.py),
  # cached in <out_dir>/projection.json; the tables then show the projected ratio vs AR from the measured gamma.
  c.projection_model = "huginn:0125"
  c.projection_context = 2048
  c.projection_accelerator = "h200"
  c.projection_json = ""
  # mode "headline": predicted vs measured best over these models' results (depths/ and sweep/ under each)
  c.headline_dirs = "results/bundled/tiny-raven,results/bundled/tiny-ouro"
  c.headline_out = "results/bundled/headline.md"
  c.headline_wall_clock = "sweep_quiet"  # wall-clock columns from <model>/sweep_quiet/ where present, else sweep/
  c.replay_jsonl = ""  # engine tables compare with this replay ('' = <out_dir>/replay.jsonl)
  return c


def _tiny_raven(c, arg):
  """tiny-raven (R = 32): the engine grid + chain, and its sampled / lanes / baselines / replay variants."""
  c.chain_d1 = 2
  c.depths_json = "results/bundled/tiny-raven/depths/depths_{task}_{sampling}.json"
  c.out_dir = "results/bundled/tiny-raven/sweep"
  # A cover of the 57 feasible pairs, most informative first (a sweep cut short keeps them): the paper's (2, 8),
  # Theorem 2's prediction for GSM8K greedy (1, 5), the replay's best (1, 3), single proposals and d1 = 4
  # (add e.g. ';1,2;1,4;1,8;1,16;2,4;2,6;2,16;4,16;8,24' and chain gammas on a quiet machine).
  c.configs = "2,8;1,5;1,3;1,none;2,none;4,8;4,none;16,none;8,16;8,none"
  c.chain_gammas = "8"
  if arg == "tiny_raven_sample":
    c.samplings = "sample"
    # Theorem 2's prediction for GSM8K sampled is (2, 6); beside it the paper's (2, 8) and the single
    # proposal (2, -) (add pairs and chain gammas on a quiet machine).
    c.configs = "2,6;2,8;2,none"
    c.chain_d1 = None
    c.table_md = "sweep_sample.md"  # beside the greedy sweep's sweep.md (same rows file)
  if arg == "tiny_raven_lanes":  # d1 = 1 with room for every spawn: 32 stages x 4 lanes (the default is x 2)
    c.configs = "1,5;1,3"
    c.chain_d1 = None
    c.lane_capacity = 128
    c.out_dir = "results/bundled/tiny-raven/sweep_lanes"
    c.replay_jsonl = "results/bundled/tiny-raven/sweep/replay.jsonl"
  if arg == "tiny_raven_baselines":
    baselines(c, "tiny-raven", "2,8")
    c.chain_gammas = "4,8"  # gamma 4 beside the drafter's
  if arg == "tiny_raven_replay":
    c.mode = "replay"
    c.tasks = TASKS
    c.configs = ""  # the whole feasible grid
    c.chain_gammas = "1,2,3,4,6,8,12,16"


def _tiny_ouro(c, arg):
  """tiny-ouro (R = 4): the whole grid, greedy and sampled; its baselines and replay variants."""
  c.model = "tiny-ouro"
  c.samplings = "greedy,sample"
  c.configs = ""  # R = 4: (1, 2), (1, 3), (1, -), (2, -)
  c.chain_d1 = 1
  c.chain_gammas = "2,3"
  c.depths_json = "results/bundled/tiny-ouro/depths/depths_{task}_{sampling}.json"
  c.projection_model = "ouro:1p4b"
  c.out_dir = "results/bundled/tiny-ouro/sweep"
  if arg == "tiny_ouro_baselines":
    baselines(c, "tiny-ouro", "1,2")
  if arg == "tiny_ouro_replay":
    c.mode = "replay"
    c.tasks = TASKS
    c.samplings = "greedy"
    c.chain_gammas = "1,2,3,4"


def _ci(c, arg):
  """tests/experiments/test_depth_sweep.py: one task, two configurations, a tiny budget."""
  del arg
  c.num_prompts = 1
  c.max_new_tokens = 8
  c.repeats = 1
  c.configs = "2,8;2,none"
  c.chain_d1 = None
  c.replay_prompts = 1
  c.out_dir = "results/bundled_ci/sweep"
  c.depths_json = "results/bundled_ci/depths/depths_{task}_{sampling}.json"


_RAVEN = ("tiny_raven", "tiny_raven_sample", "tiny_raven_replay", "tiny_raven_lanes", "tiny_raven_baselines")
_PRESETS = {
    **{name: _tiny_raven for name in _RAVEN},
    **{name: _tiny_ouro for name in ("tiny_ouro", "tiny_ouro_replay", "tiny_ouro_baselines")},
    "ci": _ci,
}


def get_config(arg=None):
  arg = arg or "tiny_raven"
  if arg not in _PRESETS:
    raise ValueError(f"unknown preset {arg!r}; known: {', '.join(_PRESETS)}")
  c = _common()
  _PRESETS[arg](c, arg)
  return c
