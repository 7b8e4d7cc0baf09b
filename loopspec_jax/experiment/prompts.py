"""The prompts an experiment decodes, as token ids: a task's prompt set, random tokens, or the demo's four."""

from __future__ import annotations

from absl import logging
import numpy as np

from loopspec_jax import prompts as prompt_sets
from loopspec_jax.analysis import depth_metrics

# The prompts `loopspec-demo` decodes (task "demo" of the benchmarks).
DEMO_PROMPTS = [
    "ROMEO:\nWhat light is this that breaks upon mine eyes?\n\nJULIET:\n",
    "Question: Natalia sold 48 clips in April and half as many in May. How many did she sell?\nAnswer:",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "KING HENRY:\nOnce more unto the breach, dear friends, once more;\n",
]


def demo_prompt_ids(model) -> list:
  """`DEMO_PROMPTS` as token ids (fixed pseudo-prompts of 12 ids for a checkpoint without a tokenizer)."""
  if model.tokenizer is not None:
    return [model.encode(p) for p in DEMO_PROMPTS]
  return [[(7 * i + j) % model.config.vocab_size for j in range(12)] for i in range(len(DEMO_PROMPTS))]


def random_prompts(vocab_size: int, num: int, prompt_len: int, seed: int) -> list:
  """`num` prompts of `prompt_len` token ids drawn uniformly from the vocabulary (numpy RandomState(seed))."""
  rng = np.random.RandomState(seed)
  return [rng.randint(0, vocab_size, prompt_len).tolist() for _ in range(num)]


def load_prompt_set(task: str, model, num: int, prompt_len: int, seed: int) -> list:
  """`num` prompts of a task as token ids ('demo': `DEMO_PROMPTS`; 'random': `random_prompts`). Text prompts
  longer than half the model's context keep their last max_len // 2 tokens (few-shot prefixes do not fit the
  tiny models); each cut is logged."""
  if task == "demo":
    return [model.encode(t) for t in DEMO_PROMPTS[:num]]
  if task == "random":
    return random_prompts(model.config.vocab_size, num, prompt_len, seed)
  texts = prompt_sets.load_prompts(task, num)
  keep = model.config.max_len // 2
  out = []
  for i, t in enumerate(texts):
    ids = model.encode(t)
    if len(ids) > keep:
      logging.warning(
          "%s prompt %d: %d tokens, keeping the last %d (context %d)", task, i, len(ids), keep, model.config.max_len
      )
    out.append(ids[-keep:])
  return out


def prompts_for(cfg, task: str, model, num_prompts=None) -> list:
  """The prompts of `task` as a depth / sweep config asks for them (count, length, seed, token cut);
  `num_prompts` overrides the config's count."""
  return depth_metrics.prepare_prompts(
      task,
      model,
      cfg.num_prompts if num_prompts is None else num_prompts,
      max_new_tokens=cfg.max_new_tokens,
      prompt_len=cfg.prompt_len,
      seed=cfg.seed,
      max_prompt_tokens=cfg.get("max_prompt_tokens") or None,
  )
