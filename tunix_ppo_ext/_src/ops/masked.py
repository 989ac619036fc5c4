"""Masked reductions shared by the losses, advantages and metrics.

Every function takes a value array and a same-shape (or broadcastable) mask of
0/1 entries, computes in float32, and never divides by zero: an empty mask gives
0 (sums, means) instead of NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_sum(x: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
  """Sum of `x` where `mask` is 1, in float32.

  Args:
    x: values, any shape and numeric dtype, e.g. `[B, T]`.
    mask: 0/1 entries (bool, int or float), the shape of `x` or broadcastable to it.
    axis: the axis to reduce; `None` reduces over all entries.

  Returns:
    float32 array: `sum(x * mask)` over `axis` (a scalar for `axis=None`); 0 for an empty mask.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    >>> mask = jnp.array([[1, 1, 0], [1, 0, 0]])
    >>> ops.masked_sum(x, mask).item()
    7.0
    >>> ops.masked_sum(x, mask, axis=-1).tolist()
    [3.0, 4.0]
  """
  return jnp.sum(x.astype(jnp.float32) * mask.astype(jnp.float32), axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
  """Mean of `x` over mask entries; 0 where the mask is empty.

  Args:
    x: `[B, T]` (or any shape) values, any numeric dtype.
    mask: 0/1 weights, bool, int or float, broadcastable to `x.shape`.
    axis: the reduced axis (None: every axis).

  Returns:
    float32 array: `sum(x * mask) / max(sum(mask), 1)` over `axis` (a scalar for
    `axis=None`).

  Examples:
    >>> from jax import numpy as jnp
    >>> from tunix_ppo_ext.ops import masked_mean
    >>> rows = jnp.arange(6.0).reshape(2, 3)  # [[0, 1, 2], [3, 4, 5]]
    >>> masked_mean(rows, jnp.array([[1, 0, 1], [0, 0, 0]]), axis=1).tolist()  # row 1: empty
    [1.0, 0.0]
  """
  count = jnp.sum(jnp.broadcast_to(mask, x.shape).astype(jnp.float32), axis=axis)
  return masked_sum(x, mask, axis) / jnp.maximum(count, 1.0)


def masked_var(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Unbiased (Bessel-corrected) variance over all mask entries; 0 for < 2 entries."""
  mask = jnp.broadcast_to(mask, x.shape).astype(jnp.float32)
  count = jnp.sum(mask)
  mean = masked_mean(x, mask)
  sq_sum = masked_sum(jnp.square(x.astype(jnp.float32) - mean), mask)
  return sq_sum / jnp.maximum(count - 1.0, 1.0)


def masked_whiten(x: jax.Array, mask: jax.Array, shift_mean: bool = True) -> jax.Array:
  """`(x - mean) / sqrt(var + 1e-8)` with masked mean and unbiased masked variance.

  Returns float32 of `x.shape`. Entries outside the mask are whitened too (callers
  multiply by the mask when they need zeros there). Computed on `y = x / s`, `s` the
  largest masked `|x|`, as `(y - mean_y) / sqrt(var_y + 1e-8 / s^2)` (the same value), so
  a variance beyond float32 (rewards of 1e20) cannot turn the result into 0 or NaN.

  Args:
    x: values, any shape and numeric dtype, e.g. advantages `[B, T]`.
    mask: 0/1 entries (bool, int or float), the shape of `x` or broadcastable to it; the
      mean and variance are taken over these entries only.
    shift_mean: `False` adds the masked mean back (scales to unit variance only).

  Returns:
    float32 array of `x.shape`, whitened.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> x = jnp.array([1.0, 2.0, 3.0, 100.0])
    >>> np.round(ops.masked_whiten(x, jnp.array([1, 1, 1, 0])), 4).tolist()
    [-1.0, 0.0, 1.0, 98.0]
  """
  x = x.astype(jnp.float32)
  mask = jnp.broadcast_to(mask, x.shape).astype(jnp.float32)
  scale = jnp.max(jnp.abs(x) * mask)
  scale = jnp.where(jnp.isfinite(scale) & (scale > 0), scale, 1.0)
  y = x / scale
  mean = masked_mean(y, mask)
  whitened = (y - mean) * jax.lax.rsqrt(masked_var(y, mask) + 1e-8 / jnp.square(scale))
  return whitened if shift_mean else whitened + mean * scale
