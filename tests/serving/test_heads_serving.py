"""The head methods (medusa, eagle, mtp) in the serving engine: continuous batching equals solo `generate`
(slow: three decode-loop compiles per method), and the engine / the OpenAI server's config take the method by
its spec string, the head by its directory or bundled name."""

import pytest

import head_helpers as H
import helpers
import loopspec_jax as lj
from loopspec_jax import methods
from loopspec_configs import serve as serve_configs
from loopspec_experiments import serve
from loopspec_jax.heads import artefact
from loopspec_jax.serving import engine as E
import test_serving_engine as base  # its 12 staggered requests and solo decode

SPEC = base.SPEC  # huginn:tiny, R = 8


def _spec(kind, path) -> str:
  return f"{kind}:heads={path}," + ",".join(f"{k}={v}" for k, v in H.ENVELOPES[kind].items())


@pytest.mark.slow
@pytest.mark.parametrize("kind", H.KINDS)
def test_continuous_batching_equals_solo_generate(kind, tmp_path):
  """12 staggered requests (greedy and sampled, eos 5) through 4 slots, the method given by its spec string
  with the head's directory: each request's tokens equal its solo `generate`; one compiled decode loop; the
  served figure is tau (tokens per verify pass)."""
  model = helpers.tiny_model(SPEC)
  path = str(tmp_path / kind)
  artefact.save(path, H.random_heads(kind, model))
  spec = _spec(kind, path)
  loop = H.LOOPS[kind].decode_loop
  before = loop._cache_size()
  eng = E.Engine(model, E.EngineConfig(method=spec, slots=4, ticks_per_call=3, max_len=base.MAX_LEN, eos_id=5))
  assert eng.method == methods.parse(spec) and eng.method.heads.source == path
  reqs = base.requests()
  seqs = base.run_staggered(eng, reqs)
  engine_compiles = loop._cache_size() - before
  assert eng.metrics.admitted == 12 and eng.running == 0
  m = methods.parse(spec)
  for i, (r, s) in enumerate(zip(reqs, seqs)):
    kw = dict(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p)
    if r.temperature > 0:
      kw.update(seed=0, request_ids=[r.seed])
    want = lj.generate(model, [r.prompt], max_new_tokens=r.max_tokens, method=m, eos_id=5, **kw)
    assert s.finished and s.tokens == want.tokens[0], (kind, i)
  assert engine_compiles == 1, engine_compiles  # the engine's state is committed from the start
  n = eng.metrics.count("n_new")
  assert eng.mean_accepted_length() == pytest.approx(n / eng.metrics.count("rounds"))


@pytest.mark.slow  # 62 s on the loaded host (the engine's prefill and init programs)
def test_engine_takes_the_head_method_by_spec(tmp_path):
  """A spec string with the head's directory builds the method with its head loaded; a foreign head is refused
  before the decode loop compiles (tests/heads/test_heads_wiring.py has the full set of refusals)."""
  model = helpers.tiny_model(SPEC)
  path = str(tmp_path / "medusa")
  artefact.save(path, H.random_heads("medusa", model))
  eng = E.Engine(model, E.EngineConfig(method=_spec("medusa", path), slots=2, max_len=base.MAX_LEN))
  assert eng.decoder.name == "medusa" and eng.stats_settings["tree_nodes"] == 6
  wider = helpers.tiny_model(SPEC, hidden_size=64)
  with pytest.raises(ValueError, match="hidden_size"):
    E.Engine(wider, E.EngineConfig(method=_spec("medusa", path), slots=2, max_len=base.MAX_LEN))


@pytest.mark.slow
@pytest.mark.skipif("tiny-raven-medusa" not in artefact.bundled_heads(), reason="no bundled tiny-raven-medusa")
def test_server_config_takes_a_bundled_head_by_name():
  """configs/serve.py with `method` naming the bundled head (loopspec-serve --config.method=...)."""
  c = serve_configs.get_config()
  c.model, c.method, c.slots, c.max_len = "tiny-raven", "medusa:heads=tiny-raven-medusa,tree_nodes=16", 2, 128
  _, eng = serve.engine_from_config(c)
  assert eng.method.name == "medusa" and eng.method.heads.source.endswith("tiny-raven-medusa")
  assert eng.method.spec == "medusa:heads=tiny-raven-medusa,tree_nodes=16"
