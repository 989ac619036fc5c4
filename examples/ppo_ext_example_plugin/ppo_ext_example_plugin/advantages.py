"""`batch_baseline`: REINFORCE with the mean score of the whole batch as the baseline."""

import jax
import jax.numpy as jnp


def batch_baseline(scores: jax.Array, mask: jax.Array) -> jax.Array:
  """`a_i = s_i - mean(s)` on every loss-mask token: `scores [B]`, `mask [B, T]` -> `[B, T]`."""
  scores = jnp.asarray(scores, jnp.float32)
  return (scores - jnp.mean(scores))[:, None] * jnp.asarray(mask, jnp.float32)
