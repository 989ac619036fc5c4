"""How well two halves of a batch agree on the policy gradient, per advantage estimator.

For advantages `A` (one `[B, T]` array per estimator) the policy gradient of the trained
parameters (the adapters of a LoRA actor, else every weight) is
`g = sum_t A_t grad log pi(a_t) / N` over the agent tokens of a half of the batch (the
surrogate's gradient at ratio 1, token-mean). `gradient_agreement` returns, per estimator,
the cosine between the two halves' gradients: on the same episodes and the same policy, the
estimator whose halves agree more gives the cleaner gradient (for independent halves the
cosine estimates `|E g|^2 / E|g|^2`, the gradient's signal share). One forward pass over
the batch, then two vector-Jacobian products per estimator (one backward pass each).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.learner.role_passes import ModelInputs


def gradient_agreement(
  model: nnx.Module, inputs: ModelInputs, advantages: np.ndarray, first_half: np.ndarray
) -> np.ndarray:
  """`[E]` the cosine between the two halves' policy gradients for each of `E` advantage
  arrays (`advantages` `[E, B, T]`; `first_half` `[B]` bool). 0 where a half has no
  agent token or a zero gradient."""
  graphdef, trained, rest = nnx.split(model, passes.trained_filter(model), ...)
  halves = jnp.asarray(first_half, jnp.float32)[:, None] * inputs.loss_mask
  weights = jnp.stack([halves, inputs.loss_mask - halves])  # [2, B, T]
  sizes = jnp.maximum(weights.sum(axis=(1, 2), keepdims=True), 1.0)
  temperature = 1.0 if inputs.temperature is None else float(inputs.temperature)

  def logps(params: Any) -> jax.Array:
    return passes.compute_per_token_logps(
      nnx.merge(graphdef, params, rest),
      inputs.prompt,
      inputs.completion,
      pad_id=inputs.pad_id,
      eos_id=inputs.eos_id,
      attention_mask=inputs.attention_mask,
      stop_gradient=False,
      temperature=temperature,
    )

  _, vjp = jax.vjp(logps, trained)  # one forward pass; each vjp is one backward pass
  cotangents = jnp.asarray(advantages, jnp.float32)[:, None] * (weights / sizes)[None]
  return np.array([_cosine(vjp(pair[0])[0], vjp(pair[1])[0]) for pair in cotangents])


@jax.jit
def _cosine(first: Any, second: Any) -> jax.Array:
  """The cosine between two gradients (pytrees of one structure); 0 if either is zero."""
  leaves = list(zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True))
  dot = sum(jnp.vdot(a, b) for a, b in leaves)
  norms = jnp.sqrt(sum(jnp.vdot(a, a) for a, _ in leaves) * sum(jnp.vdot(b, b) for _, b in leaves))
  return jnp.where(norms > 0, dot / jnp.where(norms > 0, norms, 1.0), 0.0)
