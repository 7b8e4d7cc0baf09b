"""The lm-evaluation-harness backend, the offline task YAMLs and loopspec-evaluate, end to end and offline.

A random huginn:tiny model (R = 8, context 128) with the bundled 2048-token tokenizer stands in for a real
checkpoint. Every harness run goes through `lm_eval.simple_evaluate` with the offline tasks of
`loopspec_jax/tasks/`; GSM8K-CoT contexts (8-shot, ~1000 tokens) are cut to the same 112 tokens, so the AR and
LoopSpec programs compile once for the module (batch 2, 16 new tokens) and the evaluate test reuses them.
Task definitions are checked against oracle answers with a scripted harness model (no JAX).
"""

import json
import os
import sys

from absl import flags
from absl import logging
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the tests never reach the hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")

lm_eval = pytest.importorskip("lm_eval")  # the `eval` extra (in `dev`)
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.model import LM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

import helpers  # noqa: E402
import loopspec_jax  # noqa: E402
from loopspec_jax import tasks as offline_tasks  # noqa: E402
from loopspec_configs.eval import default as eval_config  # noqa: E402
from loopspec_jax.decoding import stops as stop_seqs  # noqa: E402
from loopspec_experiments import common  # noqa: E402
from loopspec_experiments import evaluate  # noqa: E402
from loopspec_jax.integrations import lm_eval as backend  # noqa: E402

MAX_NEW = 16
GEN_KWARGS = f"max_gen_toks={MAX_NEW}"
LOOPSPEC = {"method": "loopspec", "d1": 2}  # one proposal: half the compile time of two on 2 CPU cores
GSM8K = "loopspec_gsm8k_cot"


@pytest.fixture(scope="module")
def model():
  return helpers.tokenized_model("huginn:tiny", contraction=0.7, max_len=128)


@pytest.fixture(scope="module")
def offline_tm():
  return TaskManager(include_path=offline_tasks.TASKS_DIR, include_defaults=False)


def harness(lm, tasks, tm, limit=2, **kw):
  return lm_eval.simple_evaluate(
      model=lm, tasks=tasks, limit=limit, task_manager=tm, bootstrap_iters=0, log_samples=True, **kw
  )


@pytest.fixture(scope="module")
def gsm8k_runs(model, offline_tm):
  """The harness on 2 GSM8K-CoT documents with AR and with LoopSpec (batch 2): (results, backend) per method."""
  out = {}
  for name, kw in (("ar", {"method": "ar"}), ("loopspec", LOOPSPEC)):
    lm = backend.LoopSpecLM(model=model, batch_size=2, **kw)
    out[name] = (harness(lm, [GSM8K], offline_tm, gen_kwargs=GEN_KWARGS), lm)
  return out


def backend_stops(model, until) -> list:
  """The stop token sequences the backend decodes with for the stop strings `until` (eos text included)."""
  return stop_seqs.text_stops(until, model.encode, model.decode)


def per_doc(samples) -> list:
  """The harness logs one sample per (document, filter); one per document, by doc_id."""
  return sorted({s["doc_id"]: s for s in samples}.values(), key=lambda s: s["doc_id"])


def context_of(sample) -> str:
  return sample["arguments"][0][0]  # the logged arguments: one (context, gen_kwargs) per request


# ---------------------------------------------------------------------------------------------------
# generate_until
# ---------------------------------------------------------------------------------------------------
def assert_responses_are_decodes(model, samples):
  """Each GSM8K-CoT response is `generate`'s greedy decode of its context (cut to 128 - 16 tokens) with the
  backend's stop sequences, cut at eos and at the stop texts."""
  prompts = [model.encode(context_of(s))[-(model.config.max_len - MAX_NEW) :] for s in samples]
  until = ["Q:", "</s>", "<|im_end|>", "<|endoftext|>"]
  out = loopspec_jax.generate(model, prompts, max_new_tokens=MAX_NEW, eos_id=0, stop=backend_stops(model, until))
  for s, toks in zip(samples, out.tokens):
    toks = toks[: toks.index(0)] if 0 in toks else toks
    assert s["resps"] == [[backend.cut_at_stops(model.decode(toks), until)]]


def test_generate_until_equals_generate(gsm8k_runs, model):
  """The harness's responses are `generate`'s greedy tokens (context cut to 128 - 16), cut at the stop texts."""
  res, _ = gsm8k_runs["ar"]
  samples = per_doc(res["samples"][GSM8K])
  assert len(samples) == 2
  assert_responses_are_decodes(model, samples)


