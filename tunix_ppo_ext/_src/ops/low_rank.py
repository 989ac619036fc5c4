"""The LoRA product `x A B` with a hand-written VJP that keeps every transpose small.

Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models" (arXiv 2106.09685):
an adapted weight computes `x W + s x A B`, A `[K, r]`, B `[r, N]`, rank `r` small. For a
cotangent `g` of the product (`[..., N]`, leading axes the tokens):

  dx = (g B^T) A^T,    dA = x^T (g B^T),    dB = (x A)^T g

where `^T` on `x`, `g` and `x A` contracts every leading (token) axis. Autodiff computes the
same three products, but XLA:CPU lays `dB`'s contraction out by transposing the `[tokens,
N]` cotangent, a full copy of the layer's output gradient per adapter (for an MLP's
projections, the largest activations of a layer); here each contraction over the tokens
takes the rank-`r` operand first, so only `[tokens, r]` arrays are transposed (what it
saves on SmolLM2-135M: docs/measurements.md, "A real-model step against its floors").
"""

from __future__ import annotations

import jax


def _over_tokens(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
  """`lhs^T rhs` contracting every axis but the last of both: `[..., P] x [..., Q] -> [P, Q]`."""
  lead = tuple(range(lhs.ndim - 1))
  return jax.lax.dot_general(lhs, rhs, ((lead, lead), ((), ())))


@jax.custom_vjp
def lora_product(x: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
  """`(x A) B`: `x` `[..., K]`, `a` `[K, r]`, `b` `[r, N]` -> `[..., N]` (unscaled)."""
  return (x @ a) @ b


def _forward(x: jax.Array, a: jax.Array, b: jax.Array):
  xa = x @ a
  return xa @ b, (x, a, b, xa)


def _backward(residuals, g: jax.Array):
  x, a, b, xa = residuals
  gb = g @ b.T  # [..., r]
  dx = gb @ a.T
  da = _over_tokens(gb, x).T  # (g B^T)^T x, transposed: [K, r]
  db = _over_tokens(xa, g)  # (x A)^T g: [r, N]
  return dx.astype(x.dtype), da.astype(a.dtype), db.astype(b.dtype)


lora_product.defvjp(_forward, _backward)
