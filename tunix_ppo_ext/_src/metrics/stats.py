"""Statistics of one rollout batch: the learner's own (`batch/...`) and tunix's.

Per-token families (`old_value`, `advantage`, `return`) are taken over the loss mask only;
per-episode families (`score`, `reward`, `episode_return`, `response_length`,
`num_turns`) over every row. A family with no element is left out (never NaN).
`tunix_statistics` gives what tunix's `PPOLearner` logs, under tunix's names;
`rollout_statistics` both for a `TrajectoryBatch`, as the learner logs them each step.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.metrics import signal
from tunix_ppo_ext._src.metrics.keys import STATS

_REDUCERS = {"min": np.min, "mean": np.mean, "max": np.max}


def min_mean_max(name: str, values: Any) -> dict[str, float]:
  """`{name/min, name/mean, name/max}` of the elements of `values` ({} when empty)."""
  array = np.asarray(values, np.float64).ravel()
  if not array.size:
    return {}
  return {f"{name}/{s}": float(_REDUCERS[s](array)) for s in STATS}


VARIANCE_FLOOR = 1e-8  # relative to the returns' mean square (at least 1)


def explained_variance(values: Any, returns: Any, mask: Any) -> float | None:
  """`1 - Var[returns - values] / Var[returns]` over the mask.

  None when undefined: fewer than 2 masked tokens, or returns (nearly) constant, `Var[returns]
  <= VARIANCE_FLOOR * max(1, mean(returns^2))`, where the ratio would be float noise (a
  solved task's returns differ by rounding only, and the quotient runs to -1e6).
  """
  mask = np.asarray(mask) > 0
  ret = np.asarray(returns, np.float64)[mask]
  if ret.size < 2 or np.var(ret) <= VARIANCE_FLOOR * max(1.0, float(np.mean(ret**2))):
    return None
  residual = ret - np.asarray(values, np.float64)[mask]
  return float(1.0 - np.var(residual) / np.var(ret))


def advantage_noise(advantages: Any, mask: Any) -> dict[str, float]:
  """`learner/advantage_sq_mean` (the mean over agent tokens of `A^2`) and
  `learner/advantage_sq_mean_turn` (the mean over agent turns, maximal runs of `mask == 1`,
  of the square of the turn's mean advantage); {} without agent tokens.

  Fed advantages in the rewards' units (`advantage_step.unnormalized_advantages`), this is
  how large the policy-gradient's weights are: the gradient's variance grows with
  `E[A^2] E[|grad log pi|^2]` (Greensmith et al. 2004). Estimators that scale their signal
  differently (GRPO's group mean includes the episode itself) compare on one scale only
  divided by their signal coefficients (`metrics.signal`, `learner/advantage_noise`).
  """
  agent = np.asarray(mask) > 0
  noise = signal.common_scale_noise(advantages, agent.astype(np.float64), agent)
  if not noise:
    return {}
  return {
    "learner/advantage_sq_mean": noise["token"],
    "learner/advantage_sq_mean_turn": noise["turn"],
  }


def step_group_statistics(anchor_ids: Any, groups: Any, mask: Any) -> dict[str, float]:
  """GiGPO's step groups on a batch (`ops.compute_gigpo_advantages`): the mean number of
  agent turns in the step group of an agent turn (`learner/gigpo_step_group_size`) and the
  share of agent turns alone in theirs (`learner/gigpo_step_singleton_frac`, whose step
  advantage is 0); {} without agent turns. Turns are maximal runs of `mask == 1`; a row's
  k-th turn has anchor `anchor_ids[row, k]`."""
  agent = np.asarray(mask) > 0
  anchors = np.asarray(anchor_ids)
  starts = agent & ~np.pad(agent[:, :-1], ((0, 0), (1, 0)))
  played = np.minimum(starts.sum(axis=1), anchors.shape[1])
  keys = [
    (int(g), int(anchors[row, k]))
    for row, g in enumerate(np.asarray(groups))
    for k in range(played[row])
  ]
  if not keys:
    return {}
  sizes = collections.Counter(keys)
  size = np.array([sizes[key] for key in keys], np.float64)
  return {
    "learner/gigpo_step_group_size": float(size.mean()),
    "learner/gigpo_step_singleton_frac": float(np.mean(size == 1)),
  }


def batch_statistics(
  *,
  loss_mask: Any,
  token_rewards: Any,
  rewards: Any,
  values: Any,
  advantages: Any,
  returns: Any,
  episode_returns: Any | None = None,
  num_turns: Any | None = None,
  truncated: Any | None = None,
  turn_limited: Any | None = None,
  group_ids: Any | None = None,
) -> dict[str, float]:
  """Internal-name statistics of a batch of `B` rows and `T` completion tokens.

  Args:
    loss_mask: `[B, T]` 1 on agent tokens.
    token_rewards: `[B, T]` raw environment / reward-model rewards (`score` = row sum).
    rewards: `[B, T]` rewards after the KL penalty (`reward` = row sum).
    values, advantages, returns: `[B, T]` per-token old values, advantages and returns.
    episode_returns, num_turns, truncated, turn_limited: optional `[B]` episode outcomes
      of a multi-turn source; without them the episode return is the score and an episode
      is one turn.
    group_ids: optional `[B]` group of each row (episodes of one prompt); with it
      `batch/in_group_return_std` is the mean over groups of two or more rows of the
      population std of their episode returns (RAGEN's "reward std"; left out when every
      group has one row). `batch/episode_return_std` is the whole batch's.
  """
  mask = np.asarray(loss_mask) > 0
  scores = np.asarray(token_rewards, np.float64).sum(-1)
  stats: dict[str, float] = {}
  for name, per_token in (("old_value", values), ("advantage", advantages), ("return", returns)):
    stats |= min_mean_max(f"batch/{name}", np.asarray(per_token)[mask])
  stats |= min_mean_max("batch/score", scores)
  stats |= min_mean_max("batch/reward", np.asarray(rewards, np.float64).sum(-1))
  outcomes = scores if episode_returns is None else np.asarray(episode_returns, np.float64)
  stats |= min_mean_max("batch/episode_return", outcomes)
  stats |= return_spread(outcomes, group_ids)
  stats |= min_mean_max("batch/response_length", mask.sum(-1))
  stats |= min_mean_max("batch/num_turns", np.ones_like(scores) if num_turns is None else num_turns)
  if truncated is not None and np.size(truncated):
    stats["batch/truncated_frac"] = float(np.mean(truncated))
  if turn_limited is not None and np.size(turn_limited):
    stats["batch/turn_limit_frac"] = float(np.mean(turn_limited))
  return stats


def return_spread(episode_returns: Any, group_ids: Any | None) -> dict[str, float]:
  """`batch/episode_return_std` and, when some group has two or more rows,
  `batch/in_group_return_std` (mean of the groups' population stds); {} for no row."""
  values = np.asarray(episode_returns, np.float64).ravel()
  if not values.size:
    return {}
  out = {"batch/episode_return_std": float(values.std())}
  if group_ids is not None:
    groups = np.asarray(group_ids).ravel()
    stds = [values[groups == g].std() for g in np.unique(groups) if np.sum(groups == g) > 1]
    if stds:
      out["batch/in_group_return_std"] = float(np.mean(stds))
  return out


def tunix_statistics(
  *,
  loss_mask: Any,
  attention_mask: Any,
  token_rewards: Any,
  rewards: Any,
  values: Any,
  advantages: Any,
  returns: Any,
  kl: Any | None,
) -> dict[str, tuple[float, Any]]:
  """What tunix 0.1.7's `PPOLearner` logs for a batch, under its names and aggregations.

  `rewards/score/*` (raw score per episode), `rewards/reward/*` (sum of the rewards after
  the KL penalty), `rewards/reward_kl_penalty` (mean over episodes of the per-episode
  mean KL over the loss mask, when there is a KL), `generation/completions/*_length`
  (real completion tokens), `advantages/*`, `advantages/returns/*` and
  `advantages/old_values/*` over the loss mask. Values are `(value, aggregation)` as
  `RLCluster.buffer_metrics` takes them; a family with no element is left out.
  """
  mask = np.asarray(loss_mask) > 0
  out: dict[str, tuple[float, Any]] = {}

  def family(prefix: str, array: Any, suffix: str = "") -> None:
    array = np.asarray(array, np.float64).ravel()
    if array.size:
      for stat in STATS:
        out[f"{prefix}/{stat}{suffix}"] = (float(_REDUCERS[stat](array)), _REDUCERS[stat])

  family("rewards/score", np.sum(np.asarray(token_rewards, np.float64), axis=-1))
  family("rewards/reward", np.sum(np.asarray(rewards, np.float64), axis=-1))
  if kl is not None:
    per_token = np.asarray(kl, np.float64) * mask
    per_episode = per_token.sum(-1) / np.maximum(mask.sum(-1), 1)
    out["rewards/reward_kl_penalty"] = (float(per_episode.mean()), np.mean)
  family("generation/completions", np.asarray(attention_mask).sum(-1), "_length")
  family("advantages", np.asarray(advantages)[mask])
  family("advantages/returns", np.asarray(returns)[mask])
  family("advantages/old_values", np.asarray(values)[mask])
  return out


def trailing_mean(values: Any) -> np.ndarray:
  """Trailing mean over `max(1, len // 20)` points (a shorter window at the start): how a
  sweep smooths a run's per-step curve.

  Args:
    values: a 1-D sequence of per-step values.

  Returns:
    float `[len(values)]`, the smoothed curve.
  """
  x = np.asarray(values, np.float64)
  window = max(1, len(x) // 20)
  sums = np.cumsum(np.concatenate([[0.0], x]))
  starts = np.maximum(np.arange(1, len(x) + 1) - window, 0)
  return (sums[1:] - sums[starts]) / (np.arange(1, len(x) + 1) - starts)


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
  common = {
    "loss_mask": mask, "token_rewards": batch.token_rewards, "rewards": rewards,
    "values": values, "advantages": advantages, "returns": returns,
  }  # fmt: skip
  stats = batch_statistics(
    **common, episode_returns=batch.episode_returns, num_turns=batch.num_turns,
    truncated=batch.truncated, turn_limited=batch.turn_limited, group_ids=groups,
  )  # fmt: skip
  stats = {k: v for k, v in stats.items() if has_critic or "old_value" not in k}
  stats |= coefficients
  if kl is not None and mask.sum() > 0:
    stats["learner/kl"] = float(np.asarray(kl)[mask > 0].mean())
  variance = explained_variance(values, returns, mask) if has_critic else None
  if variance is not None:
    stats["learner/explained_variance"] = variance
  if rollout_s > 0:  # agent tokens (loss mask); every real completion token apart
    stats["rollout/tokens_per_s"] = float(mask.sum()) / rollout_s
    completion = float(np.asarray(batch.attention_mask).sum())
    stats["rollout/completion_tokens_per_s"] = completion / rollout_s
  tunix_stats = tunix_statistics(**common, attention_mask=batch.attention_mask, kl=kl)
  tunix_stats = {k: v for k, v in tunix_stats.items() if has_critic or "old_values" not in k}
  return stats, tunix_stats, variance


SAMPLER_TRAINER = ("logp_diff_mean", "logp_diff_max", "prob_diff_mean", "prob_diff_max")
SAMPLER_TRAINER += ("probs_pearson_corr",)


def sampler_trainer_agreement(
  sampler_logps: Any, trainer_logps: Any, mask: Any
) -> dict[str, tuple[float, Any]]:
  """tunix's agentic GRPO's `sampler_trainer/*` on agent tokens (`mask`), under its names
  and aggregations: the mean and max of `|sampler - trainer|` log-prob and probability,
  and the Pearson correlation of the two probabilities; {} without agent tokens.

  Args:
    sampler_logps: `[B, T]` the sampler's log-probs of the sampled tokens.
    trainer_logps: `[B, T]` the trainer's log-probs of the same tokens.
    mask: `[B, T]` 1 on agent tokens.

  Returns:
    `{name: (value, aggregation)}`, as tunix's `buffer_metrics` takes them.
  """
  agent = np.asarray(mask) > 0
  if not agent.any():
    return {}
  sampler = np.asarray(sampler_logps, np.float64)[agent]
  trainer = np.asarray(trainer_logps, np.float64)[agent]
  logp_diff = np.abs(sampler - trainer)
  p_sampler, p_trainer = np.exp(sampler), np.exp(trainer)
  prob_diff = np.abs(p_sampler - p_trainer)
  d_sampler, d_trainer = p_sampler - p_sampler.mean(), p_trainer - p_trainer.mean()
  variance = max(float(np.mean(d_sampler**2) * np.mean(d_trainer**2)), 1e-12)
  pearson = float(np.mean(d_sampler * d_trainer) / np.sqrt(variance))
  values = (logp_diff.mean(), logp_diff.max(), prob_diff.mean(), prob_diff.max(), pearson)
  reducers = (np.mean, np.max, np.mean, np.max, np.mean)
  return {
    f"sampler_trainer/{name}": (float(value), reduce)
    for name, value, reduce in zip(SAMPLER_TRAINER, values, reducers, strict=True)
  }