def test_loopspec_accuracy_and_responses_equal_ar(gsm8k_runs, model):
  """Greedy LoopSpec is lossless: the same responses, so the same metrics; its stats show speculation."""
  (ar, ar_lm), (ls, ls_lm) = gsm8k_runs["ar"], gsm8k_runs["loopspec"]
  resps = lambda r: [s["resps"] for s in per_doc(r["samples"][GSM8K])]
  assert resps(ls) == resps(ar)
  assert evaluate.metrics_of(ls, GSM8K) == evaluate.metrics_of(ar, GSM8K)
  assert set(evaluate.metrics_of(ar, GSM8K)) == {"exact_match,strict-match", "exact_match,flexible-extract"}
  a, s = ar_lm.speed_stats(GSM8K), ls_lm.speed_stats(GSM8K)
  assert a["tokens"] == s["tokens"] > 0 and a["requests"] == s["requests"] == 2
  assert a["mean_accepted_length"] == 1.0 and a["commits"]["restart"] == a["tokens"]
  assert sum(s["commits"].values()) == s["tokens"] and s["commits"]["first"] > 0
  assert s["mean_accepted_length"] > 1.0 and s["method"] == "loopspec(d1=2)" and s["greedy"]
  assert ls_lm.speed_stats("another_task") is None


def test_until_ends_the_decode_inside_the_loop(gsm8k_runs, model):
  """A stop string taken from AR's own response ends the decode at its last token, inside the decode loop (the
  per-request token counts stop there, short of the budget), for AR and LoopSpec alike; the response is the
  text before it. The task's other stop strings stay, so the programs of `gsm8k_runs` are reused."""
  samples = per_doc(gsm8k_runs["ar"][0]["samples"][GSM8K])
  contexts, kw = [context_of(s) for s in samples], dict(samples[0]["arguments"][0][1])
  prompts = [model.encode(c)[-(model.config.max_len - MAX_NEW) :] for c in contexts]
  until = list(kw["until"]) + ["<|endoftext|>"]
  free = loopspec_jax.generate(model, prompts, max_new_tokens=MAX_NEW, eos_id=0, stop=backend_stops(model, until))
  free = free.tokens[0]
  assert len(free) == MAX_NEW and 0 not in free  # no stop string in request 0's free decode
  for end in range(4, MAX_NEW):
    text = model.decode(free[end - 2 : end])
    if text.strip() and model.encode(text) == free[end - 2 : end] and text not in model.decode(free[: end - 1]):
      break
  kw["until"] = [text if u == "Q:" else u for u in kw["until"]]
  reqs = [Instance("generate_until", {}, (c, kw), idx=0, metadata=(GSM8K, i, 1)) for i, c in enumerate(contexts)]
  got = {}
  for name, mkw in (("ar", {"method": "ar"}), ("loopspec", LOOPSPEC)):
    lm = backend.LoopSpecLM(model=model, batch_size=2, **mkw)
    got[name] = lm.generate_until(reqs, disable_tqdm=True), lm.calls[-1]["counts"].per_request["tokens"]
  print(f"stop {text!r} = tokens {free[end - 2 : end]} ends request 0 at token {end}: {got['ar']}")
  assert got["ar"] == got["loopspec"]
  assert got["ar"][0][0] == backend.cut_at_stops(model.decode(free[:end]), kw["until"])
  assert end in got["ar"][1] and sum(got["ar"][1]) < 2 * MAX_NEW


@pytest.mark.slow
@pytest.mark.parametrize(
    "kw",
    [dict(method="chain", d1="1", gamma="3", branch="2", tree_nodes="6"), dict(method="lookahead:3,3,3")],
    ids=["chain-tree", "lookahead"],
)
def test_tree_methods_responses_equal_ar(gsm8k_runs, model, offline_tm, kw):
  """The tree methods by name and model arguments (strings, as --model_args gives them): greedy responses equal
  AR's; the stats are the tree verifier's (tau, tokens per verify pass)."""
  lm = backend.LoopSpecLM(model=model, batch_size=2, **kw)
  res = harness(lm, [GSM8K], offline_tm, gen_kwargs=GEN_KWARGS)
  resps = lambda r: [s["resps"] for s in per_doc(r["samples"][GSM8K])]
  assert resps(res) == resps(gsm8k_runs["ar"][0])
  s = lm.speed_stats(GSM8K)
  assert s["tau"] == s["tokens"] / s["rounds"] and s["tokens"] == gsm8k_runs["ar"][1].speed_stats(GSM8K)["tokens"]


