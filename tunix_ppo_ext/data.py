"""Trajectory containers, the reward policies applied to them, the toy character
tokenizer (NumPy only), and `checkpoint_directory`: where a `model.checkpoint` value's
Hugging Face files are (a GGUF file's converted directory)."""

from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.data.gguf_files import resolve as checkpoint_directory
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
  "checkpoint_directory",
  "contiguous_group_ids",
  "episode_batches",
  "episode_seeds",
  "sampler_logprob_gap",
]
