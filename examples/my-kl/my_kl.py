import jax.numpy as jnp


def cosh_kl(logp, ref_logp):
  """Per-token cosh(logp - ref_logp) - 1: symmetric, k2 near 0; same shape as logp."""
  return jnp.cosh(jnp.clip(logp - ref_logp, -20.0, 20.0)) - 1.0
