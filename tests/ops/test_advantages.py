"""Tests for tunix_ppo_ext._src.ops.advantages against independent float64 NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tests.helpers.advantages import SEEDS, TOL, B, T, make_mask, ref_gae, ref_whiten
from tests.helpers.numeric import flush_subnormals
from tunix_ppo_ext._src.ops.advantages import (
  compute_gae_advantages,
  compute_gigpo_advantages,
  compute_grpo_advantages,
  compute_reinforce_plus_plus_advantages,
  compute_rloo_advantages,
  compute_turn_gae_advantages,
)
from tunix_ppo_ext._src.plugins import registry

pytestmark = pytest.mark.fast

HB, HT = 4, 8  # fixed shapes for the hypothesis tests
HYP = settings(max_examples=30, deadline=None)

# ------------------------------------------------------------------------------------
# Independent float64 references, written from the formulas with explicit loops.
# ------------------------------------------------------------------------------------


def _groups(ids):
  groups: dict[int, list[int]] = {}
  for i, g in enumerate(ids):
    groups.setdefault(int(g), []).append(i)
  return groups


def ref_grpo(scores, ids, m, norm_by_std=True, eps=1e-6):
  s = np.asarray(scores, np.float64)
  adv = np.zeros_like(s)
  for members in _groups(ids).values():
    vals = s[members]
    if len(members) == 1:
      mean, std = 0.0, 1.0
    else:
      mean, std = vals.mean(), vals.std(ddof=1)
    for i in members:
      adv[i] = (s[i] - mean) / (std + eps) if norm_by_std else s[i] - mean
  return adv[:, None] * np.asarray(m, np.float64)


def ref_rloo(scores, ids, m):
  s = np.asarray(scores, np.float64)
  adv = s.copy()
  for members in _groups(ids).values():
    n = len(members)
    if n > 1:
      for i in members:
        others = [s[j] for j in members if j != i]
        adv[i] = s[i] - sum(others) / (n - 1)
  return adv[:, None] * np.asarray(m, np.float64)


def ref_rpp(r, m, gamma):
  """REINFORCE++ returns-to-go over each row's agent tokens only (observations removed),
  scattered back; 0 elsewhere."""
  r, m = np.asarray(r, np.float64), np.asarray(m, np.float64)
  returns = np.zeros_like(r)
  for b in range(r.shape[0]):
    agent = np.flatnonzero(m[b] > 0)
    running = 0.0
    for t in agent[::-1]:
      running = r[b, t] + gamma * running
      returns[b, t] = running
  return ref_whiten(returns, m) * m, returns


def verl_rpp_returns(r, m, gamma):
  """verl's recursion as written: the running return restarts at every masked position."""
  r, m = np.asarray(r, np.float64), np.asarray(m, np.float64)
  returns = np.zeros_like(r)
  for b in range(r.shape[0]):
    running = 0.0
    for t in reversed(range(r.shape[1])):
      running = r[b, t] + gamma * running
      returns[b, t] = running
      running = running * m[b, t]
  return returns


# ------------------------------------------------------------------------------------
# Random inputs.
# ------------------------------------------------------------------------------------


def make_ids(rng: np.random.Generator) -> np.ndarray:
  """Non-contiguous arbitrary ids: a group of three, a group of two, a group of one, ..."""
  ids = np.array([7, 3, 7, 100, -2, 7, 3, 55][:B], np.int32)
  return ids[rng.permutation(B)]


# ------------------------------------------------------------------------------------
# GAE
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (1.0, 1.0), (0.7, 0.0)])
@pytest.mark.parametrize("whiten", [True, False])
def test_gae_matches_reference(seed, gamma, lam, whiten):
  rng = np.random.default_rng(seed)
  r = rng.normal(size=(B, T)).astype(np.float32)
  v = rng.normal(size=(B, T)).astype(np.float32)
  m = make_mask(rng)
  adv, ret = compute_gae_advantages(r, v, m, gamma, lam, whiten=whiten)
  ref_adv, ref_ret = ref_gae(r, v, m, gamma, lam, whiten)
  assert adv.dtype == jnp.float32 and ret.dtype == jnp.float32
  assert adv.shape == ret.shape == (B, T)
  np.testing.assert_allclose(adv, ref_adv, **TOL)
  np.testing.assert_allclose(ret, ref_ret, **TOL)
  assert np.all(np.asarray(adv)[m == 0] == 0.0) and np.all(np.asarray(ret)[m == 0] == 0.0)


