"""Random logits and a NumPy reference of the log-probs and entropy taken from them."""

from __future__ import annotations

import functools

import jax
import numpy as np

from tunix_ppo_ext._src.ops.logits import (
  logps_and_entropy,
)

RTOL, ATOL = 1e-5, 1e-5


def make_inputs(b, t, v, seed=0, scale=3.0):
  rng = np.random.default_rng(seed)
  logits = (scale * rng.standard_normal((b, t, v))).astype(np.float32)
  ref = (logits + rng.standard_normal((b, t, v))).astype(np.float32)
  ids = rng.integers(0, v, (b, t)).astype(np.int32)
  w1, w2 = rng.standard_normal((2, b, t)).astype(np.float32)
  return logits, ref, ids, w1, w2


@functools.partial(jax.jit, static_argnums=(2, 3))
def logp_ent(logits, ids, temperature=1.0, chunk_size=0):
  return logps_and_entropy(logits, ids, temperature=temperature, chunk_size=chunk_size)
