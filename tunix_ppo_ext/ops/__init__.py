"""Pure JAX math (jax, numpy and chex only): masked reductions, log-probs, entropy and the
full KL from logits, KL estimators and controllers, PPO losses, advantage estimators.

Nothing here knows a plugin name or tunix: functions take arrays and callables.
"""

from tunix_ppo_ext.ops.advantages import (
  compute_gae_advantages,
  compute_grpo_advantages,
  compute_reinforce_plus_plus_advantages,
  compute_rloo_advantages,
)
from tunix_ppo_ext.ops.kl import (
  AdaptiveKLController,
  FixedKLController,
  compute_kl_divergence,
  kl_abs,
  kl_k1,
  kl_k2,
  kl_k3,
  make_kl_controller,
)
from tunix_ppo_ext.ops.logits import full_kl_divergence, logps_and_entropy
from tunix_ppo_ext.ops.losses import aggregate_loss, entropy_from_logits, policy_loss, value_loss
from tunix_ppo_ext.ops.masked import masked_mean, masked_sum, masked_whiten

__all__ = [
  "AdaptiveKLController",
  "FixedKLController",
  "aggregate_loss",
  "compute_gae_advantages",
  "compute_grpo_advantages",
  "compute_kl_divergence",
  "compute_reinforce_plus_plus_advantages",
  "compute_rloo_advantages",
  "entropy_from_logits",
  "full_kl_divergence",
  "kl_abs",
  "kl_k1",
  "kl_k2",
  "kl_k3",
  "logps_and_entropy",
  "make_kl_controller",
  "masked_mean",
  "masked_sum",
  "masked_whiten",
  "policy_loss",
  "value_loss",
]
