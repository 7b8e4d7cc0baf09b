"""The bundled trained models load by name, encode text, and decode losslessly on every prompt set."""

import pytest
from absl.testing import absltest

import loopspec_jax
from loopspec_jax import prompts as prompt_sets

TASKS = ("gsm8k", "math500", "mbpp", "humaneval", "shakespeare")
BEST = {"tiny-raven": (2, 8), "tiny-ouro": (1, 2)}


def _prompts(model, n_tokens=48):
  """One prompt per task, cut to its last n_tokens tokens so that all share one compiled program."""
  out = []
  for task in TASKS:
    ids = model.encode(prompt_sets.load_prompts(task, 1)[0])
    out.append(ids[-n_tokens:])
  return out


@pytest.mark.parametrize("name", ["tiny-raven", pytest.param("tiny-ouro", marks=pytest.mark.slow)])
def test_bundled_greedy_loopspec_equals_autoregressive(name):
  if name not in loopspec_jax.bundled_models():
    pytest.skip(f"{name} is not bundled")
  model = loopspec_jax.load(name)
  assert model.tokenizer is not None
  text = "ROMEO: What light"
  assert model.decode(model.encode(text)) == text
  prompts = _prompts(model)
  ar = loopspec_jax.generate(model, prompts, max_new_tokens=12)
  d1, d2 = BEST[name]
  ls = loopspec_jax.generate(model, prompts, max_new_tokens=12, method="loopspec", d1=d1, d2=d2)
  assert ls.tokens == ar.tokens
  # A trained model's early readouts agree with depth R: most first proposals are accepted.
  assert ls.stats["commits"]["first"] > ls.stats["commits"]["restart"]


if __name__ == "__main__":
  absltest.main()
