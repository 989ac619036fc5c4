"""`huber_kl`: a KL penalty that is k2 near the reference and grows only linearly beyond."""

import jax
import jax.numpy as jnp


def huber_kl(logp: jax.Array, ref_logp: jax.Array, delta: float = 1.0) -> jax.Array:
  """Per-token Huber loss of `x = logp - ref_logp`, same shape as `logp`.

  `0.5 * x**2` (k2) for `|x| <= delta`, `delta * (|x| - delta / 2)` beyond: outliers get a
  bounded gradient.
  """
  x = logp - ref_logp
  magnitude = jnp.abs(x)
  return jnp.where(magnitude <= delta, 0.5 * x * x, delta * (magnitude - 0.5 * delta))
