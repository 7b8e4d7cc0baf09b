"""loopspec-serve's and loopspec-evaluate's command lines: `--config.<field>` overrides work, --help lists the
fields and presets, and the engine serves any method of the registry by its spec."""

from __future__ import annotations

import pytest

import helpers
import loopspec_jax as lj
from loopspec_jax import methods
from loopspec_experiments import common
from loopspec_experiments import evaluate
from loopspec_experiments import serve
from loopspec_jax.serving import Engine, EngineConfig, Request


def test_config_overrides_are_read():
  common.parse_flags(serve.FLAGS, ["loopspec-serve", "--config.slots=2", "--config.method=ar", "--config.max_len=none"])
  c = serve._CONFIG.value
  assert (c.slots, c.method, c.max_len, c.port) == (2, "ar", None, 8000)
  common.parse_flags(serve.FLAGS, ["loopspec-serve", "--config=serve.py:quick"])
  assert (serve._CONFIG.value.slots, serve._CONFIG.value.warmup) == (2, False)


@pytest.mark.parametrize(
    "module,argv0,must",
    [
        (serve, "loopspec-serve", ["slots = 4", "method = 'loopspec:d1=2,d2=8'", "max_len = none", "quick"]),
        (evaluate, "loopspec-evaluate", ["limit = none", "methods = ", "Presets (--config=eval/default.py:<preset>)"]),
    ],
)
def test_help_lists_fields_and_presets(capsys, module, argv0, must):
  with pytest.raises(SystemExit) as info:
    common.parse_flags(module.FLAGS, [argv0, "--help"])
  assert info.value.code == 0
  out = capsys.readouterr().out
  for text in must + ["--config.<field>=<value>"]:
    assert text in out, (text, out)


def test_unknown_method_lists_the_registry():
  with pytest.raises(
      ValueError, match="expected one of " + repr(methods.NAMES).replace("(", r"\(").replace(")", r"\)")
  ):
    Engine(helpers.tiny_model("huginn:tiny"), EngineConfig(method="nope"))


@pytest.mark.slow  # compiles prompt lookup's decode loop and generate's (80 s on 2 CPU cores)
def test_engine_serves_any_registered_method():
  """The engine builds its method through the registry: a spec of a method that the server's old enum did
  not list (prompt lookup) is served, and its tokens equal generate's; an unknown name lists methods.NAMES."""
  model = helpers.tiny_model("huginn:tiny")
  eng = Engine(model, EngineConfig(method="lookup:ngram=2,gamma=3", slots=1, max_len=32, greedy_only=True, eos_id=-1))
  assert eng.method == methods.build("lookup", ngram=2, gamma=3)
  seq = eng.generate(Request(prompt=[1, 2, 3, 1, 2], max_tokens=6))
  ref = lj.generate(model, [[1, 2, 3, 1, 2]], max_new_tokens=6, method="lookup", ngram=2, gamma=3)
  assert seq.tokens == list(ref.tokens[0])
