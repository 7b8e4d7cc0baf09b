import time, jax, jax.numpy as jnp
import loopspec_jax as lj
from loopspec_jax.heads import eagle as E
from loopspec_jax.models import looped as M
m = lj.load("tiny-raven"); cfg = m.config
tok = jnp.ones((8, 231), jnp.int32); n = jnp.full((8,), 120, jnp.int32)
f = jax.jit(lambda p, t, l: E.target_features(M.prepare_params(p, cfg), t, l, cfg, ()))
g = jax.jit(lambda p, t, l: E.target_features(p, t, l, cfg, ()))
for name, fn in (("decode-form", f), ("stored-form", g)):
  jax.block_until_ready(fn(m.params, tok, n)); t0 = time.time()
  for _ in range(3): jax.block_until_ready(fn(m.params, tok, n))
  print(name, (time.time() - t0) / 3, flush=True)
