"""Signal coefficients (`metrics.signal`): divided by them, every estimator's advantages are
on the true advantage's scale. The identities checked: GRPO's group-mean advantage over
`(n-1)/n` is RLOO's leave-one-out advantage, raw or std-divided; GiGPO with step weight 0
is GRPO; whitened GAE over `1/std` is the raw advantage minus its mean."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunix_ppo_ext._src.metrics import signal
from tunix_ppo_ext._src.ops.advantages import (
  compute_gae_advantages,
  compute_gigpo_advantages,
  compute_grpo_advantages,
  compute_rloo_advantages,
)

pytestmark = pytest.mark.fast

B, T = 8, 10


def batch(seed: int):
  rng = np.random.default_rng(seed)
  mask = np.zeros((B, T), np.int32)
  for b in range(B):
    mask[b, : rng.integers(2, T)] = 1
    mask[b, rng.integers(1, 3)] = 0  # an observation: two turns
  rewards = (rng.normal(size=(B, T)) * mask).astype(np.float32)
  groups = np.array([0, 0, 0, 0, 5, 5, 9, 9])  # groups of 4, 2 and 2
  anchors = rng.integers(0, 2, size=(B, 3)).astype(np.int32)
  return rewards, mask, groups, anchors


def terms(rewards, mask, groups, anchors=None, **extra):
  return {"rewards": rewards, "mask": mask, "groups": groups, "anchors": anchors, **extra}


@settings(max_examples=20, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), std=st.booleans())
def test_grpo_over_its_coefficient_is_rloo(seed, std):
  rewards, mask, groups, _ = batch(seed)
  scores = (rewards * mask).sum(-1)
  grpo = np.asarray(compute_grpo_advantages(scores, groups, mask, norm_by_std=std), np.float64)
  c = signal.signal_coefficients(
    "grpo", terms(rewards, mask, groups), std_division=std, whiten=False
  )
  rloo = np.asarray(compute_rloo_advantages(scores, groups, mask), np.float64)
  np.testing.assert_allclose(np.where(mask > 0, grpo / np.where(c, c, 1), 0), rloo, atol=1e-4)
  expected = signal.common_scale_noise(rloo, mask.astype(float), mask)
  assert signal.common_scale_noise(grpo, c, mask) == pytest.approx(expected, rel=1e-4)


def test_grpo_s_coefficient_is_three_quarters_in_groups_of_four():
  rewards, mask, groups, _ = batch(0)
  c = signal.signal_coefficients(
    "grpo", terms(rewards, mask, groups), std_division=False, whiten=False
  )
  assert np.allclose(c[:4][mask[:4] > 0], 0.75) and np.allclose(c[4:][mask[4:] > 0], 0.5)
  assert np.all(c[mask == 0] == 0.0)


def test_gigpo_adds_the_step_groups_coefficient():
  """Hand-made: one group of 2 whose first turns share an anchor and second turns do not."""
  rewards = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.5]], np.float32)
  mask = np.array([[1, 0, 1], [1, 0, 1]])
  extra = {"step_weight": 2.0, "gamma_turn": 1.0}
  t = terms(rewards, mask, np.array([3, 3]), np.array([[7, 1], [7, 2]]), **extra)
  c = signal.signal_coefficients("gigpo", t, std_division=False, whiten=False)
  # episode: (2-1)/2; turn 0: + 2 x (2-1)/2; turn 1: singletons, + 0
  np.testing.assert_allclose(c, [[1.5, 0.0, 0.5], [1.5, 0.0, 0.5]])


@pytest.mark.parametrize("std", [False, True])
def test_gigpo_without_its_step_part_is_grpo(std):
  rewards, mask, groups, anchors = batch(3)
  extra = {"step_weight": 0.0, "gamma_turn": 0.9}
  t = terms(rewards, mask, groups, anchors, **extra)
  c_gigpo = signal.signal_coefficients("gigpo", t, std_division=std, whiten=False)
  c_grpo = signal.signal_coefficients("grpo", t, std_division=std, whiten=False)
  np.testing.assert_allclose(c_gigpo, c_grpo)
  adv = compute_gigpo_advantages(rewards, mask, groups, anchors, 0.9, 0.0, std)
  scores = (rewards * mask).sum(-1)
  np.testing.assert_allclose(adv, compute_grpo_advantages(scores, groups, mask, std), atol=1e-6)


def test_gigpo_step_coefficient_matches_a_loop_reference():
  """Each turn's step coefficient, std-divided, from an explicit loop over step groups."""
  rewards, mask, groups, anchors = batch(5)
  t = terms(rewards, mask, groups, anchors, step_weight=1.0, gamma_turn=0.5)
  step = signal.signal_coefficients("gigpo", t, std_division=True, whiten=False)
  step -= signal.signal_coefficients("grpo", t, std_division=True, whiten=False)
  returns = signal.turn_returns(rewards.astype(np.float64), mask, 0.5)
  turn = signal.agent_turns(mask)
  members: dict[tuple[int, int], list[float]] = {}
  for b in range(B):
    for k in range(turn[b].max() + 1):
      first = int(np.flatnonzero(turn[b] == k)[0])
      members.setdefault((groups[b], anchors[b, k]), []).append(returns[b, first])
  for b, tok in zip(*np.nonzero(mask), strict=True):
    values = members[(groups[b], anchors[b, turn[b, tok]])]
    m = len(values)
    expected = 0.0 if m < 2 else (m - 1) / m / (np.std(values, ddof=1) + 1e-6)
    assert step[b, tok] == pytest.approx(expected, rel=1e-5, abs=1e-9)


def test_whitened_gae_over_its_coefficient_is_the_centred_raw_advantage():
  rewards, mask, groups, _ = batch(7)
  values = np.random.default_rng(1).normal(size=(B, T)).astype(np.float32)
  raw, _ = compute_gae_advantages(rewards, values, mask, 1.0, 0.9, whiten=False)
  white, _ = compute_gae_advantages(rewards, values, mask, 1.0, 0.9, whiten=True)
  raw = np.asarray(raw, np.float64)
  t = terms(rewards, mask, groups, advantages_raw=raw)
  c = signal.signal_coefficients("gae", t, std_division=False, whiten=True)
  centred = raw - raw[mask > 0].mean()
  got = np.asarray(white, np.float64) / np.where(c, c, 1)
  np.testing.assert_allclose(got[mask > 0], centred[mask > 0], rtol=1e-4, atol=1e-5)


def test_no_agent_token_no_noise_and_a_zero_coefficient_counts_zero():
  assert signal.common_scale_noise(np.ones((2, 3)), np.ones((2, 3)), np.zeros((2, 3))) == {}
  noise = signal.common_scale_noise(np.ones((1, 2)), np.array([[0.0, 2.0]]), np.ones((1, 2)))
  assert noise == {"token": pytest.approx(0.125), "turn": pytest.approx(0.0625)}
