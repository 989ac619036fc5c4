"""Rollout correction in the learner: TIS weights and rejection on a `TrainExample`.

`correct(config, batch, example)` applies `PpoExtConfig.rollout_is` / `rollout_rs` (verl's
`algorithm.rollout_correction`) to one rollout batch: importance weights
`pi_old / pi_sampler` from the trainer's old log-probs and the sampler's recorded ones
(`TrajectoryBatch.sampler_logps`), over the loss mask (agent tokens, every turn) restricted
to tokens whose sampler log-prob is known (`MultiTurnBatch.sampler_logp_mask`; the EOS
tokens put back after the sampler stripped them have none and keep weight 1). The weights
go on the example as `rollout_is_weights`, which every policy loss multiplies in; rejected
tokens leave the example's loss mask (for the actor and the critic, as verl's modified
response mask). The metrics, under `rollout/`, are described in `ops.rollout_is_weights` and
`ops.rollout_rejection_mask`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from tunix_ppo_ext._src.ops import rollout_correction as rc


def enabled(config: Any) -> bool:
  """Whether the config asks for rollout correction."""
  return getattr(config, "rollout_is", None) is not None or (
    getattr(config, "rollout_rs", None) is not None
  )


def correct(config: Any, batch: Any, example: Any) -> tuple[Any, dict[str, float]]:
  """`(example with weights and rejections, metrics)`; unchanged and `{}` when disabled.

  Raises:
    ValueError: correction is configured but the batch has no sampler log-probs.
  """
  if not enabled(config):
    return example, {}
  if batch.sampler_logps is None:
    raise ValueError(
      "PpoExtConfig.rollout_is/rollout_rs need the sampler's log-probs: the rollout "
      "returned none (set return_logprobs=True in the rollout config)"
    )
  loss_mask = jnp.asarray(example.loss_mask, jnp.float32)
  known = loss_mask
  if getattr(batch, "sampler_logp_mask", None) is not None:
    known = known * jnp.asarray(batch.sampler_logp_mask, jnp.float32)
  old, sampler = example.old_per_token_logps, jnp.asarray(batch.sampler_logps, jnp.float32)
  metrics: dict[str, Any] = {}
  changes: dict[str, Any] = {}
  if config.rollout_is is not None:
    weights, metrics = rc.rollout_is_weights(
      old, sampler, known, level=config.rollout_is, threshold=config.rollout_is_threshold
    )
    changes["rollout_is_weights"] = jnp.where(known > 0, weights, 1.0) * loss_mask
  if config.rollout_rs is not None:
    keep, rs_metrics = rc.rollout_rejection_mask(
      old,
      sampler,
      known,
      mode=config.rollout_rs,
      upper=config.rollout_rs_threshold,
      lower=config.rollout_rs_threshold_lower,
    )
    metrics |= rs_metrics
    changes["loss_mask"] = changes["completion_mask"] = loss_mask * keep
  has_tokens = float(jnp.sum(known)) > 0  # no statistic of an empty set
  published = {f"rollout/{k}": float(v) for k, v in metrics.items()} if has_tokens else {}
  return example.replace(**changes), published
