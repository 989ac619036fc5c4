"""Policy/value losses and aggregation against NumPy references written from the formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.losses import RTOL, np_aggregate, np_masked_mean, random_batch
from tunix_ppo_ext._src.ops import kl
from tunix_ppo_ext._src.ops import ppo_losses as losses

pytestmark = pytest.mark.fast

ATOL = 1e-6
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def np_kl_k3(logp, ref):
  x = np.clip(np.asarray(ref, np.float64) - logp, -20, 20)
  return np.exp(x) - x - 1


def np_policy_loss(
  logp,
  old,
  adv,
  mask,
  eps_low,
  eps_high,
  eps_c,
  mode,
  ent=None,
  ent_coef=0.0,
  ref=None,
  kl_coef=0.0,
):
  """Per-token loop over the PPO formulas, float64."""
  logp, old = np.asarray(logp, np.float64), np.asarray(old, np.float64)
  adv = np.asarray(adv, np.float64)
  if adv.ndim == 1:
    adv = np.repeat(adv[:, None], logp.shape[1], axis=1)
  per_token = np.zeros_like(logp)
  clipfrac = np.zeros_like(logp)
  lower = np.zeros_like(logp)
  for b in range(logp.shape[0]):
    for t in range(logp.shape[1]):
      a = adv[b, t]
      r = np.exp(np.clip(logp[b, t] - old[b, t], -20, 20))
      pg1 = -a * r
      pg2 = -a * min(max(r, 1 - eps_low), 1 + eps_high)
      clipped = max(pg1, pg2)
      clipfrac[b, t] = float(pg2 > pg1)
      loss = clipped
      if eps_c is not None and a < 0:
        pg3 = -a * eps_c
        loss = min(clipped, pg3)
        lower[b, t] = float(clipped > pg3)
      per_token[b, t] = loss
  pg_loss = np_aggregate(per_token, mask, mode)
  total = pg_loss
  metrics = {
    "pg_loss": pg_loss,
    "pg_clipfrac": np_masked_mean(clipfrac, mask),
    "pg_clipfrac_lower": np_masked_mean(lower, mask),
    "ppo_kl": np_masked_mean(old - logp, mask),
  }
  if ent is not None:
    metrics["entropy"] = np_aggregate(ent, mask, mode)
    total -= ent_coef * metrics["entropy"]
  if ref is not None:
    metrics["kl_loss"] = np_aggregate(np_kl_k3(logp, ref), mask, mode)
    total += kl_coef * metrics["kl_loss"]
  return total, metrics


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_matches_reference(mode):
  _, _, x, mask, _, _ = random_batch(0)
  np.testing.assert_allclose(
    losses.aggregate_loss(x, mask, mode), np_aggregate(x, mask, mode), rtol=RTOL, atol=ATOL
  )


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_empty_mask_is_zero(mode):
  out = losses.aggregate_loss(jnp.ones((3, 4)), jnp.zeros((3, 4)), mode)
  assert float(out) == 0.0


def test_aggregate_unknown_mode_suggests_closest():
  with pytest.raises(ValueError, match="did you mean 'token-mean'|Did you mean 'token-mean'"):
    losses.aggregate_loss(jnp.ones((1, 2)), jnp.ones((1, 2)), "token_mean")


@settings(max_examples=30, deadline=None)
@given(
  st.floats(-100, 100, width=32),
  st.sampled_from(["token-mean", "seq-mean-token-mean"]),
  st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_property_constant_loss_aggregates_to_constant(c, mode, bits):
  mask = np.asarray(bits, np.float32).reshape(2, 3)
  mask[0, 0] = 1.0  # at least one token
  out = losses.aggregate_loss(jnp.full((2, 3), c, jnp.float32), mask, mode)
  np.testing.assert_allclose(out, c, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("eps_c", [None, 3.0])
@pytest.mark.parametrize("per_sequence_adv", [False, True])
def test_policy_loss_matches_reference(mode, eps_c, per_sequence_adv):
  logp, old, adv, mask, ent, ref = random_batch(2, log_ratio_scale=1.5)
  if per_sequence_adv:
    adv = adv[:, 0]
  loss, metrics = losses.policy_loss(
    logp,
    old,
    adv,
    mask,
    epsilon_low=0.1,
    epsilon_high=0.28,
    epsilon_c=eps_c,
    loss_agg_mode=mode,
    entropy=ent,
    entropy_coef=0.01,
    ref_per_token_logps=ref,
    kl_loss_coef=0.05,
    kl_estimator=kl.kl_k3,
  )
  ref_loss, ref_metrics = np_policy_loss(
    logp, old, adv, mask, 0.1, 0.28, eps_c, mode, ent, 0.01, ref, 0.05
  )
  np.testing.assert_allclose(loss, ref_loss, rtol=RTOL, atol=ATOL)
  assert set(ref_metrics) <= set(metrics)
  for key, value in ref_metrics.items():
    np.testing.assert_allclose(metrics[key], value, rtol=RTOL, atol=ATOL, err_msg=key)


def test_dual_clip_triggers_on_negative_advantages():
  # Large ratio with negative advantage: clipped loss -A*r exceeds -A*eps_c.
  logp = np.array([[2.0, 2.0, 0.0]], np.float32)
  old = np.zeros((1, 3), np.float32)
  adv = np.array([[-1.0, 1.0, -1.0]], np.float32)
  mask = np.ones((1, 3), np.float32)
  loss, metrics = losses.policy_loss(logp, old, adv, mask, epsilon_c=3.0)
  # token 0: r=e^2=7.39, pg1=7.39, pg2=1.2, clipped=7.39 > pg3=3 -> 3
  # token 1: A>0 -> max(-7.39, -1.2) = -1.2 ; token 2: r=1 -> 1
  np.testing.assert_allclose(loss, (3.0 - 1.2 + 1.0) / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["pg_clipfrac_lower"], 1 / 3, rtol=1e-6)
  no_dual, m = losses.policy_loss(logp, old, adv, mask)
  np.testing.assert_allclose(no_dual, (np.exp(2.0) - 1.2 + 1.0) / 3, rtol=1e-6)
  assert float(m["pg_clipfrac_lower"]) == 0.0


def test_policy_loss_gradient_matches_analytic():
  logp, old, adv, mask, _, _ = random_batch(3, log_ratio_scale=0.5)
  grad = jax.grad(lambda lp: losses.policy_loss(lp, old, adv, mask, epsilon_c=3.0)[0])(
    jnp.asarray(logp)
  )
  r = np.exp(logp.astype(np.float64) - old)
  # unclipped branch active where -A r >= -A clip(r) and not dual-clipped: d/dlogp = -A r / N
  clip_r = np.clip(r, 0.8, 1.2)
  active = ((-adv * r) >= (-adv * clip_r)) & ~((adv < 0) & (-adv * r > -adv * 3.0))
  expected = np.where(active, -adv * r, 0.0) * mask / mask.sum()
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_policy_loss_finite_for_huge_log_ratios(dtype):
  logp = jnp.asarray([[0.0, -1e4, 1e4, -5.0]], dtype)
  old = jnp.asarray([[-1e4, 0.0, 0.0, -5.0]], dtype)
  adv = jnp.asarray([[-2.0, 3.0, -1.0, 1.0]], dtype)
  mask = jnp.ones((1, 4))
  ref = jnp.asarray([[-1e4, 1e4, 0.0, 0.0]], dtype)
  for eps_c in [None, 3.0]:

    def f(lp, eps_c=eps_c):
      return losses.policy_loss(
        lp,
        old,
        adv,
        mask,
        epsilon_c=eps_c,
        ref_per_token_logps=ref,
        kl_loss_coef=0.1,
        entropy=jnp.ones((1, 4)),
        entropy_coef=0.1,
      )

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(logp)
    assert np.isfinite(float(loss))
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert np.all(np.isfinite(np.asarray(grad, np.float32)))


@settings(max_examples=25, deadline=None)
@given(st.floats(-1e4, 1e4, width=32), st.floats(-10, 10, width=32))
def test_property_policy_loss_finite(log_ratio, a):
  logp = jnp.asarray([[log_ratio, 0.0]], jnp.float32)
  loss, _ = losses.policy_loss(
    logp, jnp.zeros((1, 2)), jnp.asarray([[a, -a]]), jnp.ones((1, 2)), epsilon_c=3.0
  )
  assert np.isfinite(float(loss))


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(epsilon_low=0.0), "epsilon_low"),
    (dict(epsilon_low=1.0), "epsilon_low"),
    (dict(epsilon_high=-0.1), "epsilon_high"),
    (dict(epsilon_c=1.0), "epsilon_c"),
    (dict(loss_agg_mode="mean"), "loss_agg_mode"),
  ],
)
def test_policy_loss_rejects_bad_arguments(kwargs, field):
  x = jnp.zeros((1, 2))
  with pytest.raises(ValueError, match=field):
    losses.policy_loss(x, x, x, x, **kwargs)


def np_value_loss(v, old, ret, mask, c, mode):
  v, old, ret = (np.asarray(a, np.float64) for a in (v, old, ret))
  unclipped = (v - ret) ** 2
  clipped = (np.clip(v, old - c, old + c) - ret) ** 2
  per_token = np.maximum(unclipped, clipped)
  return 0.5 * np_aggregate(per_token, mask, mode), np_masked_mean(clipped > unclipped, mask)


@pytest.mark.parametrize("mode", MODES)
def test_value_loss_matches_reference(mode):
  rng = np.random.default_rng(4)
  v, old, ret = (rng.normal(size=(4, 6)).astype(np.float32) for _ in range(3))
  mask = (rng.random((4, 6)) > 0.4).astype(np.float32)
  mask[2] = 0
  loss, metrics = losses.value_loss(v, old, ret, mask, clip_range_value=0.2, loss_agg_mode=mode)
  ref_loss, ref_clipfrac = np_value_loss(v, old, ret, mask, 0.2, mode)
  np.testing.assert_allclose(loss, ref_loss, rtol=RTOL)
  np.testing.assert_allclose(metrics["vf_loss"], ref_loss, rtol=RTOL)
  np.testing.assert_allclose(metrics["vf_clipfrac"], ref_clipfrac, rtol=RTOL)
  np.testing.assert_allclose(metrics["vpred_mean"], np_masked_mean(v, mask), rtol=RTOL, atol=ATOL)


def test_value_loss_rejects_bad_clip_range():
  x = jnp.zeros((1, 2))
  with pytest.raises(ValueError, match="clip_range_value"):
    losses.value_loss(x, x, x, x, clip_range_value=0.0)


def test_entropy_from_logits_matches_reference():
  rng = np.random.default_rng(5)
  logits = rng.normal(size=(2, 3, 7)) * 3
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  expected = -(p * np.log(p)).sum(-1)
  got = losses.entropy_from_logits(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32))
  assert got.dtype == jnp.float32
  got32 = losses.entropy_from_logits(jnp.asarray(logits, jnp.float32))
  np.testing.assert_allclose(got32, expected, rtol=RTOL, atol=ATOL)
  assert got.shape == (2, 3)
