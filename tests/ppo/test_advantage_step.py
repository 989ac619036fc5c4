"""`advantage_step`: the advantages with the policy's lambda and the value targets with the
critic's, against GAE written from its definition (Schulman et al. 2016) in NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_ppo_ext._src.data.trajectory import contiguous_group_ids
from tunix_ppo_ext._src.metrics.stats import advantage_noise
from tunix_ppo_ext._src.ppo import advantage_step
from tunix_ppo_ext._src.tunix.learner.ppo_config import PpoExtConfig

pytestmark = pytest.mark.tunix


def gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float) -> np.ndarray:
  """A_t = sum_k (gamma lam)^k delta_{t+k}, delta_t = r_t + gamma V_{t+1} - V_t, V_T = 0."""
  advantages = np.zeros_like(rewards)
  for row in range(rewards.shape[0]):
    running = 0.0
    for t in reversed(range(rewards.shape[1])):
      following = values[row, t + 1] if t + 1 < rewards.shape[1] else 0.0
      delta = rewards[row, t] + gamma * following - values[row, t]
      running = delta + gamma * lam * running
      advantages[row, t] = running
  return advantages


@pytest.mark.parametrize("has_critic, warming_up", [(True, False), (True, True), (False, False)])
def test_advantages_take_the_policy_lambda_and_returns_the_targets(has_critic, warming_up):
  rng = np.random.default_rng(3)
  rewards = rng.normal(size=(3, 5)).astype(np.float32)
  values = rng.normal(size=(3, 5)).astype(np.float32)
  mask = np.ones((3, 5), np.float32)
  config = PpoExtConfig(
    advantage_estimator="gae", gamma=0.9, gae_lambda=0.5, critic_lambda=0.8,
    critic_warmup_lambda=1.0, whiten_advantages=False,
  )  # fmt: skip
  advantages, returns = advantage_step.advantages_and_returns(
    config, rewards, values, mask, np.arange(3), warming_up=warming_up, has_critic=has_critic
  )
  np.testing.assert_allclose(advantages, gae(rewards, values, 0.9, 0.5), rtol=1e-5, atol=1e-5)
  target = (1.0 if warming_up else 0.8) if has_critic else 0.5
  want = gae(rewards, values, 0.9, target) + values
  np.testing.assert_allclose(returns, want, rtol=1e-5, atol=1e-5)


def test_group_ids_are_the_sources_else_runs_of_num_generations():
  class Batch:
    group_ids, loss_mask = None, np.ones((6, 2))

  np.testing.assert_array_equal(advantage_step.group_ids(Batch(), 3), contiguous_group_ids(6, 3))
  Batch.group_ids = [4, 4, 1, 1, 0, 0]
  np.testing.assert_array_equal(advantage_step.group_ids(Batch(), 3), [4, 4, 1, 1, 0, 0])


def test_unnormalized_advantages_are_in_the_rewards_units_for_every_estimator():
  """GRPO (norm_adv_by_std on) and GAE (whitening on) give, unnormalized, the score minus
  its group's mean and GAE as defined; the configured advantages stay normalized."""
  rng = np.random.default_rng(0)
  rewards = np.zeros((4, 3), np.float32)
  rewards[:, -1] = [1.0, 0.0, 0.5, 0.5]
  mask = np.ones((4, 3), np.float32)
  groups = contiguous_group_ids(4, 2)
  grpo = PpoExtConfig(advantage_estimator="grpo", num_generations=2)
  raw = advantage_step.unnormalized_advantages(grpo, rewards, np.zeros_like(rewards), mask, groups)
  np.testing.assert_allclose(np.asarray(raw)[:, 0], [0.5, -0.5, 0.0, 0.0], atol=1e-6)
  values = rng.normal(size=(4, 3)).astype(np.float32)
  ppo = PpoExtConfig(advantage_estimator="gae", gamma=1.0, gae_lambda=0.5)
  raw = advantage_step.unnormalized_advantages(ppo, rewards, values, mask, groups)
  np.testing.assert_allclose(raw, gae(rewards, values, 1.0, 0.5), rtol=1e-5, atol=1e-5)
  noise = advantage_noise(raw, mask)
  expected = np.mean(gae(rewards, values, 1.0, 0.5) ** 2)
  assert noise["learner/advantage_sq_mean"] == pytest.approx(expected, rel=1e-5)
