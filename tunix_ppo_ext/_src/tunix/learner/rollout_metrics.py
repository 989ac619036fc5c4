"""The rollout phase's batch metrics, out of `PpoExtLearner`: our names (`batch_stats`,
the reference KL, the controller's and entropy coefficients, the critic's fit, the
rollout's token rates) and tunix's own names, as stock PPO logs them."""

from __future__ import annotations

from typing import Any

import numpy as np

from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.metrics import stats as batch_stats


def rollout_statistics(
  batch: TrajectoryBatch,
  rewards: Any,
  values: Any,
  advantages: Any,
  returns: Any,
  kl: Any,
  *,
  groups: np.ndarray,
  has_critic: bool,
  coefficients: dict[str, float],
  rollout_s: float,
) -> tuple[dict[str, float], dict[str, Any], float | None]:
  """`(ours, tunix's, explained variance)`: our `{name: value}` (with `coefficients`, e.g.
  `learner/kl_coef`), tunix's `{name: (value, aggregation)}`, and the critic's explained
  variance (None without a critic or agent tokens). Without a critic no value statistic."""
  mask = np.asarray(batch.loss_mask)
  values, returns = np.asarray(values), np.asarray(returns)
  stats = batch_stats.batch_statistics(
    loss_mask=mask,
    token_rewards=batch.token_rewards,
    rewards=rewards,
    values=values,
    advantages=advantages,
    returns=returns,
    episode_returns=batch.episode_returns,
    num_turns=batch.num_turns,
    truncated=batch.truncated,
    turn_limited=batch.turn_limited,
    group_ids=groups,
  )
  stats = {k: v for k, v in stats.items() if has_critic or "old_value" not in k}
  stats |= coefficients
  if kl is not None and mask.sum() > 0:
    stats["learner/kl"] = float(np.asarray(kl)[mask > 0].mean())
  variance = batch_stats.explained_variance(values, returns, mask) if has_critic else None
  if variance is not None:
    stats["learner/explained_variance"] = variance
  if rollout_s > 0:  # agent tokens (loss mask); every real completion token apart
    stats["rollout/tokens_per_s"] = float(mask.sum()) / rollout_s
    completion = float(np.asarray(batch.attention_mask).sum())
    stats["rollout/completion_tokens_per_s"] = completion / rollout_s
  tunix_stats = batch_stats.tunix_statistics(
    loss_mask=mask,
    attention_mask=batch.attention_mask,
    token_rewards=batch.token_rewards,
    rewards=rewards,
    values=values,
    advantages=advantages,
    returns=returns,
    kl=kl,
  )
  tunix_stats = {k: v for k, v in tunix_stats.items() if has_critic or "old_values" not in k}
  return stats, tunix_stats, variance
