"""The rollout phase's advantages and value targets, out of `PpoExtLearner`.

`advantages_and_returns` runs the configured estimator (`PpoExtConfig.advantage_estimator`:
a name in our plugin registry, built-ins included, called through its keyword protocol;
else one in tunix's `function_registry`, called with tunix's PPO signature) with the
policy's lambda for the advantages and, where it differs, with the value targets' lambda
for the returns.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from tunix.rl import function_registry

from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch, contiguous_group_ids
from tunix_ppo_ext._src.math.advantages import length_adaptive_lambda
from tunix_ppo_ext._src.plugins import protocols, registry
from tunix_ppo_ext._src.tunix.learner.ppo_config import PpoExtConfig


def group_ids(batch: TrajectoryBatch, num_generations: int) -> np.ndarray:
  """Each row's group: the source's, else consecutive runs of `num_generations` rows."""
  if batch.group_ids is not None:
    return np.asarray(batch.group_ids)
  return contiguous_group_ids(len(batch.loss_mask), num_generations)


def estimate(
  config: PpoExtConfig, rewards: Any, values: Any, loss_mask: Any, groups: np.ndarray, gae_lambda
) -> tuple[Any, Any]:
  """`(advantages [B, T], returns [B, T])` of the configured estimator with `gae_lambda`
  (a float, or one per row)."""
  name = config.advantage_estimator
  if registry.has(registry.ADVANTAGE_ESTIMATORS, name):
    return protocols.call_estimator(
      registry.get(registry.ADVANTAGE_ESTIMATORS, name),
      rewards=rewards,
      values=values,
      mask=loss_mask,
      scores=jnp.sum(rewards * loss_mask, axis=-1),
      group_ids=jnp.asarray(groups),
      gamma=config.gamma,
      gae_lambda=gae_lambda,
      gamma_turn=config.turn_discount,
      whiten=config.whiten_advantages,
      norm_by_std=config.norm_adv_by_std,
    )
  estimator = function_registry.get_advantage_estimator(name)
  return estimator(
    rewards=rewards,
    values=values,
    completion_mask=loss_mask,
    gamma=config.gamma,
    gae_lambda=gae_lambda,
  )


def advantages_and_returns(
  config: PpoExtConfig,
  rewards: Any,
  values: Any,
  loss_mask: Any,
  groups: np.ndarray,
  *,
  warming_up: bool,
  has_critic: bool,
) -> tuple[Any, Any]:
  """`(advantages [B, T], returns [B, T])`: the advantages with the policy's lambda
  (`gae_lambda`, or per row `adaptive_lambda_alpha`'s), the returns with the value
  targets' (`critic_warmup_lambda` on warm-up steps, else `target_lambda`; estimated again
  only for a critic, and only where that lambda differs)."""
  actor_lambda = config.gae_lambda
  if config.adaptive_lambda_alpha is not None:
    actor_lambda = length_adaptive_lambda(loss_mask, config.adaptive_lambda_alpha)
  advantages, returns = estimate(config, rewards, values, loss_mask, groups, actor_lambda)
  target = config.critic_warmup_lambda if warming_up else config.target_lambda
  if has_critic and not (isinstance(actor_lambda, float) and target == actor_lambda):
    _, returns = estimate(config, rewards, values, loss_mask, groups, target)
  return advantages, returns
