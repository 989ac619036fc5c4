"""Rollout correction: the sampler-trainer gap, with verl's `rollout_is` / `rollout_rs`.

The sampler (another engine, another precision) reports log-probs `q = log pi_sampler`
that differ from the trainer's `p = log pi_old` for the same tokens. Truncated importance
sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
RL training") reweights the policy loss by `w = pi_old / pi_sampler` computed in log space,
per token or per sequence, truncated from above; rejection sampling masks the tokens or
sequences whose ratio statistic leaves a band (IcePop, Ling team 2025). The weights are
stop-gradient'ed (they change the measure, not the objective).

All arrays are `[B, T]` with a 0/1 mask of the tokens the weights apply to (agent tokens
whose sampler log-prob is known); everything is float32 and an empty mask gives no NaN.
Semantics follow verl's `rollout_corr_helper` (`compute_rollout_correction_weights`,
`compute_rollout_rejection_mask`); each function says where it deviates.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

from tunix_ppo_ext._src.names import ROLLOUT_IS_LEVELS, ROLLOUT_RS_MODES
from tunix_ppo_ext._src.ops.masked import masked_mean, masked_sum

__all__ = [
  "ROLLOUT_IS_LEVELS",
  "ROLLOUT_RS_MODES",
  "SAFETY_BOUND",
  "rollout_is_weights",
  "rollout_rejection_mask",
  "rs_bounds",
]

SAFETY_BOUND = 20.0  # |log-ratio| clamp before exp (verl's SAFETY_BOUND)


def _inputs(trainer_logp, sampler_logp, mask):
  chex.assert_rank([trainer_logp, sampler_logp, mask], 2)
  chex.assert_equal_shape([trainer_logp, sampler_logp, mask])
  mask = mask.astype(jnp.float32)
  log_ratio = (trainer_logp.astype(jnp.float32) - sampler_logp.astype(jnp.float32)) * mask
  return jax.lax.stop_gradient(log_ratio), mask


def rollout_is_weights(
  trainer_logp: jax.Array,
  sampler_logp: jax.Array,
  mask: jax.Array,
  *,
  level: str = "token",
  threshold: float = 2.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Truncated importance weights `min(w, threshold)`, `w = pi_old / pi_sampler`, `[B, T]`.

  `level="token"`: `w_t = exp(clip(p_t - q_t, -20, 20))`; `"sequence"`: one weight per row,
  the product in log space, `w = exp(clip(sum_t (p_t - q_t), -20, 20))`, on each token.
  Weights are 0 outside the mask and carry no gradient.

  Metrics, of the weights before truncation (verl's `compute_is_metrics`): `is_mean` and
  `is_max` over the mask; `is_std` and `is_ess` (effective sample size, normalised to
  (0, 1], `1 / mean((w' / mean w')^2)`) of `w' = clip(w, 1 / threshold, threshold)` as verl
  computes them; `is_frac_high` / `is_frac_low`: share of masked tokens with `w` above
  `threshold` / below `1 / threshold`. Deviation: sequence-level `is_max` and fractions are
  over the masked tokens (verl takes them over rows, empty rows included). An empty mask
  gives 0 for every metric.

  Args:
    trainer_logp: `[B, T]` log-probs of the sampled tokens under the trainer's old policy
      (`pi_old`), any float dtype.
    sampler_logp: `[B, T]` log-probs the sampler (e.g. vLLM) reported (`pi_sampler`).
    mask: `[B, T]` 0/1 loss mask.
    level: `"token"` or `"sequence"` (ValueError otherwise).
    threshold: the truncation bound of the weights, > 0 (verl: 2).

  Returns:
    `(weights, metrics)`: float32 `[B, T]` truncated weights in `[0, threshold]`, 0 off
    the mask; metrics `is_mean`, `is_max`, `is_std`, `is_ess`, `is_frac_high`,
    `is_frac_low`, float32 scalars.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> trainer_logp = jnp.log(jnp.array([[0.5, 0.5, 0.9]]))
    >>> sampler_logp = jnp.log(jnp.array([[0.5, 0.2, 0.3]]))
    >>> weights, metrics = ops.rollout_is_weights(trainer_logp, sampler_logp, jnp.ones((1, 3)))
    >>> print(np.round(weights, 4))
    [[1. 2. 2.]]
  """
  if level not in ROLLOUT_IS_LEVELS:
    raise ValueError(f"rollout_is must be one of {ROLLOUT_IS_LEVELS}; got {level!r}")
  log_ratio, mask = _inputs(trainer_logp, sampler_logp, mask)
  if level == "sequence":
    log_ratio = jnp.broadcast_to(masked_sum(log_ratio, mask, axis=-1)[:, None], mask.shape)
  weights = jnp.exp(jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)) * mask
  metrics = _is_metrics(weights, log_ratio, mask, threshold)
  return jnp.minimum(weights, threshold), metrics


def _is_metrics(weights, log_ratio, mask, threshold) -> dict[str, jax.Array]:
  """verl's IS-weight statistics over the mask (see `rollout_is_weights`)."""
  count = jnp.sum(mask)
  clamped = jnp.clip(weights, 1.0 / threshold, threshold)
  mean_c = masked_mean(clamped, mask)
  var = masked_mean(jnp.square(clamped), mask) - jnp.square(mean_c)
  normalised_sq = masked_mean(jnp.square(clamped / (mean_c + 1e-8)), mask)
  has = count > 0
  return {
    "is_mean": masked_mean(weights, mask),
    "is_max": jnp.max(jnp.where(mask > 0, weights, 0.0)),
    "is_std": jnp.where(count > 1, jnp.sqrt(jnp.maximum(var, 0.0)), 0.0),
    "is_ess": jnp.where(has, 1.0 / jnp.where(has, normalised_sq, 1.0), 0.0),
    "is_frac_high": masked_mean((log_ratio > math.log(threshold)).astype(jnp.float32), mask),
    "is_frac_low": masked_mean((log_ratio < -math.log(threshold)).astype(jnp.float32), mask),
  }


