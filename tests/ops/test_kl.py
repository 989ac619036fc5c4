"""KL estimators and controllers against NumPy references written from the formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.losses import random_logps
from tunix_ppo_ext._src.ops import kl
from tunix_ppo_ext._src.ops import kl_methods as names

pytestmark = pytest.mark.fast

RTOL = 1e-5
ATOL = 1e-6


def np_kl(logp, ref, method):
  """Reference per-token estimators in float64."""
  logp = np.asarray(logp, np.float64)
  ref = np.asarray(ref, np.float64)
  d = logp - ref
  if method in ("kl", "k1"):
    return d
  if method == "abs":
    return np.abs(d)
  if method in ("mse_kl", "mse", "k2"):
    return 0.5 * d**2
  if method in ("low_var_kl", "k3"):
    x = np.clip(ref - logp, -20.0, 20.0)
    return np.exp(x) - x - 1.0
  raise AssertionError(method)


BASE_METHODS = ["kl", "k1", "abs", "mse_kl", "mse", "k2", "low_var_kl", "k3"]


@pytest.mark.parametrize("method", BASE_METHODS)
def test_values_match_reference(method):
  logp, ref = random_logps(0)
  got = names.compute_kl_divergence(logp, ref, method)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, np_kl(logp, ref, method), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("method", BASE_METHODS)
def test_straight_through_value_is_base_and_gradient_is_k2(method):
  logp, ref = random_logps(1)
  weights = np.random.default_rng(2).normal(size=logp.shape).astype(np.float32)

  def weighted(lp, m):
    return jnp.sum(weights * names.compute_kl_divergence(lp, ref, m))

  value = names.compute_kl_divergence(logp, ref, method + "+")
  np.testing.assert_allclose(value, np_kl(logp, ref, method), rtol=RTOL, atol=ATOL)
  grad = jax.grad(weighted)(jnp.asarray(logp), method + "+")
  # d/dlogp of 0.5 (logp - ref)^2 is (logp - ref).
  expected = weights.astype(np.float64) * (logp.astype(np.float64) - ref)
  np.testing.assert_allclose(grad, expected, rtol=RTOL, atol=ATOL)


def test_low_var_kl_gradient_is_analytic():
  logp, ref = random_logps(3)
  grad = jax.grad(lambda lp: jnp.sum(names.compute_kl_divergence(lp, ref, "k3")))(jnp.asarray(logp))
  # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp)
  np.testing.assert_allclose(
    grad, 1.0 - np.exp(ref.astype(np.float64) - logp), rtol=RTOL, atol=ATOL
  )


def test_clamp_value_bounds_result():
  logp, ref = random_logps(4, scale=30.0)
  for method in ["kl", "low_var_kl", "mse_kl+"]:
    got = np.asarray(names.compute_kl_divergence(logp, ref, method, clamp_value=1.5))
    base = method.rstrip("+")
    np.testing.assert_allclose(
      got, np.clip(np_kl(logp, ref, base), -1.5, 1.5), rtol=RTOL, atol=ATOL
    )


def test_huge_log_ratios_are_finite():
  logp = np.array([[-1e4, 0.0, -3.0]], np.float32)
  ref = np.array([[0.0, -1e4, -3.0]], np.float32)
  for method in names.kl_method_names():
    value = names.compute_kl_divergence(logp, ref, method)
    grad = jax.grad(lambda lp, m=method: jnp.sum(names.compute_kl_divergence(lp, ref, m)))(
      jnp.asarray(logp)
    )
    assert np.all(np.isfinite(value)), method
    assert np.all(np.isfinite(grad)), method


def test_bfloat16_inputs_compute_in_float32():
  logp, ref = random_logps(5)
  got = names.compute_kl_divergence(jnp.asarray(logp, jnp.bfloat16), jnp.asarray(ref, jnp.bfloat16))
  assert got.dtype == jnp.float32
  rounded = np.asarray(jnp.asarray(logp, jnp.bfloat16), np.float64)
  rounded_ref = np.asarray(jnp.asarray(ref, jnp.bfloat16), np.float64)
  np.testing.assert_allclose(got, np_kl(rounded, rounded_ref, "k3"), rtol=1e-5, atol=1e-5)


def test_unknown_method_names_method_and_lists_accepted():
  with pytest.raises(ValueError, match=r"'low_var'.*accepted.*low_var_kl"):
    names.compute_kl_divergence(np.zeros(3), np.zeros(3), "low_var")
  with pytest.raises(ValueError, match="clamp_value"):
    names.compute_kl_divergence(np.zeros(3), np.zeros(3), "kl", clamp_value=-1.0)
  for bad in ("1", float("nan"), True, [1.0]):  # one line naming the argument, no TypeError
    with pytest.raises(ValueError, match=r"clamp_value=.* is invalid: must be a finite number"):
      names.compute_kl_divergence(np.zeros(3), np.zeros(3), "kl", clamp_value=bad)


@settings(max_examples=30, deadline=None)
@given(
  st.lists(st.floats(-1e4, 0.0, width=32), min_size=1, max_size=8),
  st.sampled_from(BASE_METHODS),
)
def test_property_plus_variant_value_and_k2_gradient(values, method):
  logp = jnp.asarray(values, jnp.float32)
  ref = logp[::-1] - 0.5
  plus = names.compute_kl_divergence(logp, ref, method + "+")
  base = names.compute_kl_divergence(logp, ref, method)
  np.testing.assert_array_equal(plus, base)
  g_plus = jax.grad(lambda x: jnp.sum(names.compute_kl_divergence(x, ref, method + "+")))(logp)
  g_k2 = jax.grad(lambda x: jnp.sum(names.compute_kl_divergence(x, ref, "k2")))(logp)
  np.testing.assert_array_equal(g_plus, g_k2)


def test_fixed_controller():
  ctrl = kl.FixedKLController(0.3)
  ctrl.update(5.0, 10)
  assert ctrl.value == 0.3
  with pytest.raises(ValueError, match="kl_coef"):
    kl.FixedKLController(-0.1)


def test_adaptive_controller_follows_ziegler_and_restores():
  ctrl = kl.AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
  expected = 0.2
  for current, n in [(0.5, 8), (0.1, 8), (0.0, 16), (0.12, 4)]:
    ctrl.update(current, n)
    err = np.clip(current / 0.1 - 1.0, -0.2, 0.2)
    expected *= 1.0 + err * n / 100
    assert ctrl.value == pytest.approx(expected, rel=1e-12)
  restored = kl.AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
  restored.load_state_dict(ctrl.state_dict())
  assert restored.value == ctrl.value


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(init_kl_coef=0.1, target_kl=0.1, horizon=0), "horizon"),
    (dict(init_kl_coef=0.1, target_kl=0.0, horizon=10), "target_kl"),
    (dict(init_kl_coef=-0.1, target_kl=0.1, horizon=10), "init_kl_coef"),
    (dict(init_kl_coef=0.1, target_kl=None, horizon=10), "target_kl"),
  ],
)
def test_adaptive_controller_rejects_bad_arguments(kwargs, field):
  with pytest.raises(ValueError, match=field):
    kl.AdaptiveKLController(**kwargs)


def test_make_kl_controller():
  assert isinstance(kl.make_kl_controller("fixed", 0.1), kl.FixedKLController)
  assert isinstance(kl.make_kl_controller("adaptive", 0.1, 0.1, 10), kl.AdaptiveKLController)
  with pytest.raises(ValueError, match="kl_ctrl"):
    kl.make_kl_controller("pid", 0.1)
