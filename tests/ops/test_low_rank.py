"""`lora_product` (x A B with its own VJP) against NumPy references written from the formula."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_ppo_ext._src.ops.low_rank import lora_product

pytestmark = pytest.mark.fast


def _reference(x, a, b, g):
  """Value and gradients of `sum(g * (x A B))` from the formulas, in float64:
  dx = g B^T A^T, dA = x^T g B^T, dB = (x A)^T g (x, g flattened over the token axes)."""
  x, a, b, g = (np.asarray(v, np.float64) for v in (x, a, b, g))
  xf, gf = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
  out = xf @ a @ b
  dx = (gf @ b.T @ a.T).reshape(x.shape)
  return out.reshape(g.shape), dx, xf.T @ (gf @ b.T), (xf @ a).T @ gf


@pytest.mark.parametrize("lead", [(5,), (2, 7), (3, 1, 4), (0, 4)])  # tokens, incl. empty
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_value_and_gradients_are_the_formulas(lead, dtype):
  rng = np.random.default_rng(0)
  k, r, n = 6, 2, 9
  x = jnp.asarray(rng.normal(size=(*lead, k)), dtype)
  a = jnp.asarray(rng.normal(size=(k, r)), dtype)
  b = jnp.asarray(rng.normal(size=(r, n)) * 1e3, dtype)  # large: B scales every gradient
  g = jnp.asarray(rng.normal(size=(*lead, n)), dtype)
  out, pullback = jax.vjp(lora_product, x, a, b)
  grads = pullback(g)
  want = _reference(x, a, b, g)
  tol = dict(rtol=2e-2, atol=2e-2 * 1e3) if dtype == jnp.bfloat16 else dict(rtol=1e-5, atol=1e-2)
  assert out.dtype == dtype and all(d.dtype == dtype for d in grads)
  for got, expected in zip((out, *grads), want, strict=True):
    assert got.shape == expected.shape
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, **tol)


def test_jit_and_grad_through_a_sum_match_autodiff_of_the_plain_product():
  """Under jit, as a loss: the same gradients as JAX's autodiff of `(x @ a) @ b`."""
  rng = np.random.default_rng(1)
  x, a, b = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((4, 3, 8), (8, 2), (2, 5)))

  def loss(fn):
    return jax.jit(jax.grad(lambda x, a, b: jnp.sum(jnp.tanh(fn(x, a, b))), argnums=(0, 1, 2)))

  ours = loss(lora_product)(x, a, b)
  plain = loss(lambda x, a, b: (x @ a) @ b)(x, a, b)
  for got, want in zip(ours, plain, strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