def test_tree_methods_by_name_are_validated_before_decoding(model, monkeypatch):
  monkeypatch.setattr(loopspec_jax, "generate", lambda *a, **k: pytest.fail("decoded before validating"))
  lm = backend.LoopSpecLM(model=model, method="chain", d1="1", gamma="3", branch="2", tree_nodes="6")
  assert lm.method.as_tree() == loopspec_jax.TreeSelf(d1=1, gamma=3, branch=2, tree_nodes=6)
  lm = backend.LoopSpecLM(model=model, method="lookahead", window="3", guesses="2")
  assert lm.method == loopspec_jax.Lookahead(window=3, guesses=2)
  with pytest.raises(ValueError, match="1 <= branch"):
    backend.LoopSpecLM(model=model, method="tree", branch="0")
  with pytest.raises(ValueError, match="tree_nodes >= gamma=4"):
    backend.LoopSpecLM(model=model, method="chain:d1=1,gamma=4", branch=2, tree_nodes=3)
  with pytest.raises(ValueError, match="2 <= ngram <= 16"):
    backend.LoopSpecLM(model=model, method="lookahead", ngram="1")


@pytest.mark.slow
def test_sampled_generation_is_reproducible_and_batch_independent(model):
  """do_sample: request ids are stable per (task, doc, repeat), so batching does not change the samples."""
  kw = {"until": ["\n\n"], "max_gen_toks": 8, "do_sample": True, "temperature": 1.0, "top_p": 0.9}
  reqs = [
      Instance("generate_until", {}, ("Question: " + q + "\nAnswer:", kw), idx=0, metadata=("t", i, 1))
      for i, q in enumerate(["How many apples?", "What is 2 + 3?"])
  ]
  both = backend.LoopSpecLM(model=model, batch_size=2, warmup=False).generate_until(reqs, disable_tqdm=True)
  one = backend.LoopSpecLM(model=model, batch_size=1, warmup=False).generate_until(reqs[1:], disable_tqdm=True)
  assert one == both[1:]
  # A task's `repeats` arrive as copies of one Instance: each copy samples anew, the first as the request alone.
  repeats = backend.LoopSpecLM(model=model, batch_size=2, warmup=False).generate_until([reqs[0]] * 2, True)
  assert repeats[0] == both[0] and repeats[1] != repeats[0]


# ---------------------------------------------------------------------------------------------------
# Chat templates, thinking, dtype
# ---------------------------------------------------------------------------------------------------
def bundled_template() -> str:
  from loopspec_jax.checkpoint import native

  return os.path.join(native.bundled_path("tiny-raven"), "chat_template.jinja")


def test_chat_task_runs_through_the_template(gsm8k_runs, model, offline_tm):
  """`apply_chat_template=True` through the harness: every GSM8K-CoT prompt is the bundled play-script template's
  rendering of the 8 shots as chat turns and the question (USER: / ASSISTANT: lines), and the responses are
  the decodes of those prompts (the programs of `gsm8k_runs`: the contexts are cut to the same length)."""
  del gsm8k_runs
  lm = backend.LoopSpecLM(model=model, batch_size=2, chat_template=bundled_template())
  res = harness(lm, [GSM8K], offline_tm, gen_kwargs=GEN_KWARGS, apply_chat_template=True)
  samples = per_doc(res["samples"][GSM8K])
  doc = samples[0]["doc"]
  context = context_of(samples[0])
  print(repr(context[:80]), "...", repr(context[-80:]))
  assert context.startswith("USER:\nQ: ") and context.endswith(f"Q: {doc['question']}\nA:\n\nASSISTANT:\n")
  assert context.count("USER:\n") == 9 and context.count("ASSISTANT:\n") == 9  # 8 shots + the question
  assert_responses_are_decodes(model, samples)
  assert lm.chat_template(True) == open(bundled_template()).read() and lm.chat_template(False) is None