def rs_bounds(mode: str, upper: float, lower: float | None = None) -> tuple[float | None, float]:
  """`(lower, upper)` on the statistic of `mode` from the user's thresholds (verl's parser).

  k1 modes: a band on `pi_sampler / pi_old` given as ratios, `lower` defaulting to
  `1 / upper`; returned in log space. k2/k3 modes: `upper` only (a `lower` is refused).
  """
  if mode not in ROLLOUT_RS_MODES:
    raise ValueError(f"rollout_rs must be one of {ROLLOUT_RS_MODES}; got {mode!r}")
  if not upper > 0 or (lower is not None and not lower > 0):
    raise ValueError(f"rollout_rs thresholds must be > 0; got lower={lower!r}, upper={upper!r}")
  if not mode.endswith("k1"):
    if lower is not None:
      raise ValueError(f"rollout_rs={mode!r} takes an upper threshold only; got lower={lower!r}")
    return None, float(upper)
  lower = 1.0 / upper if lower is None else lower
  if not lower < upper:
    raise ValueError(f"rollout_rs band needs lower < upper; got lower={lower!r}, upper={upper!r}")
  return math.log(lower), math.log(upper)


def _statistic(log_ratio: jax.Array, kind: str) -> jax.Array:
  """Per-token k1 / k2 / k3 of the clamped log-ratio `l = p - q`."""
  l = jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)  # noqa: E741
  if kind == "k1":
    return -l
  if kind == "k2":
    return 0.5 * jnp.square(l)
  return jnp.expm1(l) - l


def rollout_rejection_mask(
  trainer_logp: jax.Array,
  sampler_logp: jax.Array,
  mask: jax.Array,
  *,
  mode: str = "token_k1",
  upper: float = 2.0,
  lower: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Keep-mask `[B, T]` (1 keep, 0 reject) of verl's `rollout_rs` option `mode`.

  The per-token statistic (`k1 = q - p`, `k2 = (p - q)^2 / 2`, `k3 = e^(p-q) - 1 - (p - q)`,
  log-ratio clamped to [-20, 20]) is used per token (`token_*`) or reduced over the row's
  mask (`seq_sum_*`, `seq_mean_*`: the sequence-mean log-ratio variant, `seq_max_*`); a
  token or row is kept when the statistic lies in `[log lower, log upper]` (k1; IcePop's
  two-sided band on `pi_sampler / pi_old`, verl's orientation) or is `<= upper` (k2, k3).
  Tokens outside `mask` are kept (the caller's loss mask already excludes them).

  Metrics: `rs_masked_frac`, the share of masked tokens rejected; `rs_seq_masked_frac`, the
  share of non-empty rows with a rejected token (0 for an empty mask).

  Args:
    trainer_logp: `[B, T]` log-probs of the sampled tokens under the trainer's old policy
      (`p`, log `pi_old`), any float dtype.
    sampler_logp: `[B, T]` log-probs the sampler reported (`q`, log `pi_sampler`).
    mask: `[B, T]` 0/1 loss mask.
    mode: one of `ROLLOUT_RS_MODES`, `<level>_<statistic>` (ValueError otherwise).
    upper: the upper threshold, > 0: a ratio for k1 modes, a bound on the statistic for
      k2 / k3.
    lower: k1 modes only: the band's lower ratio, `< upper` (default `1 / upper`).

  Returns:
    `(keep, metrics)`: float32 `[B, T]`, 1 keep and 0 reject (1 off the mask); metrics
    `rs_masked_frac`, `rs_seq_masked_frac`, float32 scalars.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> trainer_logp = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5]]))
    >>> sampler_logp = jnp.log(jnp.array([[0.5, 0.2], [0.4, 0.6]]))
    >>> keep, metrics = ops.rollout_rejection_mask(trainer_logp, sampler_logp, jnp.ones((2, 2)))
    >>> keep.tolist(), round(metrics["rs_masked_frac"].item(), 4)
    ([[1.0, 0.0], [1.0, 1.0]], 0.25)
  """
  low, high = rs_bounds(mode, upper, lower)
  log_ratio, mask = _inputs(trainer_logp, sampler_logp, mask)
  level, kind = mode.rsplit("_", 1)
  stat = _statistic(log_ratio, kind)
  if level == "seq_sum":
    stat = masked_sum(stat, mask, axis=-1)[:, None]
  elif level == "seq_mean":
    stat = masked_mean(stat, mask, axis=-1)[:, None]
  elif level == "seq_max":
    stat = jnp.max(jnp.where(mask > 0, stat, -jnp.inf), axis=-1, keepdims=True)
  keep = stat <= high if low is None else (stat >= low) & (stat <= high)
  keep = jnp.broadcast_to(keep, mask.shape) | (mask == 0)
  rejected = (~keep).astype(jnp.float32)
  rows = (jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)
  metrics = {
    "rs_masked_frac": masked_mean(rejected, mask),
    "rs_seq_masked_frac": masked_mean(jnp.max(rejected, axis=-1), rows),
  }
  return keep.astype(jnp.float32), metrics
