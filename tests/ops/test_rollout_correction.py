"""Rollout correction (TIS weights, rejection masks) against NumPy references from verl's
definitions: w = pi_old / pi_sampler, in log space, per token or per sequence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.losses import np_masked_mean
from tunix_ppo_ext._src.ops import rollout_correction as rc

pytestmark = pytest.mark.fast


def gap_batch(seed=0, b=5, t=6, spread=0.4):
  """`(trainer, sampler, mask)`: an empty row, a one-token row, a ratio of 1e4."""
  rng = np.random.default_rng(seed)
  trainer = rng.normal(-1.5, 0.5, (b, t)).astype(np.float32)
  sampler = (trainer + rng.normal(0, spread, (b, t))).astype(np.float32)
  sampler[0, 1] = trainer[0, 1] - np.log(1e4)
  mask = (rng.random((b, t)) < 0.8).astype(np.float32)
  mask[0, 1] = 1.0
  mask[2] = 0.0
  mask[3] = 0.0
  mask[3, 2] = 1.0
  return trainer, sampler, mask


def np_is(trainer, sampler, mask, level, threshold):
  lr = (np.float64(trainer) - sampler) * mask
  if level == "sequence":
    lr = np.repeat(lr.sum(-1, keepdims=True), lr.shape[1], axis=1)
  w = np.exp(np.clip(lr, -20, 20)) * mask
  m = mask > 0
  wc = np.clip(w, 1 / threshold, threshold)
  metrics = {
    "is_mean": w[m].mean(),
    "is_max": w[m].max(),
    "is_std": wc[m].std(),
    "is_ess": 1.0 / np.mean((wc[m] / wc[m].mean()) ** 2),
    "is_frac_high": np.mean(lr[m] > np.log(threshold)),
    "is_frac_low": np.mean(lr[m] < -np.log(threshold)),
  }
  return np.minimum(w, threshold), metrics


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_is_weights_and_metrics_match_reference(level):
  trainer, sampler, mask = gap_batch(1)
  weights, metrics = rc.rollout_is_weights(trainer, sampler, mask, level=level, threshold=2.0)
  expected, expected_metrics = np_is(trainer, sampler, mask, level, 2.0)
  np.testing.assert_allclose(np.asarray(weights), expected, rtol=1e-5, atol=1e-6)
  for name, value in expected_metrics.items():
    np.testing.assert_allclose(float(metrics[name]), value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_is_weights_stop_gradient_bfloat16_and_empty_mask():
  trainer, sampler, mask = gap_batch(2)
  grad = jax.grad(lambda x: jnp.sum(rc.rollout_is_weights(x, sampler, mask)[0]))(trainer)
  assert not np.asarray(grad).any()
  bf = [jnp.asarray(x, jnp.bfloat16) for x in (trainer, sampler)]
  np.testing.assert_allclose(
    np.asarray(rc.rollout_is_weights(*bf, mask)[0]),
    np_is(*[np.asarray(x, np.float32) for x in bf], mask, "token", 2.0)[0],
    rtol=1e-5,
    atol=1e-6,
  )
  weights, metrics = rc.rollout_is_weights(trainer, sampler, np.zeros_like(mask))
  assert not np.asarray(weights).any()
  assert all(float(v) == 0.0 for v in metrics.values()), metrics


def np_rs(trainer, sampler, mask, mode, upper, lower=None):
  lr = np.clip((np.float64(trainer) - sampler) * mask, -20, 20)
  level, kind = mode.rsplit("_", 1)
  stat = {"k1": -lr, "k2": 0.5 * lr**2, "k3": np.exp(lr) - 1 - lr}[kind]
  keep = np.ones_like(lr, bool)
  for b in range(lr.shape[0]):
    m = mask[b] > 0
    if not m.any():
      continue
    if level == "token":
      s = stat[b]
    else:
      reduce = {"seq_sum": np.sum, "seq_mean": np.mean, "seq_max": np.max}[level]
      s = np.full(lr.shape[1], reduce(stat[b][m]))
    if kind == "k1":
      lo = np.log(1 / upper if lower is None else lower)
      ok = (s >= lo) & (s <= np.log(upper))
    else:
      ok = s <= upper
    keep[b] = ok | ~m
  return keep


@pytest.mark.parametrize(
  "mode, upper, lower",
  [
    ("token_k1", 2.0, None),
    ("token_k1", 1.5, 0.9),
    ("seq_sum_k1", 3.0, None),
    ("seq_mean_k1", 1.3, None),
    ("token_k2", 0.05, None),
    ("seq_mean_k3", 0.05, None),
    ("seq_max_k2", 0.1, None),
  ],
)
def test_rejection_mask_matches_reference(mode, upper, lower):
  trainer, sampler, mask = gap_batch(3)
  keep, metrics = rc.rollout_rejection_mask(
    trainer, sampler, mask, mode=mode, upper=upper, lower=lower
  )
  expected = np_rs(trainer, sampler, mask, mode, upper, lower)
  np.testing.assert_array_equal(np.asarray(keep) > 0, expected)
  rejected = ~expected
  np.testing.assert_allclose(float(metrics["rs_masked_frac"]), np_masked_mean(rejected, mask), 1e-6)
  rows = mask.sum(-1) > 0
  seq_frac = (rejected & (mask > 0)).any(-1)[rows].mean()
  np.testing.assert_allclose(float(metrics["rs_seq_masked_frac"]), seq_frac, 1e-6)


def test_rs_bounds_refuse_bad_thresholds():
  with pytest.raises(ValueError, match="rollout_rs must be one of"):
    rc.rs_bounds("token_k4", 2.0)
  with pytest.raises(ValueError, match="upper threshold only"):
    rc.rs_bounds("token_k2", 2.0, 0.5)
  with pytest.raises(ValueError, match="lower < upper"):
    rc.rs_bounds("token_k1", 2.0, 3.0)
  with pytest.raises(ValueError, match="> 0"):
    rc.rs_bounds("seq_mean_k1", -1.0)


@settings(max_examples=10)
@given(seed=st.integers(0, 10_000), threshold=st.floats(1.01, 10.0))
def test_truncation_and_band_properties(seed, threshold):
  """Weights lie in [0, threshold]; sequence weights are constant along a row; a wider band
  rejects no more than a narrower one; no metric is NaN."""
  trainer, sampler, mask = gap_batch(seed, spread=1.0)
  for level in rc.ROLLOUT_IS_LEVELS:
    weights, metrics = rc.rollout_is_weights(
      trainer, sampler, mask, level=level, threshold=threshold
    )
    w = np.asarray(weights)
    assert (w >= 0).all() and (w <= threshold + 1e-6).all()
    assert all(np.isfinite(float(v)) for v in metrics.values())
    if level == "sequence":
      for row, m in zip(w, mask > 0, strict=True):
        assert np.ptp(row[m]) == 0 if m.any() else True
  narrow = rc.rollout_rejection_mask(trainer, sampler, mask, mode="token_k1", upper=threshold)[0]
  wide = rc.rollout_rejection_mask(trainer, sampler, mask, mode="token_k1", upper=threshold * 2)[0]
  assert (np.asarray(wide) >= np.asarray(narrow)).all()
