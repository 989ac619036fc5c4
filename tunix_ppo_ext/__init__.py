"""tunix-ppo-ext: PPO extensions for Google's tunix.

The public API is re-exported here from small modules (kl, losses, logits, advantages,
common, config, learner, rollout). Importing the package registers its losses and
estimators in tunix's `function_registry` (tunix's own extension point); nothing of
tunix is patched.
"""

from tunix_ppo_ext import tunix_fns as _tunix_fns  # noqa: F401  (registers into tunix)
from tunix_ppo_ext.advantages import (
  ADVANTAGE_ESTIMATORS,
  compute_gae_advantages,
  compute_grpo_advantages,
  compute_reinforce_plus_plus_advantages,
  compute_rloo_advantages,
)
from tunix_ppo_ext.common import (
  compute_completion_logits,
  compute_per_token_logps,
  compute_score,
  process_ids,
)
from tunix_ppo_ext.config import PpoExtConfig
from tunix_ppo_ext.kl import (
  AdaptiveKLController,
  FixedKLController,
  compute_kl_divergence,
  full_kl_divergence,
  make_kl_controller,
)
from tunix_ppo_ext.learner import PpoExtLearner, TrajectoryBatch
from tunix_ppo_ext.logits import logps_and_entropy
from tunix_ppo_ext.losses import aggregate_loss, entropy_from_logits, policy_loss, value_loss
from tunix_ppo_ext.rollout import MultiTurnRollout

__version__ = "0.1.0"

__all__ = [
  "ADVANTAGE_ESTIMATORS",
  "AdaptiveKLController",
  "FixedKLController",
  "MultiTurnRollout",
  "PpoExtConfig",
  "PpoExtLearner",
  "TrajectoryBatch",
  "aggregate_loss",
  "compute_completion_logits",
  "compute_gae_advantages",
  "compute_grpo_advantages",
  "compute_kl_divergence",
  "compute_per_token_logps",
  "compute_reinforce_plus_plus_advantages",
  "compute_rloo_advantages",
  "compute_score",
  "entropy_from_logits",
  "full_kl_divergence",
  "logps_and_entropy",
  "make_kl_controller",
  "policy_loss",
  "process_ids",
  "value_loss",
]
