"""The rollout phase's advantages and value targets (no tunix).

`advantages_and_returns` runs the configured estimator (`PpoExtConfig.advantage_estimator`:
a name in our plugin registry, built-ins included, called through its keyword protocol;
else `fallback`, the one the caller found in tunix's `function_registry`, called with
tunix's PPO signature) with the policy's lambda for the advantages and, where it differs,
with the value targets' lambda for the returns.

`config` is a `PpoExtConfig`, read by attribute.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch, contiguous_group_ids
from tunix_ppo_ext._src.metrics import signal
from tunix_ppo_ext._src.ops.advantages import length_adaptive_lambda
from tunix_ppo_ext._src.plugins import protocols, registry


def norm_by_std(config: Any, estimator: str) -> bool:
  """Whether group estimator `estimator` divides by its groups' std under `config`
  (`gigpo_norm_by_std` for `gigpo`, else `norm_adv_by_std`)."""
  return getattr(config, norm_by_std_field(estimator))


def norm_by_std_field(estimator: str) -> str:
  """The config field that feeds estimator `estimator`'s `norm_by_std` input."""
  return "gigpo_norm_by_std" if estimator == "gigpo" else "norm_adv_by_std"


# the config fields `estimate` passes to a registered estimator, by the input each feeds
# (`norm_by_std`: `norm_by_std_field`); an estimator reads those of the inputs it names
_FIELD_INPUTS = {
  "gamma": "gamma",
  "gamma_turn": "gamma_turn",
  "gae_lambda": "gae_lambda",
  "adaptive_lambda_alpha": "gae_lambda",
  "whiten_advantages": "whiten",
  "gigpo_step_weight": "step_weight",
}
ESTIMATOR_FIELDS = (*_FIELD_INPUTS, "norm_adv_by_std", "gigpo_norm_by_std")


def fields_read(config: Any, estimator: str) -> frozenset[str] | None:
  """Which of `ESTIMATOR_FIELDS` advantage estimator `estimator` reads under `config`
  (`estimate`'s inputs its signature names; `gamma` also as `gamma_turn`'s default, the
  critic's value targets through the estimator's own `gae_lambda`). None: not known (an
  estimator of tunix's registry, or one taking `**kwargs`)."""
  if not registry.has(registry.ADVANTAGE_ESTIMATORS, estimator):
    return None
  wanted = protocols.wanted_inputs(registry.get(registry.ADVANTAGE_ESTIMATORS, estimator))
  if wanted is None:
    return None
  read = {field for field, name in _FIELD_INPUTS.items() if name in wanted}
  if "norm_by_std" in wanted:
    read.add(norm_by_std_field(estimator))
  if "gamma_turn" in wanted and config.gamma_turn is None:
    read.add("gamma")
  return frozenset(read)


def group_ids(batch: TrajectoryBatch, num_generations: int) -> np.ndarray:
  """Each row's group: the source's, else consecutive runs of `num_generations` rows."""
  if batch.group_ids is not None:
    return np.asarray(batch.group_ids)
  return contiguous_group_ids(len(batch.loss_mask), num_generations)


def estimate(
  config: Any,
  rewards: Any,
  values: Any,
  loss_mask: Any,
  groups: np.ndarray,
  gae_lambda,
  *,
  normalize: bool = True,
  fallback: Callable[..., Any] | None = None,
  anchors: Any | None = None,
  name: str | None = None,
) -> tuple[Any, Any]:
  """`(advantages [B, T], returns [B, T])` of the configured estimator (or estimator
  `name`) with `gae_lambda` (a float, or one per row); `normalize=False` turns the config's
  `whiten_advantages` and its group std division (`norm_by_std`) off. `anchors`: the
  batch's `[B, K]` anchor ids (GiGPO's step groups). A name not in the plugin registry
  runs `fallback` (tunix's estimator of that name, tunix's PPO signature).

  Raises:
    KeyError: the name is not in the plugin registry and no `fallback` is given.
  """
  name = name or config.advantage_estimator
  if registry.has(registry.ADVANTAGE_ESTIMATORS, name):
    estimator = registry.get(registry.ADVANTAGE_ESTIMATORS, name)
    if anchors is None and "anchor_ids" in (protocols.wanted_inputs(estimator) or ()):
      raise ValueError(
        f"advantage estimator {name!r} needs each agent turn's anchor state (the batch's "
        "`anchor_ids`), which this trajectory source does not give: use the multi-turn "
        "rollout (MultiTurnRollout, AgenticPpoLearner) or set TrajectoryBatch.anchor_ids"
      )
    return protocols.call_estimator(
      estimator,
      rewards=rewards,
      values=values,
      mask=loss_mask,
      scores=jnp.sum(rewards * loss_mask, axis=-1),
      group_ids=jnp.asarray(groups),
      gamma=config.gamma,
      gae_lambda=gae_lambda,
      gamma_turn=config.turn_discount,
      whiten=normalize and config.whiten_advantages,
      norm_by_std=normalize and norm_by_std(config, name),
      step_weight=config.gigpo_step_weight,
      **({} if anchors is None else {"anchor_ids": jnp.asarray(anchors)}),
    )
  if fallback is None:
    raise KeyError(f"advantage estimator {name!r} is not in the plugin registry")
  return fallback(
    rewards=rewards,
    values=values,
    completion_mask=loss_mask,
    gamma=config.gamma,
    gae_lambda=gae_lambda,
  )


