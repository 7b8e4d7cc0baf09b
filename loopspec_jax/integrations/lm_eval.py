"""lm-evaluation-harness backend: model `loopspec_jax` (lm-eval 0.4.13, `pip install ".[eval]"`).

Importing this module registers `LoopSpecLM` with the harness under the name "loopspec_jax", so

  import lm_eval, loopspec_jax.integrations.lm_eval
  from loopspec_jax.tasks import TASKS_DIR
  lm_eval.simple_evaluate(model="loopspec_jax", model_args="pretrained=tiny-raven,method=loopspec,d1=2,d2=8",
                          tasks=["loopspec_gsm8k_cot"], limit=8,
                          task_manager=lm_eval.tasks.TaskManager(include_path=TASKS_DIR))

scores a looped model with any decoding method. The harness's command line does not import outside backends;
`python -m loopspec_jax.integrations.lm_eval <lm_eval arguments>` is that command line with this backend
registered and the offline tasks of `loopspec_jax/tasks/` on the include path.

Request types:
- `generate_until`: requests are grouped by (task, generation kwargs) and decoded `batch_size` at a time through
  `loopspec_jax.generate` with the model arguments' method (`ar`, `chain` with d1/gamma, `loopspec` with
  d1/d2/lane_capacity); every lossless method returns AR's tokens under greedy decoding, so task accuracy is the
  same for every method. A decode stops inside the decode loop at `max_gen_toks`, the end-of-sequence token or
  a stop sequence (`until`): each stop string becomes token sequences (its encoding, and its encoding after a
  space: `decoding.stops.text_stops`), and a request ends at the first committed token that completes one,
  also in the middle of a speculative commit, so tokens and time are measured on the text the harness scores
  (as the release's decoding stops). The text is then cut at the first stop string (`cut_at_stops`), as the
  harness's other backends return it: exact whatever the tokenisation (a stop string the model spells with
  other tokens only does not end the decode early). With `think_end_token`, the response is the text after
  the thinking trace, as the harness's HF backend returns it. Contexts are cut from the left to the model's
  context minus `max_gen_toks`. Each request gets a stable request id (task, document, repeat), so sampled
  outputs do not depend on batching.
- `apply_chat_template` (the harness's `--apply_chat_template`): the checkpoint's chat template (serving/chat.py;
  the bundled models ship one), with `enable_thinking` passed when given.
- `loglikelihood` / `loglikelihood_rolling`: log-probabilities of the readout at depth `depth` (default: the
  full depth R) from `loopspec_jax.readouts`, one forward per request, padded on the right to a power-of-two
  length (causal attention: the padding changes no scored position) so that a few programs compile.

Speed statistics of every generate call (tokens, decode seconds, mean accepted length, commit sources) are kept
per task (`speed_stats`). With `warmup=True` (the default) the first call of every compiled shape runs twice and
only the second is timed, so tokens/s excludes compilation.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import sys
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

import loopspec_jax
from loopspec_jax import api
from loopspec_jax import methods
from loopspec_jax.decoding import common as decoding
from loopspec_jax.decoding import stops as stop_seqs
from loopspec_jax.decoding.stats import DecodeStats
from loopspec_jax.serving import chat
from loopspec_jax.tasks import TASKS_DIR

NAME = "loopspec_jax"
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_p", "top_k")
# the `dtype` model argument: parameter dtypes by name and alias
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16"}
DTYPES["fp16"] = "float16"
_MIN_PAD = 32

log = logging.getLogger(__name__)

# Shapes whose decode programs this process has compiled: (config, method, method args, greedy, init state,
# batch, prompt bucket, total bucket, stop table shape). jit caches are per process, so this set is too.
_COMPILED = set()


def _parse_none(v):
  """Model-argument values: 'none' / '' (and None) mean absent; lm-eval already turns digits into ints."""
  if v is None or (isinstance(v, str) and v.strip().lower() in ("none", "")):
    return None
  return v


def _opt_bool(name: str, v) -> Optional[bool]:
  v = _parse_none(v)
  if v is None or isinstance(v, bool):
    return v
  if str(v).strip().lower() in ("true", "1", "yes"):
    return True
  if str(v).strip().lower() in ("false", "0", "no"):
    return False
  raise ValueError(f"model argument {name}={v!r} is not true, false or 'none'")


def check_dtype(dtype) -> str:
  """The parameter dtype a model argument names (float32, bfloat16, float16; fp32 / bf16 / fp16 too)."""
  name = str(dtype).strip().lower()
  if name not in DTYPES:
    raise ValueError(f"dtype={dtype!r} is not a known parameter dtype; use one of float32, bfloat16, float16")
  return DTYPES[name]


def _opt_int(name: str, v) -> Optional[int]:
  v = _parse_none(v)
  if v is None:
    return None
  try:
    return int(v)
  except (TypeError, ValueError) as e:
    raise ValueError(f"model argument {name}={v!r} is not an integer or 'none'") from e


def _pad_length(n: int, max_len: int) -> int:
  """The power-of-two length (at least _MIN_PAD, at most the context) a readout of n tokens is padded to."""
  p = _MIN_PAD
  while p < n:
    p *= 2
  return min(p, max_len)


def _log_softmax(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.float64)
  m = x.max(axis=-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def cut_at_stops(text: str, until: Sequence[str]) -> str:
  """`text` up to the earliest occurrence of any stop sequence (empty sequences ignored)."""
  cut = len(text)
  for s in until:
    if s:
      i = text.find(s)
      if i != -1:
        cut = min(cut, i)
  return text[:cut]


@register_model(NAME)
class LoopSpecLM(TemplateLM):
  """A looped model decoded by `loopspec_jax.generate` and scored by `loopspec_jax.readouts`.

  Model arguments (`--model_args k=v,...`; `none` spells an absent value):
    pretrained     bundled model name (`tiny-raven`, `tiny-ouro`), HF checkpoint dir or `loopspec_jax.save` dir
    model          a loaded `LoopedModel` instead (Python only; `pretrained` is then ignored)
    tokenizer      a tokenizer.json path or bundled model name, for checkpoints without a tokenizer
    dtype          parameter dtype when loading: float32 (default), bfloat16 or float16 (fp32 / bf16 / fp16)
    method         a method name or spec of `loopspec_jax.methods` ('ar' (default), 'chain', 'loopspec:2,8',
                   or in Python a `Method` object,
                   'lookup', ...); d1, d2, gamma, lane_capacity and any other argument of that method may
                   also be given as model arguments
    batch_size     requests per generate call (default 1: one request at a time, as the paper measures)
    max_gen_toks   new-token budget of tasks that do not set one (default 256, at most half the context)
    depth          readout depth of loglikelihood requests (default R, the full depth)
    seed           base seed of sampled decoding (default 0)
    init_state     'zeros' (default) or 'random' (Raven models: the release's per-lane random initial state)
    warmup         time only compiled calls (default true; see the module docstring)
    chat_template  a Jinja file or template text for `apply_chat_template` (default: the one the checkpoint
                   ships, serving/chat.py: the bundled models' chat_template.jinja)
    enable_thinking  passed to the chat template as `enable_thinking` (default: not passed)
    think_end_token  text ending a thinking trace: a response is the text after its last occurrence
  """

  def __init__(
      self,
      pretrained: str = "tiny-raven",
      *,
      model=None,
      tokenizer=None,
      dtype: str = "float32",
      method="ar",
      d1=None,
      d2=None,
      gamma=None,
      lane_capacity=None,
      batch_size=1,
      max_gen_toks=None,
      depth=None,
      seed: int = 0,
      init_state: str = "zeros",
      warmup: bool = True,
      chat_template=None,
      enable_thinking=None,
      think_end_token=None,
      max_batch_size=None,
      device=None,
      **unknown,
  ):
    super().__init__()
    given = {"d1": d1, "d2": d2, "gamma": gamma, "lane_capacity": lane_capacity}
    extra = {k: v for k, v in unknown.items() if k in methods.argument_names(method)}
    unknown = {k: v for k, v in unknown.items() if k not in extra}
    if unknown:
      raise ValueError(
          f"unknown model argument(s) {sorted(unknown)} for {NAME}; known: pretrained, tokenizer, dtype, method "
          "(and its arguments), batch_size, max_gen_toks, depth, seed, init_state, warmup, chat_template, "
          "enable_thinking, think_end_token"
      )
    dtype = check_dtype(dtype)
    del max_batch_size  # the harness's automatic batch sizing does not apply: batches are static shapes here
    # "cuda:0" is the harness CLI's default (`lm_eval --device`), given on every run: only another device
    # string was asked for, and it is the one this backend cannot honour (JAX picks its default backend)
    if device not in (None, "", "cpu", "cuda", "cuda:0", "tpu", "jax"):
      log.warning("device=%r ignored: JAX places the model on its default backend", device)
    if model is None:
      model = loopspec_jax.load(str(pretrained), dtype=str(dtype))
    if tokenizer is not None:
      model = _with_tokenizer(model, str(tokenizer))
    if model.tokenizer is None:
      raise ValueError(f"{pretrained!r} has no tokenizer; pass tokenizer=<tokenizer.json or bundled model name>")
    self.model = model
    self.cfg = model.config
    # The method, its arguments and depths are validated now, before any request compiles anything.
    args = {k: methods.parse_value(str(v)) if isinstance(v, str) else v for k, v in {**given, **extra}.items()}
    self.method = methods.build_checked(method, model, **args)
    if isinstance(batch_size, str) and batch_size.startswith("auto"):
      log.warning("batch_size=%r: automatic batch sizing is not supported, using 1", batch_size)
      batch_size = 1
    self.batch_size = _opt_int("batch_size", batch_size) or 1
    if self.batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
    self.max_gen_toks = _opt_int("max_gen_toks", max_gen_toks) or min(256, self.cfg.max_len // 2)
    self._check_budget(self.max_gen_toks)
    self.depth = _opt_int("depth", depth) or self.cfg.recurrence
    if self.depth < 1:
      raise ValueError(f"depth must be >= 1, got {self.depth}")
    self.seed = int(seed)
    decoding.validate_sampling(0.0, 0, 1.0, init_state, self.cfg)
    self.init_state = str(init_state)
    self.warmup = bool(warmup)
    eos = self.cfg.eos_id
    if eos is None:
      eos = model.tokenizer.token_to_id("<|endoftext|>")
    if eos is None:
      raise ValueError("the model config names no eos_id and the tokenizer has no <|endoftext|>")
    self._eos = int(eos)
    self.enable_thinking = _opt_bool("enable_thinking", enable_thinking)
    self.think_end_token = _parse_none(think_end_token)
    self._chat = chat.load(model, _parse_none(chat_template))  # None: the checkpoint ships no template
    if self.enable_thinking is not None and self._chat is not None and "enable_thinking" not in self._chat.variables:
      log.warning("enable_thinking=%s: the chat template has no enable_thinking variable", self.enable_thinking)
    self.calls: List[dict] = []  # one entry per timed generate call: task, requests, stats

  # ---------------------------------------------------------------------------------------------------
  # What the harness asks of a TemplateLM
  # ---------------------------------------------------------------------------------------------------
  @property
  def eot_token_id(self) -> int:
    return self._eos

  @property
  def max_length(self) -> int:
    return self.cfg.max_len

  @property
  def tokenizer_name(self) -> str:
    return f"{NAME}:{self.model.source or self.cfg.family}"

  def chat_template(self, chat_template=False) -> Optional[str]:
    """The Jinja source of the chat template (logged by the harness); None when chat templates are off."""
    if not chat_template:
      return None
    return self._template().source

  def apply_chat_template(self, chat_history: List[Dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The prompt text of a chat history (the harness's `apply_chat_template=True`), through the template the
    checkpoint ships (serving/chat.py) with `enable_thinking` when given. add_generation_prompt=False continues
    the final (assistant) message, as HF's continue_final_message; a template that refuses a system message
    is retried without it, as the harness's HF backend does."""
    import jinja2

    template = self._template()
    variables = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
    try:
      text = template.render(chat_history, add_generation_prompt, **variables)
    except jinja2.TemplateError:
      log.warning("the chat template failed; retrying without the system message")
      chat_history = [m for m in chat_history if m["role"] != "system"]
      text = template.render(chat_history, add_generation_prompt, **variables)
    return text if add_generation_prompt else _continue_final(text, chat_history[-1]["content"])

  def _template(self) -> chat.ChatTemplate:
    if self._chat is None:
      raise ValueError(
          f"{self.model.source or self.cfg.family!r} ships no chat template; give the model argument "
          "chat_template=<Jinja file or template text>, or run without apply_chat_template"
      )
    return self._chat

  @property
  def method_label(self) -> str:
    return self.method.label

  def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> List[int]:
    del add_special_tokens, kwargs
    return self.model.encode(string)

  def tok_decode(self, tokens) -> str:
    return self.model.decode(tokens)

  def get_model_info(self) -> dict:
    """Added to the harness's results["config"]."""
    return {
        "loopspec_model": self.model.source or self.cfg.family,
        "family": self.cfg.family,
        "recurrence": self.cfg.recurrence,
        "method": self.method_label,
        "loglikelihood_depth": self.depth,
        "gen_batch_size": self.batch_size,
    }

  # ---------------------------------------------------------------------------------------------------
  # generate_until
  # ---------------------------------------------------------------------------------------------------
  def _check_budget(self, max_new: int):
    if not 1 <= max_new < self.cfg.max_len:
      raise ValueError(
          f"max_gen_toks={max_new} leaves no room for a prompt in the model's context of {self.cfg.max_len} "
          "tokens; lower it (model argument max_gen_toks, or the harness's gen_kwargs max_gen_toks=N)"
      )

  def _sampling(self, kw: dict) -> Tuple[List[str], int, dict]:
    """(stop sequences, budget, generate's sampling arguments) of one request's generation kwargs."""
    unknown = sorted(set(kw) - set(GEN_KWARGS))
    if unknown:
      raise ValueError(f"unsupported generation kwargs {unknown}; {NAME} takes {list(GEN_KWARGS)}")
    until = kw.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    eos_text = self.tok_decode([self._eos])
    if eos_text and eos_text not in until:
      until.append(eos_text)
    max_new = int(kw.get("max_gen_toks") or self.max_gen_toks)
    self._check_budget(max_new)
    temperature = float(kw.get("temperature", 0.0) or 0.0)
    do_sample = bool(kw.get("do_sample", temperature > 0.0))
    if do_sample and "temperature" not in kw:
      temperature = 1.0
    if not do_sample:
      temperature = 0.0  # as HF generate: do_sample=False is greedy whatever the temperature
    top_p = 1.0 if kw.get("top_p") is None else float(kw["top_p"])
    sampling = {"temperature": temperature, "top_k": int(kw.get("top_k") or 0), "top_p": top_p}
    decoding.validate_sampling(sampling["temperature"], sampling["top_k"], sampling["top_p"], self.init_state, self.cfg)
    return until, max_new, sampling

  def generate_until(self, requests, disable_tqdm: bool = False) -> List[str]:
    """Decodes every request (see the module docstring); returns the texts cut at the stop sequences."""
    groups: Dict[tuple, list] = {}
    copies = collections.Counter()  # the harness passes a task's `repeats` as copies of one Instance
    for i, req in enumerate(requests):
      context, kw = req.args
      task = getattr(req, "task_name", None)
      key = (task, json.dumps(kw, sort_keys=True, default=str))
      rid = _request_id(task, req, context, copies[id(req)])
      copies[id(req)] += 1
      groups.setdefault(key, []).append((i, rid, context, dict(kw)))
    plans = []
    for (task, _), items in groups.items():
      until, max_new, sampling = self._sampling(items[0][3])  # every error is raised before any decode
      sampling["stop"] = stop_seqs.text_stops(until, self.tok_encode, self.tok_decode) or None
      plans.append((task, items, until, max_new, sampling))
    out: List[Optional[str]] = [None] * len(requests)
    bar = tqdm(total=len(requests), desc=f"{NAME} generate ({self.method_label})", disable=disable_tqdm)
    for task, items, until, max_new, sampling in plans:
      keep = self.cfg.max_len - max_new
      enc = []
      for i, rid, context, kw in items:
        ids = self.tok_encode(context) or [self._eos]
        enc.append((i, rid, context, kw, ids[-keep:]))
      enc.sort(key=lambda e: -len(e[4]))  # similar lengths share a batch and its compiled bucket
      for start in range(0, len(enc), self.batch_size):
        chunk = enc[start : start + self.batch_size]
        rids = [e[1] for e in chunk]
        tokens = self._generate([e[4] for e in chunk], max_new, sampling, rids, task)
        for (i, _, context, kw, _), toks in zip(chunk, tokens):
          if self._eos in toks:
            toks = toks[: toks.index(self._eos)]
          text = self.tok_decode(toks)
          if self.think_end_token:  # the response after the thinking trace (the harness's HF backend)
            text = text.split(self.think_end_token)[-1].lstrip()
          text = cut_at_stops(text, until)
          out[i] = text
          self.cache_hook.add_partial("generate_until", (context, kw), text)
        bar.update(len(chunk))
    bar.close()
    return out

  def _generate(self, prompts: List[List[int]], max_new: int, sampling: dict, request_ids, task) -> List[List[int]]:
    """One `generate` call (after an untimed twin when its shape is new and warmup is on); records its stats."""
    kw = dict(
        max_new_tokens=max_new,
        method=self.method,
        seed=self.seed,
        eos_id=self._eos,
        init_state=self.init_state,
        request_ids=request_ids,
        **sampling,
    )
    tp, total = decoding.buckets([len(p) for p in prompts], max_new, self.cfg)
    table = stop_seqs.stop_table(sampling["stop"])
    shape = (
        self.cfg,
        self.method.label,
        sampling["temperature"] == 0.0,
        self.init_state,
        len(prompts),
        tp,
        total,
        None if table is None else table.shape,
    )
    warm = 0
    if self.warmup and shape not in _COMPILED:
      loopspec_jax.generate(self.model, prompts, **kw)
      warm = 1
    _COMPILED.add(shape)
    res = loopspec_jax.generate(self.model, prompts, **kw)
    greedy = sampling["temperature"] == 0.0
    self.calls.append(
        {
            "task": task,
            "requests": len(prompts),
            "warmup_calls": warm,
            "greedy": greedy,
            "counts": res.counts,
            "plan": res.stats.get("plan", {}).get("choice"),
        }  # method 'auto': what the planner picked
    )
    return res.tokens

  # ---------------------------------------------------------------------------------------------------
  # loglikelihood, loglikelihood_rolling
  # ---------------------------------------------------------------------------------------------------
  def logprobs(self, ids: Sequence[int]) -> np.ndarray:
    """float64 log-probabilities [T, V] of the next token after each position of `ids`, at depth `self.depth`."""
    ids = [int(t) for t in ids]
    n = len(ids)
    if not 1 <= n <= self.cfg.max_len:
      raise ValueError(f"a scored sequence must hold 1..{self.cfg.max_len} tokens, got {n}")
    padded = ids + [self._eos] * (_pad_length(n, self.cfg.max_len) - n)
    logits = loopspec_jax.readouts(self.model, padded, depths=[self.depth])[0, :n]
    return _log_softmax(logits)

  def score(self, context: Sequence[int], continuation: Sequence[int]) -> Tuple[float, bool]:
    """(sum of log p(continuation | context), whether every continuation token is the argmax)."""
    full = (list(context) + list(continuation))[-(self.cfg.max_len + 1) :]
    inp = full[:-1]
    n = min(len(continuation), len(inp))
    if n == 0:
      return 0.0, True
    lp = self.logprobs(inp)[len(inp) - n :]
    target = np.asarray(full[-n:])
    ll = float(lp[np.arange(n), target].sum())
    return ll, bool((lp.argmax(axis=-1) == target).all())

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> List[Tuple[float, bool]]:
    out = []
    for key, context, continuation in tqdm(requests, desc=f"{NAME} loglikelihood", disable=disable_tqdm):
      res = self.score(context, continuation)
      out.append(res)
      if key is not None:
        self.cache_hook.add_partial("loglikelihood", key, res)
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> List[float]:
    """Sum of log-probabilities of each whole string, in disjoint windows of the model's context."""
    out = []
    for req in tqdm(requests, desc=f"{NAME} loglikelihood_rolling", disable=disable_tqdm):
      (string,) = req.args
      windows = map(
          lm_utils.make_disjoint_window,
          lm_utils.get_rolling_token_windows(
              token_list=self.tok_encode(string),
              prefix_token=self.prefix_token_id,
              max_seq_len=self.max_length,
              context_len=1,
          ),
      )
      total = sum(self.score(ctx, cont)[0] for ctx, cont in windows)
      out.append(total)
      self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
    return out

  # ---------------------------------------------------------------------------------------------------
  # Speed statistics
  # ---------------------------------------------------------------------------------------------------
  def speed_stats(self, task: Optional[str] = None) -> Optional[dict]:
    """Summed statistics of the timed generate calls (of `task`, or all): their `DecodeStats` added and
    summarised by the method (tokens, decode_seconds, tokens_per_second, mean_accepted_length, commits, ...),
    with method (its label), requests,
    calls, warmup_calls and greedy (every call greedy). None when no generate call ran."""
    calls = [c for c in self.calls if task is None or c["task"] == task]
    if not calls:
      return None
    groups: dict = {}  # method 'auto' may pick different methods for different shapes: their counts do not add
    for c in calls:
      groups.setdefault((c["counts"].method, repr(sorted(c["counts"].settings.items()))), []).append(c["counts"])
    parts = [DecodeStats.total(g).summary() for g in groups.values()]
    agg = parts[0] if len(parts) == 1 else _mixed_summary(parts)
    picks = sorted({c["plan"] for c in calls if c.get("plan")})
    agg.update({"planned": picks} if picks else {})
    agg.update(
        method=self.method_label,
        requests=sum(c["requests"] for c in calls),
        calls=len(calls),
        warmup_calls=sum(c["warmup_calls"] for c in calls),
        greedy=all(c["greedy"] for c in calls),
    )
    return agg

  def reset_stats(self):
    self.calls = []


def _mixed_summary(parts: list) -> dict:
  """Summed figures of runs of several methods (method 'auto'): tokens, time, rate, and each method's summary."""
  tokens, secs = sum(p["tokens"] for p in parts), sum(p["decode_seconds"] for p in parts)
  return {
      "tokens": tokens,
      "decode_seconds": secs,
      "tokens_per_second": tokens / max(secs, 1e-9),
      "by_method": {p["method"]: p for p in parts},
  }


def _continue_final(text: str, final: str) -> str:
  """A rendered chat cut right after its final message's content (what follows it is the template's end of
  turn), so the model continues that message (HF's continue_final_message)."""
  final = final.strip()
  at = text.rfind(final) if final else -1
  if at == -1:
    raise ValueError("the chat template does not render the final message's content verbatim; cannot continue it")
  return text[: at + len(final)]


def _with_tokenizer(model, spec: str):
  """`model` with the tokenizer of a tokenizer.json file, a directory holding one, or a bundled model."""
  from tokenizers import Tokenizer

  if os.path.isfile(spec):
    tok = Tokenizer.from_file(spec)
  elif os.path.isfile(os.path.join(spec, "tokenizer.json")):
    tok = Tokenizer.from_file(os.path.join(spec, "tokenizer.json"))
  elif spec in api.bundled_models():
    tok = loopspec_jax.load(spec).tokenizer
  else:
    raise FileNotFoundError(f"tokenizer {spec!r}: no tokenizer.json file or directory and no bundled model")
  if tok.get_vocab_size() > model.config.vocab_size:
    raise ValueError(f"tokenizer {spec!r} has {tok.get_vocab_size()} tokens, the model {model.config.vocab_size}")
  return dataclasses.replace(model, tokenizer=tok)


def _request_id(task, req, context: str, copy: int) -> int:
  """A stable non-negative int32 id per (task, document, request index, repeat): sampled tokens then depend
  neither on batching nor on the other requests, and each of a task's `repeats` samples differently."""
  doc_id, idx = getattr(req, "doc_id", None), getattr(req, "idx", 0)
  text = f"{task}/{doc_id}/{idx}/{copy}" if doc_id is not None else f"{task}/{context}/{copy}"
  return zlib.crc32(text.encode("utf-8")) & 0x7FFFFFFF


def cli_main(argv: Optional[List[str]] = None):
  """lm-eval's command line with this backend registered and the offline tasks on the include path."""
  from lm_eval.__main__ import cli_evaluate

  argv = list(sys.argv[1:] if argv is None else argv)
  if not any(a == "--include_path" or a.startswith("--include_path=") for a in argv):
    argv += ["--include_path", TASKS_DIR]
  sys.argv = [sys.argv[0]] + argv
  cli_evaluate()


if __name__ == "__main__":
  cli_main()
