"""Methods as values: the registry, the one spec parser, and `generate` taking a name, a spec or an object."""

import dataclasses

import pytest

import helpers
import loopspec_jax as lj
from loopspec_jax import methods


def test_registry_names_every_method_once():
  assert methods.NAMES == (
      "ar",
      "chain",
      "loopspec",
      "draft",
      "lookup",
      "tree",
      "lookahead",
      "medusa",
      "eagle",
      "mtp",
      "dflash",
      "auto",
  )
  for name, cls in methods.REGISTRY.items():
    assert cls.name == name and issubclass(cls, lj.Method)


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("ar", lj.AR()),
        ("loopspec:d1=2,d2=8", lj.LoopSpec(d1=2, d2=8)),
        ("loopspec:2,8", lj.LoopSpec(d1=2, d2=8)),
        ("loopspec:2,d2=none", lj.LoopSpec(d1=2)),
        ("loopspec:d1=2,d2=8,gate_mass=0.25", lj.LoopSpec(d1=2, d2=8, gate_mass=0.25)),
        ("chain:d1=1,gamma=auto", lj.Chain(d1=1, gamma="auto")),
        (" lookup:3,4 ", lj.Lookup(ngram=3, gamma=4)),
    ],
)
def test_parse(spec, expected):
  assert methods.parse(spec) == expected
  assert methods.parse(expected.spec) == expected  # spec round-trips


@pytest.mark.parametrize(
    "spec, match",
    [
        ("beam", "unknown method 'beam'"),
        ("ar:d1=2", "takes no 'd1'"),
        ("loopspec:d1=2,8", "not of the form name=value"),
        ("chain:1,2,3", "not of the form name=value"),
    ],
)
def test_parse_rejects(spec, match):
  with pytest.raises(ValueError, match=match):
    methods.parse(spec)


def test_build_from_keywords_and_objects():
  assert methods.build("loopspec", d1=2, d2=8, gamma=None) == lj.LoopSpec(d1=2, d2=8)
  m = lj.Chain(d1=2, gamma=3)
  assert methods.build(m) is m
  with pytest.raises(ValueError, match="is a Method object"):
    methods.build(m, d1=1)
  with pytest.raises(ValueError, match="method='lookup' takes no d1"):
    methods.build("lookup", d1=1)
  assert lj.LoopSpec(d1=2, d2=8).label == "loopspec(d1=2,d2=8)"
  with pytest.raises(dataclasses.FrozenInstanceError):
    m.d1 = 3  # frozen


def test_generate_takes_a_name_a_spec_or_an_object():
  model = helpers.tiny_model("huginn:tiny", contraction=0.7)
  prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
  by_kw = lj.generate(model, prompts, max_new_tokens=8, method="chain", d1=2, gamma=2)  # one compile for three
  by_obj = lj.generate(model, prompts, max_new_tokens=8, method=lj.Chain(d1=2, gamma=2))
  by_spec = lj.generate(model, prompts, max_new_tokens=8, method="chain:2,2")
  ar = lj.generate(model, prompts, max_new_tokens=8)
  assert by_kw.tokens == by_obj.tokens == by_spec.tokens == ar.tokens
  with pytest.raises(ValueError, match="d1=3 must divide"):
    lj.generate(model, prompts, max_new_tokens=8, method=lj.LoopSpec(d1=3))