def advantages_and_returns(
  config: Any,
  rewards: Any,
  values: Any,
  loss_mask: Any,
  groups: np.ndarray,
  *,
  warming_up: bool,
  has_critic: bool,
  fallback: Callable[..., Any] | None = None,
  anchors: Any | None = None,
) -> tuple[Any, Any]:
  """`(advantages [B, T], returns [B, T])`: the advantages with the policy's lambda
  (`gae_lambda`, or per row `adaptive_lambda_alpha`'s), the returns with the value
  targets' (`critic_warmup_lambda` on warm-up steps, else `target_lambda`; estimated again
  only for a critic, and only where that lambda differs)."""
  actor_lambda = policy_lambda(config, loss_mask)
  run = functools.partial(
    estimate, config, rewards, values, loss_mask, groups, fallback=fallback, anchors=anchors
  )
  advantages, returns = run(actor_lambda)
  target = config.critic_warmup_lambda if warming_up else config.target_lambda
  if has_critic and not (isinstance(actor_lambda, float) and target == actor_lambda):
    _, returns = run(target)
  return advantages, returns


def policy_lambda(config: Any, loss_mask: Any) -> Any:
  """The advantages' lambda: `gae_lambda`, or one per row from `adaptive_lambda_alpha`."""
  if config.adaptive_lambda_alpha is not None:
    return length_adaptive_lambda(loss_mask, config.adaptive_lambda_alpha)
  return config.gae_lambda


def unnormalized_advantages(
  config: Any,
  rewards: Any,
  values: Any,
  loss_mask: Any,
  groups: np.ndarray,
  fallback: Callable[..., Any] | None = None,
  anchors: Any | None = None,
) -> Any:
  """`[B, T]` the configured estimator's advantages with the policy's lambda, in the
  rewards' units: neither whitened (`whiten_advantages`) nor divided by the group's std
  (`norm_by_std`), so every estimator's are on one scale (`metrics.stats.
  advantage_noise`). An estimator that normalizes regardless (REINFORCE++ whitens over
  the batch) gives its normalized ones."""
  lam = policy_lambda(config, loss_mask)
  advantages, _ = estimate(
    config,
    rewards,
    values,
    loss_mask,
    groups,
    lam,
    normalize=False,
    fallback=fallback,
    anchors=anchors,
  )
  return advantages


def common_scale_noise(
  config: Any,
  rewards: Any,
  loss_mask: Any,
  groups: np.ndarray,
  advantages: tuple[Any, Any, Any],
  anchors: Any | None = None,
  name: str | None = None,
) -> dict[str, float]:
  """The advantages' noise on the true advantage's scale (`metrics.signal`): each agent
  token's advantage divided by the configured estimator's (or `name`'s) signal coefficient,
  as `learner/advantage_noise` (raw: `unnormalized_advantages`) and
  `learner/advantage_noise_trained` (as trained: after the std division or whitening),
  each with its per-turn form (`_turn`). `advantages`: `(raw, trained, returns)` `[B, T]`."""
  raw, trained, returns = (np.asarray(a, np.float64) for a in advantages)
  terms = {
    "rewards": np.asarray(rewards, np.float64),
    "mask": np.asarray(loss_mask),
    "groups": np.asarray(groups),
    "anchors": None if anchors is None else np.asarray(anchors),
    "advantages_raw": raw,
    "returns": returns,
    "step_weight": float(config.gigpo_step_weight),
    "gamma_turn": float(config.turn_discount),
  }
  name, metrics = name or config.advantage_estimator, {}
  trained_options = (norm_by_std(config, name), config.whiten_advantages)
  options = {"": (False, False), "_trained": trained_options}
  for suffix, (std_division, whiten) in options.items():
    c = signal.signal_coefficients(name, terms, std_division=std_division, whiten=whiten)
    values = raw if not suffix else trained
    for unit, value in signal.common_scale_noise(values, c, terms["mask"]).items():
      metrics[f"learner/advantage_noise{suffix}{'_turn' if unit == 'turn' else ''}"] = value
  return metrics
