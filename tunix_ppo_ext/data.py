"""Trajectory containers, the reward policies applied to them, and the toy character
tokenizer (NumPy only)."""

from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
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
  "CharTokenizer",
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
