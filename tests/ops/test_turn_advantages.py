"""Turn-level GAE, the discount between turns and VAPO's length-adaptive lambda, against
float64 NumPy references written from the formulas (turns found with explicit loops)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tests.helpers.advantages import (
  SEEDS,
  TOL,
  B,
  T,
  make_mask,
  ref_gae,
  ref_gae_turn_discount,
  ref_turns,
  ref_whiten,
)
from tunix_ppo_ext._src.ops.advantages import (
  compute_gae_advantages,
  compute_turn_gae_advantages,
  length_adaptive_lambda,
)

pytestmark = pytest.mark.fast

HYP = settings(max_examples=30, deadline=None)


def ref_turn_gae(r, v, m, gamma_turn, lam, whiten=True):
  """Turn k: R_k = sum of its rewards, V_k = value at its first token; GAE over turns."""
  r, v, m = (np.asarray(a, np.float64) for a in (r, v, m))
  raw, returns = np.zeros_like(r), np.zeros_like(r)
  lams = np.broadcast_to(np.asarray(lam, np.float64), (r.shape[0],))
  for b in range(r.shape[0]):
    turns = ref_turns(m[b])
    next_value, next_adv = 0.0, 0.0
    for turn in reversed(turns):
      value = v[b, turn[0]]
      delta = sum(r[b, t] for t in turn) + gamma_turn * next_value - value
      adv = delta + gamma_turn * lams[b] * next_adv
      for t in turn:
        raw[b, t], returns[b, t] = adv, adv + value
      next_value, next_adv = value, adv
  out = ref_whiten(raw, m) if whiten else raw
  return out * m, returns


def _inputs(seed):
  rng = np.random.default_rng(seed)
  r = rng.normal(size=(B, T)).astype(np.float32)
  v = rng.normal(size=(B, T)).astype(np.float32)
  return r, v, make_mask(rng)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma_turn,lam", [(0.95, 0.9), (1.0, 1.0), (0.5, 0.0)])
@pytest.mark.parametrize("whiten", [True, False])
def test_turn_gae_matches_reference(seed, gamma_turn, lam, whiten):
  r, v, m = _inputs(seed)
  adv, ret = compute_turn_gae_advantages(r, v, m, gamma_turn, lam, whiten=whiten)
  ref_adv, ref_ret = ref_turn_gae(r, v, m, gamma_turn, lam, whiten)
  assert adv.dtype == ret.dtype == jnp.float32
  np.testing.assert_allclose(adv, ref_adv, **TOL)
  np.testing.assert_allclose(ret, ref_ret, **TOL)
  assert np.all(np.asarray(adv)[m == 0] == 0.0) and np.all(np.asarray(ret)[m == 0] == 0.0)


def test_turn_gae_hand_computed():
  # two turns (tokens 0-1, 4), an observation (2-3), padding (5); reward at each turn's end
  m = np.array([[1, 1, 0, 0, 1, 0]], np.float32)
  r = np.array([[0.0, 0.5, 9.0, 9.0, 1.0, 9.0]], np.float32)
  v = np.array([[0.2, 7.0, 9.0, 9.0, 0.6, 9.0]], np.float32)
  adv, ret = compute_turn_gae_advantages(r, v, m, 0.5, 0.5, whiten=False)
  a1 = 1.0 - 0.6  # last turn: R + 0 - V
  a0 = 0.5 + 0.5 * 0.6 - 0.2 + 0.5 * 0.5 * a1
  np.testing.assert_allclose(adv, [[a0, a0, 0, 0, a1, 0]], rtol=1e-6)
  np.testing.assert_allclose(ret, [[a0 + 0.2, a0 + 0.2, 0, 0, a1 + 0.6, 0]], rtol=1e-6)


def test_one_turn_rows_with_lambda_one_are_the_episode_return():
  m = np.array([[1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 1]], np.float32)
  r = np.array([[0, 0, 2, 0], [0, 1, 0, 1], [0.5, 0, 0, 0]], np.float32)
  v = np.full_like(r, 0.25)
  adv, ret = compute_turn_gae_advantages(r, v, m, 0.9, 1.0, whiten=False)
  totals = np.array([2.0, 2.0, 0.5])
  np.testing.assert_allclose(ret, totals[:, None] * m, rtol=1e-6)
  np.testing.assert_allclose(adv, (totals[:, None] - 0.25) * m, rtol=1e-6)


def test_turn_gae_of_empty_rows_and_a_per_row_lambda():
  r, v, m = _inputs(3)
  m[0] = 0.0
  lam = np.linspace(0.0, 1.0, B).astype(np.float32)
  adv, ret = compute_turn_gae_advantages(r, v, m, 0.9, lam, whiten=False)
  ref_adv, ref_ret = ref_turn_gae(r, v, m, 0.9, lam, whiten=False)
  np.testing.assert_allclose(adv, ref_adv, **TOL)
  np.testing.assert_allclose(ret, ref_ret, **TOL)
  assert not np.any(np.asarray(adv)[0]) and not np.any(np.asarray(ret)[0])


@given(
  mask=hnp.arrays(np.int8, (4, 8), elements=st.integers(0, 1)),
  rewards=hnp.arrays(np.float32, (4, 8), elements=st.floats(-10, 10, width=32)),
  junk=hnp.arrays(np.float32, (4, 8), elements=st.floats(-1e3, 1e3, width=32)),
)
@HYP
def test_turn_gae_reads_only_each_turns_first_value(mask, rewards, junk):
  """Values anywhere but a turn's first agent token, and rewards off the mask, change
  nothing."""
  first = (mask > 0) & (np.pad(mask[:, :-1], ((0, 0), (1, 0))) == 0)
  values = np.where(first, 0.5, junk).astype(np.float32)
  noisy_rewards = np.where(mask > 0, rewards, junk)
  a1, r1 = compute_turn_gae_advantages(rewards * mask, np.where(first, 0.5, 0.0), mask, 0.9, 0.8)
  a2, r2 = compute_turn_gae_advantages(noisy_rewards, values, mask, 0.9, 0.8)
  np.testing.assert_allclose(a1, a2, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(r1, r2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma,gamma_turn,lam", [(1.0, 0.9, 0.95), (0.99, 0.5, 1.0)])
def test_gae_with_a_turn_discount_matches_reference(seed, gamma, gamma_turn, lam):
  r, v, m = _inputs(seed)
  adv, ret = compute_gae_advantages(r, v, m, gamma, lam, whiten=False, gamma_turn=gamma_turn)
  ref_adv, ref_ret = ref_gae_turn_discount(r, v, m, gamma, gamma_turn, lam)
  np.testing.assert_allclose(adv, ref_adv, **TOL)
  np.testing.assert_allclose(ret, ref_ret, **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_turn_discount_equal_to_gamma_is_plain_gae(seed):
  r, v, m = _inputs(seed)
  got = compute_gae_advantages(r, v, m, 0.9, 0.8, gamma_turn=0.9)
  want = ref_gae(r, v, m, 0.9, 0.8)
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, **TOL)


def test_gae_with_a_lambda_per_row_matches_reference_row_by_row():
  r, v, m = _inputs(4)
  lam = np.array([0.0, 0.3, 1.0, 0.5, 0.9, 0.95], np.float32)[:B]
  adv, ret = compute_gae_advantages(r, v, m, 0.99, lam, whiten=False)
  for b in range(B):
    ref_adv, ref_ret = ref_gae(r[b : b + 1], v[b : b + 1], m[b : b + 1], 0.99, float(lam[b]), False)
    np.testing.assert_allclose(adv[b : b + 1], ref_adv, **TOL)
    np.testing.assert_allclose(ret[b : b + 1], ref_ret, **TOL)


def test_length_adaptive_lambda_is_vapos_formula():
  m = np.zeros((4, 300), np.float32)
  for row, length in enumerate((0, 10, 40, 300)):
    m[row, :length] = 1.0
  lam = np.asarray(length_adaptive_lambda(m, 0.05))
  # l = 10: 1 - 1/0.5 < 0 -> 0; l = 40: 1 - 1/2 = 0.5; l = 300: 1 - 1/15
  np.testing.assert_allclose(lam, [0.0, 0.0, 0.5, 1.0 - 1.0 / 15.0], rtol=1e-6)
  assert lam.dtype == np.float32


def test_bfloat16_inputs_match_float32_of_the_rounded_inputs():
  r, v, m = _inputs(5)
  r16, v16 = jnp.asarray(r, jnp.bfloat16), jnp.asarray(v, jnp.bfloat16)
  got = compute_turn_gae_advantages(r16, v16, m, 0.9, 0.95)
  want = ref_turn_gae(np.asarray(r16, np.float32), np.asarray(v16, np.float32), m, 0.9, 0.95)
  for a, b in zip(got, want, strict=True):
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(a, b, **TOL)


def test_turn_gae_refuses_out_of_range_discounts_and_jits_traced_ones():
  r, v, m = _inputs(0)
  with pytest.raises(ValueError, match="gamma_turn"):
    compute_turn_gae_advantages(r, v, m, 1.5, 0.9)
  with pytest.raises(ValueError, match="gamma_turn"):
    compute_gae_advantages(r, v, m, 0.9, 0.9, gamma_turn=-0.1)
  traced = jax.jit(lambda g: compute_turn_gae_advantages(r, v, m, g, 0.9, whiten=False)[0])
  np.testing.assert_allclose(traced(0.7), ref_turn_gae(r, v, m, 0.7, 0.9, False)[0], **TOL)
  assert np.all(np.isfinite(np.asarray(traced(0.7))))
