"""`shadow_gradients.gradient_agreement`: the cosine between two halves' policy gradients,
against gradients taken independently with `nnx.grad`, and its identities (equal halves
agree fully, opposite ones fully disagree, no signal is 0)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.clusters import toy_policy
from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.learner.role_passes import ModelInputs
from tunix_ppo_ext._src.tunix.learner.shadow_gradients import gradient_agreement

pytestmark = pytest.mark.tunix

V, P, T = 24, 3, 6


def inputs(rows: np.ndarray, mask: np.ndarray) -> ModelInputs:
  prompt = np.tile(np.array([[0, 5, 6]], np.int32), (len(rows), 1))
  return ModelInputs(
    prompt=jnp.asarray(prompt),
    completion=jnp.asarray(rows, jnp.int32),
    attention_mask=jnp.ones(rows.shape, jnp.int32),
    loss_mask=jnp.asarray(mask, jnp.float32),
    pad_id=0,
    eos_id=1,
    temperature=None,
  )


def batch():
  rng = np.random.default_rng(0)
  rows = rng.integers(2, V, size=(2, T)).astype(np.int32)
  mask = np.array([[1, 1, 0, 1, 1, 1], [1, 0, 0, 1, 1, 0]])
  return np.concatenate([rows, rows]), np.concatenate([mask, mask])  # rows 2, 3 repeat 0, 1


def test_equal_halves_agree_and_opposite_halves_disagree():
  model = toy_policy(V)
  rows, mask = batch()
  a = np.random.default_rng(1).normal(size=(2, T)).astype(np.float32)
  same, opposite = np.concatenate([a, a]), np.concatenate([a, -a])
  zero = np.zeros((4, T), np.float32)
  first = np.array([True, True, False, False])
  got = gradient_agreement(model, inputs(rows, mask), np.stack([same, opposite, zero]), first)
  np.testing.assert_allclose(got, [1.0, -1.0, 0.0], atol=1e-5)


def test_the_cosine_matches_gradients_taken_independently():
  model = toy_policy(V, seed=3)
  rng = np.random.default_rng(2)
  rows = rng.integers(2, V, size=(4, T)).astype(np.int32)
  mask = (rng.random((4, T)) < 0.7).astype(np.int32)
  mask[:, 0] = 1
  adv = rng.normal(size=(4, T)).astype(np.float32)
  first = np.array([True, False, True, False])
  got = gradient_agreement(model, inputs(rows, mask), adv[None], first)[0]

  def half_gradient(keep: np.ndarray) -> list[np.ndarray]:
    weights = adv * mask * keep[:, None] / (mask * keep[:, None]).sum()

    def surrogate(m):
      logps = passes.compute_per_token_logps(
        m,
        jnp.asarray(np.tile([[0, 5, 6]], (4, 1))),
        jnp.asarray(rows),
        pad_id=0,
        eos_id=1,
        attention_mask=jnp.ones((4, T), jnp.int32),
        stop_gradient=False,
      )
      return jnp.sum(logps * weights)

    grads = nnx.grad(surrogate)(model)
    return [np.asarray(g, np.float64).ravel() for g in jax.tree.leaves(grads)]

  g1, g2 = (np.concatenate(half_gradient(k)) for k in (first, ~first))
  expected = g1 @ g2 / np.linalg.norm(g1) / np.linalg.norm(g2)
  assert got == pytest.approx(expected, abs=2e-4)
  assert -1.0 <= got <= 1.0