def test_gae_hand_computed_multi_turn():
  # agent, obs, agent, pad: the observation token's reward and value are skipped.
  r = np.array([[1.0, 50.0, 2.0, 9.0]], np.float32)
  v = np.array([[0.5, -30.0, 0.25, 7.0]], np.float32)
  m = np.array([[1, 0, 1, 0]], np.float32)
  g, lam = 0.9, 0.8
  a2 = 2.0 - 0.25  # last agent token: nextvalue = 0
  a0 = (1.0 + g * 0.25 - 0.5) + g * lam * a2
  adv, ret = compute_gae_advantages(r, v, m, g, lam, whiten=False)
  np.testing.assert_allclose(adv, [[a0, 0.0, a2, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(ret, [[a0 + 0.5, 0.0, a2 + 0.25, 0.0]], rtol=1e-6)


@HYP
@given(
  mask=hnp.arrays(np.bool_, (HB, HT)),
  rewards=hnp.arrays(np.float32, (HB, HT), elements=st.floats(-10, 10, width=32)),
  values=hnp.arrays(np.float32, (HB, HT), elements=st.floats(-10, 10, width=32)),
  junk=hnp.arrays(np.float32, (HB, HT), elements=st.floats(width=32)),  # incl. nan/inf
  gamma=st.floats(0, 1),
  lam=st.floats(0, 1),
  whiten=st.booleans(),
)
def test_gae_ignores_values_at_masked_positions(mask, rewards, values, junk, gamma, lam, whiten):
  m = mask.astype(np.float32)
  changed = np.where(mask, values, junk)
  base = compute_gae_advantages(rewards, values, m, gamma, lam, whiten=whiten)
  other = compute_gae_advantages(rewards, changed, m, gamma, lam, whiten=whiten)
  for x, y in zip(base, other, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert np.all(np.isfinite(np.asarray(y)))


@HYP
@given(
  mask=hnp.arrays(np.bool_, (HB, HT)),
  rewards=hnp.arrays(np.float32, (HB, HT), elements=st.floats(-10, 10, width=32)),
)
def test_gae_lambda1_gamma1_is_reward_to_go_over_agent_tokens(mask, rewards):
  m = mask.astype(np.float32)
  adv, ret = compute_gae_advantages(rewards, np.zeros_like(rewards), m, 1.0, 1.0, whiten=False)
  agent_rewards = np.where(mask, rewards.astype(np.float64), 0.0)
  to_go = np.cumsum(agent_rewards[:, ::-1], axis=1)[:, ::-1] * m
  np.testing.assert_allclose(adv, to_go, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(ret, to_go, rtol=1e-5, atol=1e-4)


def test_gae_validates_gamma_and_lambda():
  x = np.zeros((2, 3), np.float32)
  with pytest.raises(ValueError, match=r"gamma.*1\.5"):
    compute_gae_advantages(x, x, x, 1.5, 0.9)
  with pytest.raises(ValueError, match="gamma"):
    compute_gae_advantages(x, x, x, -0.01, 0.9)
  with pytest.raises(ValueError, match="gamma"):
    compute_gae_advantages(x, x, x, float("nan"), 0.9)
  with pytest.raises(ValueError, match=r"gae_lambda.*-0\.5"):
    compute_gae_advantages(x, x, x, 0.9, -0.5)
  with pytest.raises(ValueError, match="gamma"):
    compute_reinforce_plus_plus_advantages(x, x, 2.0)


def test_gae_jits_with_traced_gamma():
  rng = np.random.default_rng(4)
  r = rng.normal(size=(B, T)).astype(np.float32)
  v = rng.normal(size=(B, T)).astype(np.float32)
  m = make_mask(rng)
  jitted = jax.jit(lambda g, lam: compute_gae_advantages(r, v, m, g, lam))
  adv, ret = jitted(jnp.float32(0.9), jnp.float32(0.8))
  ref_adv, ref_ret = ref_gae(r, v, m, np.float32(0.9), np.float32(0.8))
  np.testing.assert_allclose(adv, ref_adv, **TOL)
  np.testing.assert_allclose(ret, ref_ret, **TOL)


# ------------------------------------------------------------------------------------
# GRPO / RLOO
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_reference(seed, norm_by_std):
  rng = np.random.default_rng(seed)
  scores = rng.normal(size=B).astype(np.float32)
  ids = make_ids(rng)
  m = make_mask(rng)
  adv = compute_grpo_advantages(scores, ids, m, norm_by_std=norm_by_std)
  assert adv.dtype == jnp.float32 and adv.shape == (B, T)
  np.testing.assert_allclose(adv, ref_grpo(scores, ids, m, norm_by_std), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_matches_reference(seed):
  rng = np.random.default_rng(seed)
  scores = rng.normal(size=B).astype(np.float32)
  ids = make_ids(rng)
  m = make_mask(rng)
  adv = compute_rloo_advantages(scores, ids, m)
  assert adv.dtype == jnp.float32 and adv.shape == (B, T)
  np.testing.assert_allclose(adv, ref_rloo(scores, ids, m), **TOL)


def test_group_edge_cases_constant_group_and_singleton():
  scores = np.array([0.1, 0.7, 0.1, 0.3, 0.1, 0.7], np.float32)
  ids = np.array([7, 3, 7, 100, 7, 3], np.int32)  # {7: const}, {3: const}, {100: single}
  m = np.ones((6, 2), np.float32)
  m[5] = 0.0
  grpo = np.asarray(compute_grpo_advantages(scores, ids, m))
  np.testing.assert_allclose(grpo[:, 0], [0, 0, 0, np.float32(0.3) / (1 + 1e-6), 0, 0], atol=1e-7)
  drgrpo = np.asarray(compute_grpo_advantages(scores, ids, m, norm_by_std=False))
  np.testing.assert_allclose(drgrpo[:, 0], [0, 0, 0, 0.3, 0, 0], atol=1e-7)
  rloo = np.asarray(compute_rloo_advantages(scores, ids, m))
  np.testing.assert_allclose(rloo[:, 0], [0, 0, 0, 0.3, 0, 0], atol=1e-7)
  for out in (grpo, drgrpo, rloo):
    assert np.all(out[5] == 0.0)  # masked row


def test_grpo_hand_computed_non_contiguous_ids():
  scores = np.array([1.0, 2.0, 5.0, 0.5], np.float32)
  ids = np.array([7, 3, 7, 100], np.int32)
  m = np.ones((4, 1), np.float32)
  # group 7: {1, 5}: mean 3, sample std sqrt(8); group 3 and 100: singletons.
  expected = [-2 / (np.sqrt(8) + 1e-6), 2 / (1 + 1e-6), 2 / (np.sqrt(8) + 1e-6), 0.5 / (1 + 1e-6)]
  np.testing.assert_allclose(compute_grpo_advantages(scores, ids, m)[:, 0], expected, rtol=1e-6)
  np.testing.assert_allclose(compute_rloo_advantages(scores, ids, m)[:, 0], [-4, 2, 4, 0.5])


def test_group_ids_are_traced_under_jit():
  scores = jnp.array([1.0, 2.0, 5.0, 0.5])
  m = jnp.ones((4, 1))
  traces = []

  @jax.jit
  def f(ids):
    traces.append(None)
    return compute_grpo_advantages(scores, ids, m), compute_rloo_advantages(scores, ids, m)

  for ids in ([7, 3, 7, 100], [1, 1, 1, 1], [0, 1, 2, 3]):
    ids = np.array(ids, np.int32)
    grpo, rloo = f(ids)
    np.testing.assert_allclose(grpo, ref_grpo(scores, ids, m), **TOL)
    np.testing.assert_allclose(rloo, ref_rloo(scores, ids, m), **TOL)
  assert len(traces) == 1


@HYP
@given(
  scores=hnp.arrays(np.float32, (HB * 2,), elements=st.floats(-10, 10, width=32)),
  ids=hnp.arrays(np.int32, (HB * 2,), elements=st.integers(-3, 3)),
)
@example(  # found on a fresh machine: a subnormal score alone in its group
  scores=np.array([1e-45] + [0.0] * (HB * 2 - 1), np.float32),
  ids=np.array([0] + [1] * (HB * 2 - 1), np.int32),
)
def test_group_advantages_sum_to_zero_per_group(scores, ids):
  m = np.ones((HB * 2, 1), np.float32)
  outs = {
    "drgrpo": np.asarray(compute_grpo_advantages(scores, ids, m, norm_by_std=False))[:, 0],
    "grpo": np.asarray(compute_grpo_advantages(scores, ids, m))[:, 0],
    "rloo": np.asarray(compute_rloo_advantages(scores, ids, m))[:, 0],
  }
  for members in _groups(ids).values():
    if len(members) > 1:
      for name, adv in outs.items():
        assert abs(float(np.sum(adv[members], dtype=np.float64))) < 1e-3, name
    else:
      (i,) = members  # a group of one keeps its score (XLA on CPU flushes subnormals)
      assert outs["drgrpo"][i] == flush_subnormals(scores[i])
      assert outs["rloo"][i] == flush_subnormals(scores[i])


# ------------------------------------------------------------------------------------
# REINFORCE++
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_matches_reference(seed, gamma):
  rng = np.random.default_rng(seed)
  r = rng.normal(size=(B, T)).astype(np.float32)
  m = make_mask(rng)
  adv, ret = compute_reinforce_plus_plus_advantages(r, m, gamma)
  ref_adv, ref_ret = ref_rpp(r, m, gamma)
  assert adv.dtype == jnp.float32 and adv.shape == (B, T)
  np.testing.assert_allclose(adv, ref_adv, **TOL)
  np.testing.assert_allclose(ret, ref_ret, **TOL)


def test_reinforce_plus_plus_hand_computed_across_an_observation():
  r = np.array([[1.0, 2.0, 4.0, 8.0]], np.float32)
  m = np.array([[1, 1, 0, 1]], np.float32)
  _, ret = compute_reinforce_plus_plus_advantages(r, m, 0.5)
  # t=3: 8; t=2 (observation): skipped, its 4 ignored; t=1: 2 + 0.5*8 = 6; t=0: 1 + 0.5*6 = 4.
  np.testing.assert_allclose(ret, [[4.0, 6.0, 0.0, 8.0]])


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_is_verls_on_single_turn_rows(seed):
  rng = np.random.default_rng(seed)
  r = rng.normal(size=(B, T)).astype(np.float32)
  m = np.zeros((B, T), np.float32)
  for b in range(B):  # verl's layout: agent tokens, then padding
    m[b, : rng.integers(0, T + 1)] = 1.0
  _, ret = compute_reinforce_plus_plus_advantages(r, m, 0.9)
  np.testing.assert_allclose(ret * m, verl_rpp_returns(r, m, 0.9) * m, **TOL)


def test_reinforce_plus_plus_carries_a_last_turn_reward_to_the_first_turn():
  # two turns of two agent tokens, an observation between; only the last token is rewarded
  r = np.array([[0.0, 0.0, 0.0, 0.0, 1.0]], np.float32)
  m = np.array([[1, 1, 0, 1, 1]], np.float32)
  _, ret = compute_reinforce_plus_plus_advantages(r, m, 1.0)
  np.testing.assert_allclose(ret, [[1.0, 1.0, 0.0, 1.0, 1.0]])
  assert verl_rpp_returns(r, m, 1.0)[0, 0] == 0.0  # verl's would give the first turn nothing


# ------------------------------------------------------------------------------------
# All estimators: dtypes, degenerate masks, finiteness.
# ------------------------------------------------------------------------------------


def _run_all(r, v, scores, ids, m):
  gae = compute_gae_advantages(r, v, m, 0.99, 0.95)
  rpp = compute_reinforce_plus_plus_advantages(r, m, 0.99)
  return [
    *gae,
    compute_gae_advantages(r, v, m, 0.99, 0.95, whiten=False)[0],
    compute_grpo_advantages(scores, ids, m),
    compute_grpo_advantages(scores, ids, m, norm_by_std=False),
    compute_rloo_advantages(scores, ids, m),
    *rpp,
  ]


def test_bfloat16_inputs_match_float32_of_rounded_inputs():
  rng = np.random.default_rng(5)
  r16 = jnp.asarray(rng.normal(size=(B, T)), jnp.bfloat16)
  v16 = jnp.asarray(rng.normal(size=(B, T)), jnp.bfloat16)
  s16 = jnp.asarray(rng.normal(size=B), jnp.bfloat16)
  m16 = jnp.asarray(make_mask(rng), jnp.bfloat16)
  ids = make_ids(rng)
  outs16 = _run_all(r16, v16, s16, ids, m16)
  f32 = [x.astype(jnp.float32) for x in (r16, v16, s16)]
  outs32 = _run_all(*f32[:2], f32[2], ids, m16.astype(jnp.float32))
  for a, b in zip(outs16, outs32, strict=True):
    assert a.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(a)))
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  # and close to the float64 references on the rounded inputs
  r, v, s = (np.asarray(x, np.float64) for x in f32)
  m = np.asarray(m16, np.float64)
  np.testing.assert_allclose(outs16[0], ref_gae(r, v, m, 0.99, 0.95)[0], **TOL)
  np.testing.assert_allclose(outs16[3], ref_grpo(s, ids, m), **TOL)
  np.testing.assert_allclose(outs16[6], ref_rpp(r, m, 0.99)[0], **TOL)


def test_all_zero_mask_gives_zeros():
  rng = np.random.default_rng(6)
  r = rng.normal(size=(B, T)).astype(np.float32)
  v = rng.normal(size=(B, T)).astype(np.float32)
  s = rng.normal(size=B).astype(np.float32)
  m = np.zeros((B, T), np.float32)
  outs = _run_all(r, v, s, make_ids(rng), m)
  for i, out in enumerate(outs):
    out = np.asarray(out)
    assert np.all(np.isfinite(out))
    assert np.all(out == 0.0), i


@HYP
@given(
  mask=hnp.arrays(np.bool_, (HB, HT)),
  rewards=hnp.arrays(np.float32, (HB, HT), elements=st.floats(-100, 100, width=32)),
  values=hnp.arrays(np.float32, (HB, HT), elements=st.floats(-100, 100, width=32)),
  scores=hnp.arrays(np.float32, (HB,), elements=st.floats(-100, 100, width=32)),
  ids=hnp.arrays(np.int32, (HB,), elements=st.integers(-1000, 1000)),
)
def test_no_nan_or_inf_for_any_mask(mask, rewards, values, scores, ids):
  for out in _run_all(rewards, values, scores, ids, mask.astype(np.float32)):
    assert np.all(np.isfinite(np.asarray(out)))


def test_estimator_table():
  view = registry.RegistryView(registry.ADVANTAGE_ESTIMATORS)
  assert dict(view) == {
    "gae": compute_gae_advantages,
    "grpo": compute_grpo_advantages,
    "rloo": compute_rloo_advantages,
    "reinforce_plus_plus": compute_reinforce_plus_plus_advantages,
    "turn_gae": compute_turn_gae_advantages,
    "gigpo": compute_gigpo_advantages,
  }


@pytest.mark.parametrize("huge", [1e20, 3e38])
def test_gae_whitening_of_huge_rewards_is_finite_and_exact(huge):
  """A reward whose square overflows float32 must not whiten to 0 or NaN (float64 reference)."""
  rng = np.random.default_rng(0)
  r = rng.normal(size=(B, T)).astype(np.float32)
  r[0, -1] = huge
  v = rng.normal(size=(B, T)).astype(np.float32)
  m = make_mask(rng)
  m[0, -1] = 1.0
  adv, _ = compute_gae_advantages(r, v, m, 1.0, 0.95)
  ref_adv, _ = ref_gae(r, v, m, 1.0, 0.95)
  assert np.all(np.isfinite(np.asarray(adv)))
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-4, atol=1e-4)