def test_chat_template_thinking_and_continuation(model, tmp_path, caplog):
  """enable_thinking reaches a template that reads it (and a warning names a template that does not);
  add_generation_prompt=False continues the final message; think_end_token keeps the text after the thought;
  a model without a template gets a clear error."""
  (tmp_path / "think.jinja").write_text(
      "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% if enable_thinking %}<think>{% endif %}{% endif %}"
  )
  chat = [{"role": "user", "content": "2 + 3?"}]
  for thinking, tail in ((True, "<assistant><think>"), (False, "<assistant>"), (None, "<assistant>")):
    lm = backend.LoopSpecLM(model=model, chat_template=str(tmp_path / "think.jinja"), enable_thinking=thinking)
    assert lm.apply_chat_template(chat) == "<user>2 + 3?</user>" + tail
  prefix = chat + [{"role": "assistant", "content": "The answer is"}]
  assert lm.apply_chat_template(prefix, add_generation_prompt=False) == "<user>2 + 3?</user><assistant>The answer is"
  with caplog.at_level("WARNING"):
    lm = backend.LoopSpecLM(model=model, chat_template=bundled_template(), enable_thinking="true")
  assert "no enable_thinking variable" in caplog.text and lm.enable_thinking is True
  assert lm.apply_chat_template(chat) == "USER:\n2 + 3?\n\nASSISTANT:\n"
  with pytest.raises(ValueError, match="ships no chat template"):
    backend.LoopSpecLM(model=model).apply_chat_template(chat)
  lm = backend.LoopSpecLM(model=model, think_end_token="</think>", warmup=False)
  lm._generate = lambda prompts, *a, **k: [model.encode("I think. Q: no</think> The answer is 5. Q: next")]
  req = Instance("generate_until", {}, ("Q: 2 + 3?\nA:", {"until": ["Q:"]}), idx=0, metadata=("t", 0, 1))
  assert lm.generate_until([req], disable_tqdm=True) == ["The answer is 5. "]


def test_dtype_option(model):
  """dtype= is the parameter dtype when loading (aliases too); an unknown one is refused before loading."""
  lm = backend.LoopSpecLM(pretrained="tiny-raven", dtype="bf16")
  assert {x.dtype for x in jax.tree_util.tree_leaves(lm.model.params)} == {jnp.dtype("bfloat16")}
  with pytest.raises(ValueError, match="dtype='int8' is not a known parameter dtype"):
    backend.LoopSpecLM(pretrained="tiny-raven", dtype="int8")
  cfg = _eval_cfg("/nonexistent")
  cfg.dtype = "float8"
  with pytest.raises(ValueError, match="float8"):
    evaluate.run_evaluation(cfg, model=model)


# ---------------------------------------------------------------------------------------------------
# loglikelihood, loglikelihood_rolling
# ---------------------------------------------------------------------------------------------------
def _mc_task(tmp_path) -> str:
  """A two-document multiple-choice task (loglikelihood requests) with a local data file."""
  rows = [
      {"question": "ROMEO: What light through yonder window", "choices": [" breaks?", " sleeps."], "label": 0},
      {"question": "Question: 2 + 3 =", "choices": [" 5", " 7", " six"], "label": 0},
  ]
  with open(tmp_path / "mc.jsonl", "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "mc.yaml").write_text(
      "task: test_mc\n"
      f"custom_dataset: !function {offline_tasks.TASKS_DIR.replace(os.sep, '/')}/utils.load_local\n"
      f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'mc.jsonl'}\n"
      "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{question}}'\n"
      "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\n"
      "metric_list:\n  - metric: acc\n"
  )
  return "test_mc"


