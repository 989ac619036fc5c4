"""verl's other policy losses against NumPy references written from the papers' formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.losses import np_aggregate, np_masked_mean
from tunix_ppo_ext._src.ops import verl_losses as pl

pytestmark = pytest.mark.fast

RTOL, ATOL = 1e-5, 1e-6


def awkward_batch(seed=0, b=5, t=7, huge=False):
  """`(logp, old, adv [B, T], mask)`: an empty row, a one-token row, negative advantages,
  and with `huge` log-ratios up to log(1e4) and beyond."""
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1.5, 0.6, (b, t)).astype(np.float32)
  old = (logp + rng.normal(0, 0.3, (b, t))).astype(np.float32)
  if huge:
    old[0, :3] = logp[0, :3] - np.log(1e4)
    old[1, :2] = logp[1, :2] + 30.0
  adv = rng.normal(0, 1, (b, t)).astype(np.float32)
  mask = (rng.random((b, t)) < 0.7).astype(np.float32)
  mask[2] = 0.0
  mask[3] = 0.0
  mask[3, 4] = 1.0
  return logp, old, adv, mask


def np_ratio(logp, old, limit=20.0):
  return np.exp(np.clip(np.float64(logp) - old, -limit, limit))


def np_gspo(logp, old, adv, mask, el, eh, w=None):
  logp, old, adv = map(np.float64, (logp, old, adv))
  lr = logp - old
  per_token = np.zeros_like(lr)
  for b in range(lr.shape[0]):
    n = mask[b].sum()
    s = np.exp(min((lr[b] * mask[b]).sum() / max(n, 1), 10.0))
    per_token[b] = np.maximum(-adv[b] * s, -adv[b] * np.clip(s, 1 - el, 1 + eh))
  if w is not None:
    per_token *= w
  return np_aggregate(per_token, mask, "seq-mean-token-mean")


def np_sapo(logp, old, adv, mask, tau_pos, tau_neg):
  r = np_ratio(logp, old)
  tau = np.where(adv > 0, tau_pos, tau_neg)
  gate = 4.0 / tau / (1.0 + np.exp(-tau * (r - 1.0)))
  return np_aggregate(-gate * adv, mask, "seq-mean-token-mean")


def np_geo_mean(logp, old, adv, mask, el, eh):
  per_seq = []
  for b in range(logp.shape[0]):
    m = mask[b] > 0
    if not m.any():
      continue
    lr = np.float64(logp[b][m]) - old[b][m]
    a = np.float64(adv[b][m])
    # the pessimistic side: for A > 0 the smaller of l and clip(l), for A < 0 the larger
    clipped = np.clip(lr, -el, eh)
    lr_min = np.where(a > 0, np.minimum(lr, clipped), np.where(a < 0, np.maximum(lr, clipped), 0))
    ratio = np.exp(np.clip(lr_min.mean(), -20, 20))
    per_seq.append(-a.mean() * ratio)
  return float(np.mean(per_seq)) if per_seq else 0.0


def np_cispo(logp, old, adv, mask, el, eh, mode):
  r = np_ratio(logp, old)
  return np_aggregate(-np.clip(r, 1 - el, 1 + eh) * adv * logp, mask, mode)


def np_cov(adv, logp, mask):
  m = mask > 0
  a_mean = adv[m].mean() if m.any() else 0.0
  l_mean = np.float64(logp)[m].mean() if m.any() else 0.0
  return (np.float64(adv) - a_mean) * (np.float64(logp) - l_mean)


def np_kl_cov(logp, old, adv, mask, ratio_k, coef, mode):
  lr = np.float64(logp) - old
  per_token = -adv * np_ratio(logp, old)
  valid = np.flatnonzero(mask.reshape(-1) > 0)
  if valid.size:
    cov = np_cov(adv, logp, mask).reshape(-1)[valid]
    k = max(1, int(valid.size * ratio_k))
    top = valid[np.argsort(-cov, kind="stable")[:k]]
    flat = per_token.reshape(-1)
    flat[top] += coef * np.abs(lr.reshape(-1)[top])
    per_token = flat.reshape(lr.shape)
  return np_aggregate(per_token, mask, mode)


def np_clip_cov_candidates(logp, old, adv, mask, el, eh, lb, ub):
  r = np_ratio(logp, old)
  clip_bound = -adv * np.clip(r, 1 - el, 1 + eh) > -adv * r
  cov = np_cov(adv, logp, mask)
  return (mask > 0) & ~clip_bound & (cov > lb) & (cov < ub)


@pytest.mark.parametrize("huge", [False, True])
@pytest.mark.parametrize("per_seq_adv", [False, True])
def test_gspo_matches_reference(huge, per_seq_adv):
  logp, old, adv, mask = awkward_batch(1, huge=huge)
  if per_seq_adv:
    adv = adv[:, 0]
  loss, metrics = pl.gspo_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28)
  full_adv = np.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape)
  expected = np_gspo(logp, old, full_adv, mask, 0.2, 0.28)
  np.testing.assert_allclose(float(loss), expected, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(float(metrics["ppo_kl"]), np_masked_mean(old - logp, mask), 1e-5)


def test_gspo_gradient_is_sequence_ratio_times_token_gradient():
  """GSPO-token: d loss / d logp_t = -A s_i / n_i / rows for unclipped tokens."""
  logp = jnp.array([[-1.0, -2.0, -0.5]], jnp.float32)
  old = logp - 0.01
  adv = jnp.array([[1.0, 1.0, 1.0]])
  mask = jnp.array([[1.0, 1.0, 0.0]])
  grad = jax.grad(lambda x: pl.gspo_loss(x, old, adv, mask)[0])(logp)
  s = np.exp(0.01)
  np.testing.assert_allclose(np.asarray(grad), [[-s / 2, -s / 2, 0.0]], rtol=1e-5)


@pytest.mark.parametrize("huge", [False, True])
def test_sapo_matches_reference(huge):
  logp, old, adv, mask = awkward_batch(2, huge=huge)
  loss, metrics = pl.sapo_loss(logp, old, adv, mask, tau_pos=1.0, tau_neg=1.05)
  np.testing.assert_allclose(float(loss), np_sapo(logp, old, adv, mask, 1.0, 1.05), RTOL, ATOL)
  assert float(metrics["pg_clipfrac"]) == 0.0


def test_sapo_gate_has_slope_one_at_ratio_one():
  """At r = 1 the gate's gradient equals the unclipped surrogate's: d/dlogp (-A r) = -A."""
  logp = jnp.zeros((1, 2), jnp.float32)
  adv = jnp.array([[2.0, -3.0]])
  mask = jnp.ones((1, 2))
  grad = jax.grad(lambda x: pl.sapo_loss(x, logp, adv, mask)[0])(logp)
  np.testing.assert_allclose(np.asarray(grad), -np.asarray(adv) / 2, rtol=1e-5)


@pytest.mark.parametrize("huge", [False, True])
def test_geo_mean_matches_reference(huge):
  logp, old, adv, mask = awkward_batch(3, huge=huge)
  loss, metrics = pl.geo_mean_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.3)
  expected = np_geo_mean(logp, old, adv, mask, 0.2, 0.3)
  np.testing.assert_allclose(float(loss), expected, rtol=RTOL, atol=ATOL)
  changed = (np.float64(logp) - old > 0.3) | (np.float64(logp) - old < -0.2)
  np.testing.assert_allclose(
    float(metrics["pg_clipfrac"]), np_masked_mean(changed & (adv > 0), mask), 1e-5
  )
  np.testing.assert_allclose(
    float(metrics["pg_clipfrac_lower"]), np_masked_mean(changed & (adv < 0), mask), 1e-5
  )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("huge", [False, True])
def test_cispo_matches_reference(mode, huge):
  logp, old, adv, mask = awkward_batch(4, huge=huge)
  loss, metrics = pl.cispo_loss(logp, old, adv, mask, epsilon_high=0.28, loss_agg_mode=mode)
  expected = np_cispo(logp, old, adv, mask, 0.2, 0.28, mode)
  np.testing.assert_allclose(float(loss), expected, rtol=RTOL, atol=ATOL)
  r = np_ratio(logp, old)
  np.testing.assert_allclose(
    float(metrics["pg_clipfrac"]), np_masked_mean((r < 0.8) | (r > 1.28), mask), 1e-5
  )


def test_cispo_clipped_tokens_keep_their_gradient():
  """Unlike PPO's clip, CISPO's clipped tokens still get -sg(clip(r)) A d logp."""
  logp = jnp.array([[0.0, 0.0]], jnp.float32)
  old = jnp.array([[-5.0, 0.0]], jnp.float32)  # first ratio e^5, clipped to 1.2
  adv, mask = jnp.ones((1, 2)), jnp.ones((1, 2))
  grad = jax.grad(lambda x: pl.cispo_loss(x, old, adv, mask)[0])(logp)
  np.testing.assert_allclose(np.asarray(grad), [[-1.2 / 2, -1.0 / 2]], rtol=1e-5)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_gpg_matches_reference(mode):
  logp, old, adv, mask = awkward_batch(5)
  loss, _ = pl.gpg_loss(logp, old, adv, mask, loss_agg_mode=mode)
  expected = np_aggregate(-np.float64(adv) * logp, mask, mode)
  np.testing.assert_allclose(float(loss), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("ratio_k", [0.0002, 0.2, 1.0])
@pytest.mark.parametrize("huge", [False, True])
def test_kl_cov_matches_reference(ratio_k, huge):
  logp, old, adv, mask = awkward_batch(6, huge=huge)
  loss, metrics = pl.kl_cov_loss(logp, old, adv, mask, kl_cov_ratio=ratio_k, ppo_kl_coef=0.1)
  expected = np_kl_cov(logp, old, adv, mask, ratio_k, 0.1, "token-mean")
  np.testing.assert_allclose(float(loss), expected, rtol=RTOL, atol=ATOL)
  lr = np.abs(np.float64(logp) - old)
  np.testing.assert_allclose(float(metrics["ppo_kl"]), np_masked_mean(lr, mask), rtol=1e-5)


def test_clip_cov_takes_every_candidate_when_fewer_than_k():
  """With k >= the candidates the choice is deterministic: compare with the reference."""
  logp, old, adv, mask = awkward_batch(7)
  candidates = np_clip_cov_candidates(logp, old, adv, mask, 0.2, 0.2, 0.1, 2.0)
  assert 0 < candidates.sum() < mask.sum()
  loss, metrics = pl.clip_cov_loss(
    logp, old, adv, mask, jax.random.key(0), clip_cov_ratio=1.0, clip_cov_lb=0.1, clip_cov_ub=2.0
  )
  r = np_ratio(logp, old)
  per_token = np.maximum(-adv * r, -adv * np.clip(r, 0.8, 1.2)) * (1.0 - candidates)
  np.testing.assert_allclose(float(loss), np_aggregate(per_token, mask, "token-mean"), 1e-5, 1e-6)
  np.testing.assert_allclose(float(metrics["pg_clipfrac"]), np_masked_mean(candidates, mask), 1e-6)


def test_clip_cov_random_subset_is_reproducible_and_among_candidates():
  logp, old, adv, mask = awkward_batch(8, b=6, t=40)
  candidates = np_clip_cov_candidates(logp, old, adv, mask, 0.2, 0.2, 0.1, 2.0)
  k = max(int(0.05 * mask.sum()), 1)
  assert candidates.sum() > k
  r = np_ratio(logp, old)
  clip_bound = -adv * np.clip(r, 0.8, 1.2) > -adv * r  # no gradient there anyway

  def zeroed(seed):
    kw = dict(clip_cov_ratio=0.05, clip_cov_lb=0.1, clip_cov_ub=2.0)
    grad = jax.grad(lambda x: pl.clip_cov_loss(x, old, adv, mask, jax.random.key(seed), **kw)[0])
    return (np.asarray(grad(jnp.asarray(logp))) == 0) & (mask > 0) & ~clip_bound

  first, again, other = zeroed(0), zeroed(0), zeroed(1)
  np.testing.assert_array_equal(first, again)
  assert first.sum() == k and (first <= candidates).all()
  assert other.sum() == k and (other <= candidates).all() and (first != other).any()


ALL_LOSSES = {
  "gspo": lambda *a, **k: pl.gspo_loss(*a, **k),
  "sapo": lambda *a, **k: pl.sapo_loss(*a, **k),
  "geo_mean": lambda *a, **k: pl.geo_mean_loss(*a, **k),
  "cispo": lambda *a, **k: pl.cispo_loss(*a, **k),
  "gpg": lambda *a, **k: pl.gpg_loss(*a, **k),
  "kl_cov": lambda *a, **k: pl.kl_cov_loss(*a, kl_cov_ratio=0.3, **k),
  "clip_cov": lambda *a, **k: pl.clip_cov_loss(*a, jax.random.key(3), clip_cov_ratio=0.3, **k),
}


@pytest.mark.parametrize("name", sorted(ALL_LOSSES))
def test_empty_mask_bfloat16_and_unit_weights(name):
  """Empty mask: loss and metrics 0, never NaN; bfloat16 inputs match their float32 value;
  unit importance weights change nothing; the four metric keys are always there."""
  fn = ALL_LOSSES[name]
  logp, old, adv, mask = awkward_batch(9, huge=True)
  loss, metrics = fn(logp, old, adv, np.zeros_like(mask))
  assert float(loss) == 0.0 and all(float(v) == 0.0 for v in metrics.values()), metrics
  assert set(metrics) == {"pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}
  bf = [jnp.asarray(x, jnp.bfloat16) for x in (logp, old, adv)]
  as_f32 = [np.asarray(x, np.float32) for x in bf]
  np.testing.assert_allclose(
    float(fn(*bf, mask)[0]), float(fn(*as_f32, mask)[0]), rtol=RTOL, atol=ATOL
  )
  weighted = fn(logp, old, adv, mask, is_weights=np.ones_like(mask))[0]
  np.testing.assert_allclose(float(weighted), float(fn(logp, old, adv, mask)[0]), 1e-6, 1e-7)


@settings(max_examples=10)
@given(
  seed=st.integers(0, 10_000),
  scale=st.floats(0.01, 10.0),
  name=st.sampled_from(sorted(ALL_LOSSES)),
)
def test_losses_finite_and_weights_scale_linearly(seed, scale, name):
  """Finite for any inputs; except for geo_mean (geometric mean of weights, also linear in a
  constant) a constant importance weight c scales the loss by c."""
  fn = ALL_LOSSES[name]
  logp, old, adv, mask = awkward_batch(seed, huge=seed % 2 == 0)
  loss = float(fn(logp, old, adv, mask)[0])
  scaled, metrics = fn(logp, old, adv, mask, is_weights=np.full_like(mask, scale))
  assert np.isfinite(loss) and all(np.isfinite(float(v)) for v in metrics.values())
  np.testing.assert_allclose(float(scaled), scale * loss, rtol=1e-4, atol=1e-5)


@settings(max_examples=8)
@given(seed=st.integers(0, 10_000))
def test_on_policy_ratio_one_losses_agree(seed):
  """At logp == old every ratio is 1: GSPO and GMPO (with sequence advantages) reduce to
  -agg(A), SAPO to -agg(2 A / tau) (its gate is 2 / tau at r = 1), CISPO and GPG to
  -agg(A logp)."""
  logp, _, adv, mask = awkward_batch(seed)
  seq_adv = adv[:, 0]
  minus_a = -np_aggregate(
    np.broadcast_to(seq_adv[:, None], logp.shape), mask, "seq-mean-token-mean"
  )
  for fn in (pl.gspo_loss, pl.geo_mean_loss):
    np.testing.assert_allclose(float(fn(logp, logp, seq_adv, mask)[0]), minus_a, 1e-5, 1e-6)
  sapo = pl.sapo_loss(logp, logp, seq_adv, mask, tau_pos=2.0, tau_neg=2.0)[0]
  np.testing.assert_allclose(float(sapo), minus_a, 1e-5, 1e-6)
  expected = np_aggregate(-np.float64(adv) * logp, mask, "token-mean")
  for fn in (pl.cispo_loss, pl.gpg_loss):
    np.testing.assert_allclose(float(fn(logp, logp, adv, mask)[0]), expected, 1e-5, 1e-6)
