"""The paper's Table-3 ablation variants of LoopSpec's second proposal (`loopspec.second`): each is exact.

* enumeration: for random small distributions, every (second, gate) variant followed by the cascade
  verification gives exactly p_R (the cascade is exact for ANY q2);
* greedy: every variant decodes token for token like full-depth AR, skip-free (`lane_capacity="worst"`);
* sampled: chi-square of one `generate` over 3000 requests against the enumerated AR distribution (the
  machinery of tests/decoding/test_lossless_sampling.py);
* the release's split of first rejections (second-skip / -accept / -reject) adds up, and the release's
  "K:X" spelling and the options' aliases parse.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
import test_lossless_sampling as lossless
from helpers import PROMPTS, rand_dist
from loopspec_jax import methods
from loopspec_jax.decoding import verify
from loopspec_jax.decoding.loopspec import decoder as loopspec_decoder
from loopspec_jax.decoding.loopspec import second as second_lib
from loopspec_jax.decoding.loopspec import state as S

VARIANTS = list(itertools.product(("residual", "masked"), (True, False)))
KEY = jax.random.PRNGKey(0)


@functools.lru_cache(maxsize=None)
def _propose_all(second, gate):
  f = lambda q1, x1, p_d2: second_lib.propose(KEY, q1, x1, p_d2, second=second, gate=gate)
  return jax.jit(jax.vmap(f, in_axes=(None, 0, None)))


def exact_output(p, q1, p_d2, second, gate):
  """Enumerated (P(y) [V], P(stage 2), P(second proposal made)) of x1 ~ q1, the variant's q2, x2 ~ q2 and the
  cascade (its acceptance and residual rules from `verify`)."""
  v = p.shape[0]
  p64, q164 = np.asarray(p, np.float64), np.asarray(q1, np.float64)
  opens, _, q2s = _propose_all(second, gate)(q1, jnp.arange(v), p_d2)
  f = np.asarray(verify.residual(p, q1), np.float64)
  out, stage2 = np.minimum(p64, q164), 0.0  # stage 1: min(p, q1)
  made = float(np.sum(q164 * np.asarray(opens)))
  for x1 in range(v):
    rej = q164[x1] - np.minimum(p64, q164)[x1]
    if rej <= 0:
      continue
    if not opens[x1]:
      out += rej * f
      continue
    q2 = q2s[x1]
    a2 = np.asarray(jax.vmap(verify.acceptance_prob, in_axes=(None, None, 0))(f, q2, jnp.arange(v)), np.float64)
    acc = np.asarray(q2, np.float64) * a2
    out += rej * acc + rej * (1 - acc.sum()) * np.asarray(verify.residual(f, q2, fallback=f), np.float64)
    stage2 += rej * acc.sum()
  return out, stage2, made


@pytest.mark.parametrize("second,gate", VARIANTS)
@pytest.mark.parametrize("seed,v", [(0, 5), (1, 6), (2, 8)])
def test_every_variant_is_exact_by_enumeration(second, gate, seed, v):
  rng = np.random.default_rng(seed)
  p, q1 = rand_dist(rng, v), rand_dist(rng, v, "sparse")
  p_d2 = (0.5 * q1 + 0.5 * p).astype(np.float32)
  out, stage2, made = exact_output(p, q1, p_d2, second, gate)
  np.testing.assert_allclose(out, np.asarray(p, np.float64), atol=1e-6)
  assert stage2 > 0
  if not gate:  # ungated: a proposal for every x1 but where p_d2 has no mass off x1
    np.testing.assert_allclose(made, 1.0, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_gated_residual_is_the_papers_second_proposal(seed):
  rng = np.random.default_rng(seed)
  q1, p_d2 = rand_dist(rng, 7), rand_dist(rng, 7)
  for x1 in range(7):
    want = verify.second_proposal(KEY, q1, x1, p_d2, 0.05)
    got = second_lib.propose(KEY, q1, x1, p_d2, second="residual", gate=True, min_mass=0.05)
    for a, b in zip(want, got):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_greedy_second_proposals_on_logits():
  logits = jnp.asarray([[0.0, 3.0, 1.0, 2.0], [5.0, 1.0, 0.0, 4.0]])
  x1 = jnp.asarray([1, 2])
  assert [np.asarray(a).tolist() for a in second_lib.propose_greedy(logits, x1)] == [[False, True], [1, 0]]
  opens, x2 = second_lib.propose_greedy(logits, x1, second="masked", gate=False)
  assert np.asarray(opens).tolist() == [True, True] and np.asarray(x2).tolist() == [3, 0]  # the runner-up


def assert_release_split(stats):
  """The release's identities: decode tokens = first accept + first reject; first reject = skip + accept +
  reject of the second proposal."""
  s = stats
  assert s["release_decode_tokens"] == s["release_first_accept"] + s["release_first_reject"]
  assert s["release_first_reject"] == s["release_second_skip"] + s["release_second_accept"] + s["release_second_reject"]
  assert s["release_first_reject"] <= s["reject_first"]


# Random weights (contraction None): most first proposals are rejected, so the second proposals matter.
@pytest.mark.slow  # 17-33 s each; greedy second proposals are checked on logits by default (below, above)
@pytest.mark.parametrize("second,gate", [("masked", False), ("residual", False), ("masked", True)])
def test_greedy_variants_match_ar(second, gate):
  spec = "huginn:tiny"  # R = 8
  want = helpers.generate_cached(spec, None, "ar")
  got = helpers.generate_cached(spec, None, "loopspec", d1=2, d2=4, lane_capacity="worst", second=second, gate=gate)
  assert got.tokens == want.tokens, got.stats["commits"]
  st = got.stats
  assert st["skipped_spawns"] == 0 and st["lane_capacity"] == 4 * S.worst_stage_lanes(8, 2, 4)
  assert (st["second_kind"], st["gate"]) == (second, gate)
  assert_release_split(st)
  assert st["release_first_reject"] > len(PROMPTS) * 3, st  # the regime rejects, so x2 is exercised
  if (second, gate) == ("masked", False):  # always open: every first rejection verifies x2
    assert st["release_second_skip"] == 0 and st["gate_open_rate"] == 1.0
    assert st["max_live_lanes"] > 8 // 2
  if gate or second == "residual":  # in greedy decoding these coincide with the default: the same proposals
    base = helpers.generate_cached(spec, None, "loopspec", d1=2, d2=4, lane_capacity="worst")
    assert st["commits"] == base.stats["commits"] and st["release_second_accept"] == base.stats["release_second_accept"]


SAMPLED = [
    (
        "masked_ungated_rejected",
        "rejected",
        dict(method="loopspec", d1=2, d2=4, second="masked", gate=False, lane_capacity="worst"),
        1.0,
        0,
        1.0,
        2,
        31,
    ),
]
SAMPLED_SLOW = [
    (
        "residual_ungated_rejected",
        "rejected",
        dict(method="loopspec", d1=2, d2=4, gate=False, lane_capacity="worst"),
        1.0,
        0,
        0.8,
        2,
        32,
    ),
    (
        "masked_gated_accepted",
        "accepted",
        dict(method="loopspec", d1=2, d2=4, second="masked", lane_capacity="worst"),
        1.0,
        0,
        1.0,
        3,
        33,
    ),
]


@pytest.mark.parametrize("case", SAMPLED, ids=[c[0] for c in SAMPLED])
def test_sampled_variant_is_exact(case):
  res, _ = lossless._run(case)
  assert res.stats["skipped_spawns"] == 0 and res.stats["release_second_accept"] > 0
  assert_release_split(res.stats)


@pytest.mark.slow
@pytest.mark.parametrize("case", SAMPLED_SLOW, ids=[c[0] for c in SAMPLED_SLOW])
def test_sampled_variant_is_exact_slow(case):
  res, _ = lossless._run(case)
  assert res.stats["skipped_spawns"] == 0
  assert_release_split(res.stats)


def test_release_spelling_and_aliases():
  assert methods.parse("loopspec:2:4") == methods.parse("loopspec:2,8")
  assert methods.parse("loopspec:4") == methods.parse("loopspec:d1=4")
  assert loopspec_decoder.release_depths("2:5") == (2, 10)
  m = methods.parse("loopspec:2,8,second=masked-q2,gate=always,lane_capacity=worst")
  assert (m.second, m.gate, m.lane_capacity) == ("masked", False, "worst")
  assert methods.parse(m.spec) == m  # the spec round-trips
  assert methods.parse("loopspec:2,8,gate=decrease").gate is True


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d1=2, d2=4, second="argmax"), r"second must be one of"),
        (dict(d1=2, d2=4, gate="sometimes"), r"gate must be True / False"),
        (dict(d1=2, gate=False), r"give d2 as well"),
        (dict(d1=2, d2=4, gate=False, gate_mass=0.2), r"gate_mass tightens the gate"),
        (dict(d1=2, d2=4, lane_capacity="big"), r"lane_capacity must be an integer >= R/d1 or 'worst'"),
        (dict(d1="2:x"), r"the release's depth spelling"),
        (dict(d1="2:4", d2=6), r"gives d2=8, but d2=6"),
    ],
)
def test_bad_options_rejected_before_compiling(kwargs, match):
  model = helpers.tiny_model("huginn:tiny")
  with pytest.raises(ValueError, match=match):
    m = methods.build("loopspec", **kwargs)
    m.validate(model.config)


def test_table3_rows_name_every_variant_once_per_pair():
  """The Table-3 entry point's rows and table from stub results (no decoding): each pair's variants, in order."""
  from loopspec_configs.paper import table3 as config
  from loopspec_experiments import bench, paper_table3

  parsed = methods.parse_list(config.methods())
  labels = bench.row_labels(parsed)
  stub = dict(release_gamma=3.0, mean_accepted_length=3.1, wall_clock_ratio_median=1.2, decode_seconds_median=0.8)
  stub.update(first_token_ticks=8, request_ticks=40, release_decode_tokens=9, release_first_reject=2)
  stub.update(release_second_skip=1, release_second_accept=1, release_second_reject=0, commits={}, gate_open_rate=0.5)
  stub.update(mean_live_lanes=3.0, max_live_lanes=9, lane_capacity=100, skipped_spawns=0)
  results = {l: dict(stub) for l in labels}
  results["ar"] = {"decode_seconds_median": 1.0, "batch": 1, "tokens": 10}
  rows = paper_table3.table_rows(results, parsed, labels)
  got = [(r["d1"], r["d2"], r["variant"]) for r in rows]
  assert got[:4] == [(2, None, "single"), (2, 8, "masked"), (2, 8, "residual"), (2, 8, "residual+gate")]
  assert len(got) == 11 and got[-1] == (4, 8, "residual+gate")
  # after the first token: AR keeps 9/10 of its time, LoopSpec 32/40 of its ticks' share
  assert rows[0]["after_first_ratio_est"] == pytest.approx(0.9 / (0.8 * 0.8))


def test_release_presets_map_to_offline_tasks_or_say_why_not():
  from loopspec_configs.release import suite
  from loopspec_experiments import release_run

  for name in ("100", "101", "110", "111", "112", "113"):
    for job in suite.experiment(name).values():
      for depth in job["depths"]:
        methods.parse(release_run.method_spec(depth))  # every release configuration parses
      for task in job["tasks"]:
        twin, why = release_run.resolve_task(task, bundled=True)
        assert (twin is None) != (why is None) and (why is None or task in why)
  assert release_run.resolve_task("gsm8k-cot", bundled=True) == ("loopspec_gsm8k_cot", None)
  assert release_run.resolve_task("gsm8k-cot-chat", bundled=True) == ("loopspec_gsm8k_cot", None)  # chat: a template
  assert "'aime24'" in release_run.resolve_task("aime24-chat", bundled=True)[1]  # no offline twin ships
  cfg = suite.get_config("111")
  chat = release_run.eval_config(cfg, "m", "loopspec_gsm8k_cot", ["1:2"], {}, "gsm8k-cot-chat", "/tmp/x")
  plain = release_run.eval_config(cfg, "m", "loopspec_gsm8k_cot", ["1:2"], {}, "gsm8k-cot", "/tmp/x")
  assert (chat.apply_chat_template, chat.enable_thinking) == (True, True) and not plain.apply_chat_template
  assert "'bbh_cot_fewshot'" in release_run.resolve_task("bbh", bundled=True)[1]
