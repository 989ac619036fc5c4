"""`stats.rollout_statistics`: the rollout phase's batch metrics, with and
without a critic, against values computed here in NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.metrics import stats

pytestmark = pytest.mark.fast


def _batch() -> TrajectoryBatch:
  attention = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
  loss = np.array([[1, 0, 1, 0], [1, 1, 0, 0]], np.float32)  # two agent tokens a row
  rewards = np.array([[0, 0, 1, 0], [0, 0.5, 0, 0]], np.float32)
  ids = np.ones((2, 4), np.int32)
  return TrajectoryBatch(np.ones((2, 3), np.int32), ids, attention, loss, rewards)


@pytest.mark.parametrize("has_critic", [True, False])
def test_rollout_statistics(has_critic):
  batch = _batch()
  rng = np.random.default_rng(0)
  values, returns = rng.normal(size=(2, 4)), rng.normal(size=(2, 4))
  kl = np.arange(8, dtype=np.float32).reshape(2, 4)
  ours, tunix, variance = stats.rollout_statistics(
    batch, batch.token_rewards, values, returns - values, returns, kl,
    groups=np.array([0, 1]), has_critic=has_critic, coefficients={"learner/kl_coef": 0.5},
    rollout_s=2.0,
  )  # fmt: skip
  agent = batch.loss_mask > 0
  assert ours["learner/kl_coef"] == 0.5
  assert ours["learner/kl"] == pytest.approx(kl[agent].mean())
  assert ours["rollout/tokens_per_s"] == 4 / 2.0  # agent tokens
  assert ours["rollout/completion_tokens_per_s"] == 5 / 2.0  # every real completion token
  if has_critic:
    want = 1 - np.var(returns[agent] - values[agent]) / np.var(returns[agent])
    assert variance == pytest.approx(want, rel=1e-5)
    assert ours["learner/explained_variance"] == variance
  else:
    assert variance is None and "learner/explained_variance" not in ours
    assert not [k for k in (*ours, *tunix) if "old_value" in k]
  assert tunix  # tunix's own names, as stock PPO logs them


def _reference_noise(advantages: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
  """Token mean of A^2, and the mean over turns (runs of mask 1, walked token by token) of
  the square of each turn's mean advantage."""
  tokens, turns = [], []
  for row, row_mask in zip(advantages, mask, strict=True):
    current: list[float] = []
    for value, agent in zip(row, row_mask, strict=True):
      if agent:
        tokens.append(value**2)
        current.append(value)
      elif current:
        turns.append(np.mean(current) ** 2)
        current = []
    if current:
      turns.append(np.mean(current) ** 2)
  return float(np.mean(tokens)), float(np.mean(turns))


@pytest.mark.parametrize("seed", range(5))
def test_advantage_noise_matches_token_and_turn_means(seed):
  rng = np.random.default_rng(seed)
  mask = (rng.random((4, 9)) < 0.6).astype(np.float32)
  mask[1] = 0.0  # a row with no agent token
  mask[2, -1] = 1.0  # a turn that runs to the row's end, joined to nothing in the next row
  mask[3, 0] = 1.0
  advantages = rng.normal(scale=3.0, size=(4, 9)).astype(np.float32)
  noise = stats.advantage_noise(advantages, mask)
  token, turn = _reference_noise(advantages, mask)
  assert noise["learner/advantage_sq_mean"] == pytest.approx(token, rel=1e-6)
  assert noise["learner/advantage_sq_mean_turn"] == pytest.approx(turn, rel=1e-6)
  assert stats.advantage_noise(advantages, np.zeros_like(mask)) == {}