def log_softmax(logits) -> np.ndarray:
  x = np.asarray(logits, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _direct_loglikelihood(model, context: str, continuation: str, depth: int, pad_token=None) -> tuple:
  """log p(continuation | context) from `readouts` at `depth`, the harness's causal pair encoding."""
  whole, ctx = model.encode(context + continuation), model.encode(context)
  cont = whole[len(ctx) :]
  seq = ctx + cont[:-1]
  if pad_token is not None:  # a different padding than the backend's (eos): causal attention must ignore it
    seq = seq + [pad_token] * (32 - len(seq))
  logp = log_softmax(loopspec_jax.readouts(model, seq, depths=[depth])[0])
  rows = logp[len(ctx) - 1 : len(ctx) - 1 + len(cont)]
  return float(rows[np.arange(len(cont)), cont].sum()), bool((rows.argmax(-1) == np.asarray(cont)).all())


def test_loglikelihood_equals_readouts(model, tmp_path):
  """Multiple choice through the harness: every choice's log-likelihood is the readouts-based sum (full depth,
  and depth 2 with `depth=2`), whatever the padding; the unpadded forward agrees too."""
  task = _mc_task(tmp_path)
  tm = TaskManager(include_path=str(tmp_path), include_defaults=False)
  r = model.config.recurrence
  by_depth = {}
  for depth in (None, 2):
    lm = backend.LoopSpecLM(model=model, depth=depth)
    res = harness(lm, [task], tm)
    samples = per_doc(res["samples"][task])
    got = []
    for s in samples:
      for i, resp in enumerate(s["resps"]):
        ctx, cont = s["arguments"][i]
        ll, greedy = resp[0]
        want = _direct_loglikelihood(model, ctx, cont, depth or r, pad_token=7)
        np.testing.assert_allclose(ll, want[0], rtol=1e-5, atol=1e-4)
        assert greedy == want[1]
        got.append(ll)
    by_depth[depth] = got
    assert 0.0 <= res["results"][task]["acc,none"] <= 1.0
  assert not np.allclose(by_depth[None], by_depth[2])  # depth 2 is a different readout
  # One request against the unpadded forward (its own compiled length).
  lm = backend.LoopSpecLM(model=model)
  ctx, cont = "Question: 2 + 3 =", " 5"
  ((ll, greedy),) = lm.loglikelihood([Instance("loglikelihood", {}, (ctx, cont), idx=0)], disable_tqdm=True)
  want = _direct_loglikelihood(model, ctx, cont, r)
  np.testing.assert_allclose(ll, want[0], rtol=1e-5, atol=1e-4)
  assert greedy == want[1]


def test_loglikelihood_rolling_equals_readouts(model, offline_tm):
  """Held-out Shakespeare perplexity: each document's rolling log-likelihood is the sum over the harness's
  disjoint windows of readouts-based log-probabilities, and the harness turns it into perplexities."""
  from lm_eval import utils as lm_utils

  lm = backend.LoopSpecLM(model=model)
  res = harness(lm, ["loopspec_shakespeare"], offline_tm, limit=1)
  (sample,) = res["samples"]["loopspec_shakespeare"]
  text = sample["arguments"][0][0]
  tokens = model.encode(text)
  assert len(tokens) > 2 * model.config.max_len  # several windows
  want = 0.0
  for ctx, cont in map(
      lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(tokens, 0, model.config.max_len, 1)
  ):
    seq = ctx + cont[:-1]
    padded = seq + [5] * (model.config.max_len - len(seq))  # another padding than the backend's
    logp = log_softmax(loopspec_jax.readouts(model, padded, depths=[model.config.recurrence])[0, : len(seq)])
    want += logp[np.arange(len(seq) - len(cont), len(seq)), cont].sum()
  np.testing.assert_allclose(sample["resps"][0][0], want, rtol=1e-6)
  metrics = res["results"]["loopspec_shakespeare"]
  assert metrics["word_perplexity,none"] > 1.0 and metrics["bits_per_byte,none"] > 0.0


# ---------------------------------------------------------------------------------------------------
# loopspec-evaluate: rows, table, resume
# ---------------------------------------------------------------------------------------------------
def _eval_cfg(out_dir):
  cfg = eval_config.get_config()
  cfg.model = "test-huginn"
  cfg.tasks = GSM8K
  cfg.methods = "ar;loopspec:d1=2"
  cfg.limit = 2
  cfg.gen_kwargs = GEN_KWARGS
  cfg.batch_size = 2
  cfg.bootstrap_iters = 0
  cfg.progress = False
  cfg.out_dir = str(out_dir)
  return cfg


def test_evaluate_writes_rows_and_resumes_after_a_kill(model, tmp_path, gsm8k_runs, capsys):
  """A run stopped after its first row (and a torn line) resumes: one row per (task, method), none twice, the
  first kept as written; rows hold the harness's results JSON and the speed statistics; the table compares."""
  del gsm8k_runs  # compiled the programs this test reuses
  cfg = _eval_cfg(tmp_path)
  cfg.stop_after = 1
  with pytest.raises(evaluate.EvaluationInterrupted):
    evaluate.run_evaluation(cfg, model=model)
  jsonl = tmp_path / "eval.jsonl"
  first = [json.loads(l) for l in jsonl.read_text().splitlines()]
  assert [r["method"] for r in first] == ["ar"]
  with open(jsonl, "a") as f:
    f.write('{"key": "torn')  # a writer killed mid-line
  cfg.stop_after = None
  capsys.readouterr()
  res = evaluate.run_evaluation(cfg, model=model)
  assert res["new_rows"] == 1
  assert f"resuming: 1 row(s) already in {jsonl}, skipped: {GSM8K} / ar" in capsys.readouterr().out
  rows = [json.loads(l) for l in jsonl.read_text().splitlines()]
  assert [r["method"] for r in rows] == ["ar", "loopspec(d1=2)"]
  assert rows[0] == first[0]
  assert evaluate.run_evaluation(cfg, model=model)["new_rows"] == 0  # nothing left to do
  ar, ls = res["rows"]
  for r in (ar, ls):
    assert r["lm_eval"]["results"][GSM8K]["alias"] == GSM8K and r["lm_eval"]["n-samples"][GSM8K]["effective"] == 2
    assert r["metric"] == "exact_match,strict-match" and r["docs"] == 2
    assert r["speed"]["tokens"] > 0 and r["speed"]["decode_seconds"] > 0
    assert os.path.exists(tmp_path / "samples" / f"{GSM8K}__{r['method']}.jsonl")
  assert ls["accuracy"] == ar["accuracy"] and ls["metrics"] == ar["metrics"]
  assert ls["identical_to_ar"] and ar["ratio_vs_ar"] == 1.0 and ls["ratio_vs_ar"] > 0
  assert ls["speed"]["mean_accepted_length"] > 1.0
  lines = res["table"].splitlines()
  assert lines[0].startswith("| model | task | shots | method | metric | accuracy | tok/s | ratio vs AR | mean acc.")
  assert ar["n_shot"] == ar["lm_eval"]["n-shot"][GSM8K] and ar["prompt_cut"]["prompts"] == 2
  assert f"| {evaluate.shots_label(ar)} | ar |" in lines[2]
  assert len(lines) == 4 and "| loopspec(d1=2) |" in lines[3] and "| yes |" in lines[3]
  assert (tmp_path / "eval.md").read_text().strip() == res["table"]


def test_evaluate_cli_parses_config(tmp_path, monkeypatch):
  """`loopspec-evaluate --config=eval/default.py:quick --config.<field>=...` reaches run_evaluation."""
  seen = []

  def fake_run(cfg):
    seen.append(cfg)
    return {"table": "| table |"}

  monkeypatch.setattr(evaluate, "run_evaluation", fake_run)
  argv = ["prog", "--config=eval/default.py:quick", f"--config.out_dir={tmp_path}", "--config.limit=3"]
  saved = sys.argv
  try:
    evaluate.main(common.parse_flags(evaluate.FLAGS, argv))
  finally:
    sys.argv = saved
    flags.FLAGS.unparse_flags()
    logging.set_verbosity(logging.WARNING)
  (cfg,) = seen
  assert (cfg.tasks, cfg.limit, cfg.out_dir, cfg.methods) == (GSM8K, 3, str(tmp_path), "ar;loopspec:d1=2,d2=8")


# ---------------------------------------------------------------------------------------------------
# Errors before anything compiles
# ---------------------------------------------------------------------------------------------------
def test_bad_input_is_rejected_before_decoding(model, monkeypatch):
  def no_decode(*a, **k):
    raise AssertionError("decoded before validating")

  monkeypatch.setattr(loopspec_jax, "generate", no_decode)
  with pytest.raises(ValueError, match="unknown model argument"):
    backend.LoopSpecLM(model=model, num_beams=4)
  with pytest.raises(ValueError):
    backend.LoopSpecLM(model=model, method="loopspec", d1=3)  # 3 does not divide R = 8
  with pytest.raises(ValueError, match="takes no"):
    backend.LoopSpecLM(model=model, method="ar", d1=2)
  with pytest.raises(ValueError, match="max_gen_toks"):
    backend.LoopSpecLM(model=model, max_gen_toks=128)
  lm = backend.LoopSpecLM(model=model)
  req = lambda kw: Instance("generate_until", {}, ("Hello", kw), idx=0, metadata=("t", 0, 1))
  with pytest.raises(ValueError, match="unsupported generation kwargs"):
    lm.generate_until([req({"until": ["\n"], "num_beams": 2})], disable_tqdm=True)
  with pytest.raises(ValueError, match="max_gen_toks"):
    lm.generate_until([req({"until": ["\n"], "max_gen_toks": 1024})], disable_tqdm=True)
  with pytest.raises(ValueError, match="top_p"):
    lm.generate_until([req({"do_sample": True, "top_p": 0.0})], disable_tqdm=True)
  cfg = eval_config.get_config("bundled")
  cfg.allow_code_execution = False
  with pytest.raises(ValueError, match="allow_code_execution"):
    evaluate.check_config(cfg)
  cfg = eval_config.get_config()
  cfg.methods = "ar;beam:k=2"
  with pytest.raises(ValueError, match="unknown method"):
    evaluate.check_config(cfg)


# ---------------------------------------------------------------------------------------------------
# The offline task definitions, scored with oracle answers (no model)
# ---------------------------------------------------------------------------------------------------
class OracleLM(LM):
  """Answers every generation request with the document's reference answer in the task's expected format."""

  def generate_until(self, requests, disable_tqdm=False):
    out = []
    for req in requests:
      doc = req.doc
      if "question" in doc:  # GSM8K-CoT
        out.append(f" Some reasoning. The answer is {doc['answer'].split('####')[-1].strip()}.\n\n")
      elif "problem" in doc:  # MATH-500 (minerva)
        out.append(f" Work.\nFinal Answer: The final answer is ${doc['answer']}$. I hope it is correct.\n")
      elif "canonical_solution" in doc:  # HumanEval
        out.append(doc["canonical_solution"])
      else:  # MBPP
        out.append(doc["code"] + "\n")
    return out

  def loglikelihood(self, requests, disable_tqdm=False):
    raise NotImplementedError

  def loglikelihood_rolling(self, requests, disable_tqdm=False):
    raise NotImplementedError


def test_offline_tasks_score_oracle_answers(offline_tm, monkeypatch):
  """Every offline generation task loads from the package's files (full sizes) and gives the reference answers
  full marks through the harness's own filters and metrics; code runs only with both opt-ins."""
  monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
  names = ["loopspec_gsm8k_cot", "loopspec_minerva_math500", "loopspec_humaneval", "loopspec_mbpp"]
  assert set(offline_tasks.OFFLINE_TASKS) <= set(offline_tm.all_tasks)
  res = lm_eval.simple_evaluate(
      model=OracleLM(),
      tasks=names,
      limit=4,
      task_manager=offline_tm,
      bootstrap_iters=0,
      confirm_run_unsafe_code=True,
  )
  assert evaluate.expand_tags(offline_tm, [offline_tasks.OFFLINE_TAG, "loopspec_mbpp"]) == sorted(names)
  sizes = {t: res["n-samples"][t]["original"] for t in names}
  assert sizes == {
      "loopspec_gsm8k_cot": 1319,
      "loopspec_minerva_math500": 500,
      "loopspec_humaneval": 164,
      "loopspec_mbpp": 257,
  }
  got = {t: evaluate.metrics_of(res, t) for t in names}
  assert got["loopspec_gsm8k_cot"]["exact_match,strict-match"] == 1.0
  assert got["loopspec_minerva_math500"]["exact_match,none"] == 1.0
  assert got["loopspec_humaneval"]["pass_at_1,create_test"] == 1.0
  assert got["loopspec_mbpp"]["pass_at_1,none"] == 1.0
  with pytest.raises(ValueError, match="unsafe"):
    lm_eval.simple_evaluate(model=OracleLM(), tasks=["loopspec_mbpp"], limit=1, task_manager=offline_tm)
  monkeypatch.delenv("HF_ALLOW_CODE_EVAL")
  with pytest.raises(RuntimeError, match="HF_ALLOW_CODE_EVAL"):
    lm_eval.simple_evaluate(
        model=OracleLM(), tasks=["loopspec_mbpp"], limit=1, task_manager=offline_tm, confirm_run_unsafe_code=True
    )


def test_code_metric_fails_wrong_and_hanging_programs(monkeypatch):
  from loopspec_jax.tasks import utils

  monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
  ref = "assert add(2, 3) == 5"
  chex.assert_trees_all_close(
      utils.pass_at_k([ref, ref, ref], [["def add(a, b): return a + b"], ["def add(a, b): return a * b"], ["x ="]]),
      {"pass@1": 1 / 3},
  )
  monkeypatch.setattr(utils, "CODE_TIMEOUT_S", 1.0)
  assert not utils.run_program("while True: pass", timeout=1.0)
  assert utils.estimate_pass_at_k(5, 2, 1) == pytest.approx(0.4)


def test_math_answer_extraction():
  from loopspec_jax.tasks import utils

  assert utils.get_unnormalized_answer("x\nFinal Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.")
  assert utils.normalize_final_answer("$\\frac12$") == "\\frac{1}{2}"
  assert utils.normalize_final_answer("10,000 dollars") == "10000"
  assert utils.normalize_final_answer("(0,1)") == "(0,1)"
  assert utils.remove_boxed(utils.last_boxed_only_string("so $\\boxed{\\frac{3}{4}}$.")) == "\\frac{3}{4}"
  assert utils.math_process_results(
      {"answer": "24"}, ["Final Answer: The final answer is $24$. I hope it is correct."]
  ) == {"exact_match": 1}


@pytest.mark.slow
def test_bundled_tiny_raven_evaluates_with_every_method(tmp_path):
  """The bundled tiny-raven through loopspec-evaluate: AR, chain and LoopSpec score the same and LoopSpec's
  mean accepted length is well above 1 (its depth-2 drafts agree with depth 32 most of the time)."""
  cfg = eval_config.get_config("quick")
  cfg.methods = "ar;chain:d1=2,gamma=8;loopspec:d1=2,d2=8"
  cfg.tasks = "loopspec_gsm8k_cot,loopspec_minerva_math500"
  cfg.out_dir = str(tmp_path)
  cfg.progress = False
  res = evaluate.run_evaluation(cfg)
  for task in ("loopspec_gsm8k_cot", "loopspec_minerva_math500"):
    rows = [r for r in res["rows"] if r["task"] == task]
    assert len(rows) == 3 and all(r["identical_to_ar"] for r in rows)
    assert len({json.dumps(r["metrics"]) for r in rows}) == 1
    assert rows[2]["speed"]["mean_accepted_length"] > 4.0


# ---------------------------------------------------------------------------------------------------
# The head methods (medusa, eagle, mtp) by name: the head as a directory string, as --model_args gives it
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def head_dirs(model, tmp_path_factory):
  """{kind: the directory of a randomly initialised head of that kind for `model`}."""
  import head_helpers

  from loopspec_jax.heads import artefact

  root = tmp_path_factory.mktemp("heads")
  out = {}
  for kind in head_helpers.KINDS:
    out[kind] = str(root / kind)
    artefact.save(out[kind], head_helpers.random_heads(kind, model))
  return out


def _head_args(kind, head_dirs) -> dict:
  import head_helpers

  return dict(method=kind, heads=head_dirs[kind], **{k: str(v) for k, v in head_helpers.ENVELOPES[kind].items()})


def test_head_methods_by_name_are_validated_before_decoding(model, head_dirs, monkeypatch):
  monkeypatch.setattr(loopspec_jax, "generate", lambda *a, **k: pytest.fail("decoded before validating"))
  for kind in ("medusa", "eagle", "mtp"):
    lm = backend.LoopSpecLM(model=model, **_head_args(kind, head_dirs))
    assert lm.method.name == kind and lm.method.heads.source == head_dirs[kind]
    assert lm.method.spec.startswith(f"{kind}:heads={head_dirs[kind]},")
  with pytest.raises(ValueError, match="needs heads="):
    backend.LoopSpecLM(model=model, method="medusa")
  with pytest.raises(ValueError, match="needs an 'eagle' head"):
    backend.LoopSpecLM(model=model, method="eagle", heads=head_dirs["mtp"])
  other = helpers.tokenized_model("huginn:tiny", contraction=0.7, max_len=128, hidden_size=64)  # another target
  with pytest.raises(ValueError, match="medusa heads have hidden_size 32, the model 64"):
    backend.LoopSpecLM(model=other, method="medusa", heads=head_dirs["medusa"])
  with pytest.raises(ValueError, match=r"another target \(hidden_size: head 32, model 64"):
    backend.LoopSpecLM(model=other, method="mtp", heads=head_dirs["mtp"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["medusa", "eagle", "mtp"])
def test_head_methods_responses_equal_ar(gsm8k_runs, model, offline_tm, head_dirs, kind):
  """Greedy GSM8K-CoT responses of the head methods by name equal AR's; their stats are the tree verifier's."""
  lm = backend.LoopSpecLM(model=model, batch_size=2, **_head_args(kind, head_dirs))
  res = harness(lm, [GSM8K], offline_tm, gen_kwargs=GEN_KWARGS)
  resps = lambda r: [s["resps"] for s in per_doc(r["samples"][GSM8K])]
  assert resps(res) == resps(gsm8k_runs["ar"][0])
  s = lm.speed_stats(GSM8K)
  assert s["tau"] == s["tokens"] / s["rounds"] and s["tokens"] == gsm8k_runs["ar"][1].speed_stats(GSM8K)["tokens"]
