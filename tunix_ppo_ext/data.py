"""Trajectory containers and the reward policies applied to them (NumPy only)."""

from tunix_ppo_ext._src.data.rewards import NONFINITE_REWARD_MODES, NonFiniteRewards
from tunix_ppo_ext._src.data.trajectory import (
  SEED_KEY,
  MultiTurnBatch,
  RolloutStats,
  TrajectoryBatch,
  contiguous_group_ids,
  episode_batches,
  episode_seeds,
  sampler_logprob_gap,
)

__all__ = [
  "NONFINITE_REWARD_MODES",
  "SEED_KEY",
  "MultiTurnBatch",
  "NonFiniteRewards",
  "RolloutStats",
  "TrajectoryBatch",
  "contiguous_group_ids",
  "episode_batches",
  "episode_seeds",
  "sampler_logprob_gap",
]
