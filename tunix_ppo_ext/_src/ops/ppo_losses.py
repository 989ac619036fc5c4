"""PPO policy and value losses with verl's loss-aggregation modes.

Each loss is a pure function of per-token arrays `[B, T]` and a loss mask `[B, T]`
(1 on the agent's own tokens) returning `(loss, metrics)`; everything is computed
in float32 whatever the input dtype.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from tunix_ppo_ext._src.checks import did_you_mean
from tunix_ppo_ext._src.ops import kl as kl_lib
from tunix_ppo_ext._src.ops.logits import logps_and_entropy
from tunix_ppo_ext._src.ops.masked import masked_mean, masked_sum

__all__ = [
  "LOSS_AGG_MODES",
  "aggregate_loss",
  "canonical_loss_agg_mode",
  "clipped_surrogate",
  "entropy_from_logits",
  "policy_inputs",
  "policy_loss",
  "value_loss",
  "weighted",
]

LOSS_AGG_MODES = (
  "token-mean",
  "seq-mean-token-sum",
  "seq-mean-token-mean",
  "seq-mean-token-sum-norm",
)
_LOSS_AGG_ALIASES = {"sequence-mean-token-mean": "seq-mean-token-mean"}


def canonical_loss_agg_mode(mode: str) -> str:
  """Maps a mode or tunix alias to its verl spelling; ValueError (closest match) otherwise."""
  mode = _LOSS_AGG_ALIASES.get(mode, mode)
  if mode not in LOSS_AGG_MODES:
    accepted = list(LOSS_AGG_MODES) + list(_LOSS_AGG_ALIASES)
    raise ValueError(
      f"Unknown loss_agg_mode {mode!r}; accepted: {accepted}{did_you_mean(mode, accepted)}"
    )
  return mode


def aggregate_loss(per_token_loss: jax.Array, mask: jax.Array, loss_agg_mode: str) -> jax.Array:
  """Reduces a `[B, T]` per-token loss to a scalar over `mask`.

  - `token-mean`: masked sum / mask sum.
  - `seq-mean-token-sum`: mean over non-empty rows of the per-row masked sum.
  - `seq-mean-token-mean`: mean over non-empty rows of the per-row masked mean.
  - `seq-mean-token-sum-norm`: masked sum / `T` (Dr. GRPO's constant normaliser).
  An all-zero mask gives 0.

  Args:
    per_token_loss: `[B, T]` per-token loss, any float dtype.
    mask: `[B, T]` 0/1 loss mask (1 on the agent's own tokens).
    loss_agg_mode: one of `LOSS_AGG_MODES` above (or tunix's `sequence-mean-token-mean`);
      ValueError naming the closest mode otherwise.

  Returns:
    float32 scalar.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> loss = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    >>> mask = jnp.array([[1, 1, 1], [1, 0, 0]])
    >>> ops.aggregate_loss(loss, mask, "token-mean").item()
    2.5
    >>> ops.aggregate_loss(loss, mask, "seq-mean-token-mean").item()
    3.0
    >>> ops.aggregate_loss(loss, mask, "seq-mean-token-sum").item()
    5.0
  """
  mode = canonical_loss_agg_mode(loss_agg_mode)
  chex.assert_rank([per_token_loss, mask], 2)
  chex.assert_equal_shape([per_token_loss, mask])
  mask = mask.astype(jnp.float32)
  if mode == "token-mean":
    return masked_mean(per_token_loss, mask)
  if mode == "seq-mean-token-sum-norm":
    return masked_sum(per_token_loss, mask) / mask.shape[-1]
  row_has_tokens = (mask.sum(axis=-1) > 0).astype(jnp.float32)
  if mode == "seq-mean-token-sum":
    row_loss = masked_sum(per_token_loss, mask, axis=-1)
  else:
    row_loss = masked_mean(per_token_loss, mask, axis=-1)
  return masked_mean(row_loss, row_has_tokens)


def policy_inputs(
  logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """A policy loss's inputs in float32, shapes checked: `(logp, old_logp, advantages, mask)`,
  all `[B, T]` (per-sequence advantages `[B]` broadcast over the tokens)."""
  chex.assert_rank([logp, old_logp, mask], 2)
  chex.assert_equal_shape([logp, old_logp, mask])
  logp = logp.astype(jnp.float32)
  adv = jnp.asarray(advantages, jnp.float32)
  adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape)
  return logp, old_logp.astype(jnp.float32), adv, mask.astype(jnp.float32)


def clipped_surrogate(
  ratio: jax.Array, adv: jax.Array, epsilon_low: float, epsilon_high: float
) -> tuple[jax.Array, jax.Array]:
  """PPO's two surrogate terms `(-A r, -A clip(r, 1 - epsilon_low, 1 + epsilon_high))`."""
  return -adv * ratio, -adv * jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)


def weighted(per_token: jax.Array, is_weights: jax.Array | None) -> jax.Array:
  """`per_token * sg(is_weights)`, the rollout-correction weighting (unchanged without)."""
  if is_weights is None:
    return per_token
  chex.assert_equal_shape([per_token, is_weights])
  return per_token * jax.lax.stop_gradient(is_weights.astype(jnp.float32))


def policy_loss(
  per_token_logps: jax.Array,
  old_per_token_logps: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  epsilon_low: float = 0.2,
  epsilon_high: float = 0.2,
  epsilon_c: float | None = None,
  loss_agg_mode: str = "token-mean",
  entropy: jax.Array | None = None,
  entropy_coef: float | jax.Array = 0.0,
  ref_per_token_logps: jax.Array | None = None,
  kl_loss_coef: float | jax.Array = 0.0,
  kl_estimator: kl_lib.KlEstimator = kl_lib.kl_k3,
  kl_straight_through: bool = False,
  kl_clamp_value: float | None = None,
  per_token_kl: jax.Array | None = None,
  is_weights: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped PPO surrogate (Schulman et al. 2017) with asymmetric and dual clipping.

  `r = exp(clip(logp - old_logp, -20, 20))`, `pg1 = -A r`,
  `pg2 = -A clip(r, 1 - epsilon_low, 1 + epsilon_high)`, `clipped = max(pg1, pg2)`;
  with dual clip (Ye et al. 2020, arXiv:1912.09729) `min(clipped, -A epsilon_c)` where `A < 0`.
  `loss = agg(pg) - entropy_coef * agg(entropy) + kl_loss_coef * agg(kl)`.

  Args:
    per_token_logps: `[B, T]` log pi(a_t) of the policy being trained, any float dtype.
    old_per_token_logps: `[B, T]` log-probs of the policy that sampled the rollout.
    advantages: `[B, T]` per token or `[B]` per sequence.
    mask: `[B, T]` 0/1 loss mask (1 on the agent's own tokens).
    epsilon_low: lower clip range, in (0, 1): the ratio is clipped at `1 - epsilon_low`.
    epsilon_high: upper clip range, > 0 (DAPO's clip-higher when above `epsilon_low`).
    epsilon_c: dual-clip constant, > 1, applied where `A < 0`; `None` disables it.
    loss_agg_mode: how `[B, T]` terms become scalars (`aggregate_loss`).
    entropy: optional per-token entropy `[B, T]` of the current policy.
    entropy_coef: weight of the entropy bonus (subtracted from the loss).
    ref_per_token_logps: optional `[B, T]`; adds the KL loss term with `kl_estimator`
      (`kl_straight_through`: its value with the k2 gradient; see `ops.kl_divergence`).
    kl_loss_coef: weight of the KL loss term.
    kl_estimator: `fn(logp, ref_logp) -> [B, T]`, e.g. `ops.kl_k3`.
    kl_straight_through: the estimator's value with the gradient of k2.
    kl_clamp_value: when set, the per-token KL is clipped to `[-kl_clamp_value, kl_clamp_value]`.
    per_token_kl: optional precomputed per-token KL `[B, T]` (e.g. the exact full-vocabulary
      KL); used instead of `ref_per_token_logps` when given.
    is_weights: optional `[B, T]` rollout-correction weights (`ops.rollout_is_weights`),
      stop-gradient'ed, multiplying the per-token policy loss before aggregation (verl).

  Returns:
    `(loss, metrics)` with `pg_loss`, `pg_clipfrac`, `pg_clipfrac_lower`, `ppo_kl`, and
    `entropy` / `kl_loss` when those terms are present; all float32 scalars.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> old_logp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
    >>> logp = jnp.log(jnp.array([[0.75, 0.5, 0.25]]))  # ratios 1.5, 1, 0.5
    >>> advantages, mask = jnp.array([1.0]), jnp.ones((1, 3))
    >>> loss, metrics = ops.policy_loss(logp, old_logp, advantages, mask)
    >>> round(loss.item(), 4)  # -(1.2 + 1 + 0.5) / 3
    -0.9
    >>> round(metrics["pg_clipfrac"].item(), 4)
    0.3333
  """
  _check_clip_args(epsilon_low, epsilon_high, epsilon_c)
  loss_agg_mode = canonical_loss_agg_mode(loss_agg_mode)
  logp, old_logp, adv, mask = policy_inputs(per_token_logps, old_per_token_logps, advantages, mask)
  # clamped as verl does, for the ratio and for `ppo_kl` alike
  log_ratio = jnp.clip(logp - old_logp, -kl_lib.LOG_RATIO_LIMIT, kl_lib.LOG_RATIO_LIMIT)
  ratio = jnp.exp(log_ratio)
  pg1, pg2 = clipped_surrogate(ratio, adv, epsilon_low, epsilon_high)
  clipped = jnp.maximum(pg1, pg2)
  if epsilon_c is None:
    per_token = clipped
    lower_clipped = jnp.zeros_like(clipped)
  else:
    pg3 = -adv * epsilon_c
    per_token = jnp.where(adv < 0, jnp.minimum(clipped, pg3), clipped)
    lower_clipped = ((clipped > pg3) & (adv < 0)).astype(jnp.float32)

  pg_loss = aggregate_loss(weighted(per_token, is_weights), mask, loss_agg_mode)
  metrics = {
    "pg_loss": pg_loss,
    "pg_clipfrac": masked_mean((pg2 > pg1).astype(jnp.float32), mask),
    "pg_clipfrac_lower": masked_mean(lower_clipped, mask),
    "ppo_kl": masked_mean(-log_ratio, mask),
  }
  if per_token_kl is None and ref_per_token_logps is not None:
    per_token_kl = kl_lib.kl_divergence(
      logp, ref_per_token_logps, kl_estimator, kl_straight_through, kl_clamp_value
    )
  return add_regularizers(
    pg_loss, metrics, mask, loss_agg_mode, entropy, entropy_coef, per_token_kl, kl_loss_coef
  )


def add_regularizers(
  pg_loss: jax.Array,
  metrics: dict[str, jax.Array],
  mask: jax.Array,
  loss_agg_mode: str,
  entropy: jax.Array | None,
  entropy_coef: float | jax.Array,
  per_token_kl: jax.Array | None,
  kl_loss_coef: float | jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`pg_loss - entropy_coef * agg(entropy) + kl_loss_coef * agg(kl)`, any policy loss.

  `mask`, `entropy`, `per_token_kl`: `[B, T]` (either term is skipped when None); `agg` is
  `aggregate_loss` with `loss_agg_mode`. Adds `entropy` / `kl_loss` to `metrics` (in place)
  and returns `(loss, metrics)`.
  """
  loss = pg_loss
  if entropy is not None:
    chex.assert_equal_shape([entropy, mask])
    metrics["entropy"] = aggregate_loss(entropy, mask, loss_agg_mode)
    loss = loss - entropy_coef * metrics["entropy"]
  if per_token_kl is not None:
    chex.assert_equal_shape([per_token_kl, mask])
    metrics["kl_loss"] = aggregate_loss(per_token_kl, mask, loss_agg_mode)
    loss = loss + kl_loss_coef * metrics["kl_loss"]
  return loss, metrics


def value_loss(
  vpreds: jax.Array,
  old_values: jax.Array,
  returns: jax.Array,
  mask: jax.Array,
  *,
  clip_range_value: float | None,
  loss_agg_mode: str = "token-mean",
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped value loss: `0.5 * agg(max((v - R)^2, (clip(v, old - c, old + c) - R)^2))`.

  Args:
    vpreds: `[B, T]` the critic's current values.
    old_values: `[B, T]` the values at rollout time (the clip's centre).
    returns: `[B, T]` value targets.
    mask: `[B, T]` 0/1 loss mask.
    clip_range_value: `c` > 0; `None` disables the clipped term.
    loss_agg_mode: how the `[B, T]` loss becomes a scalar (`aggregate_loss`).

  Returns:
    `(loss, metrics)`: float32 scalar loss; metrics `vf_loss`, `vf_clipfrac` (the fraction
    of masked tokens where the clipped term is larger) and `vpred_mean`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> vpreds, old = jnp.array([[1.0, 0.0]]), jnp.array([[0.0, 0.0]])
    >>> returns, mask = jnp.array([[2.0, 1.0]]), jnp.ones((1, 2))
    >>> loss, metrics = ops.value_loss(vpreds, old, returns, mask, clip_range_value=0.5)
    >>> loss.item(), metrics["vf_clipfrac"].item()  # 0.5 * mean(max(1, 2.25), 1)
    (0.8125, 0.5)
  """
  if clip_range_value is not None and not clip_range_value > 0:
    raise ValueError(f"clip_range_value must be > 0 or None; got {clip_range_value!r}")
  chex.assert_rank([vpreds, old_values, returns, mask], 2)
  chex.assert_equal_shape([vpreds, old_values, returns, mask])
  v = vpreds.astype(jnp.float32)
  old = old_values.astype(jnp.float32)
  ret = returns.astype(jnp.float32)
  unclipped = jnp.square(v - ret)
  if clip_range_value is None:
    per_token, clipfrac = unclipped, jnp.zeros((), jnp.float32)
  else:
    v_clipped = jnp.clip(v, old - clip_range_value, old + clip_range_value)
    clipped = jnp.square(v_clipped - ret)
    per_token = jnp.maximum(unclipped, clipped)
    clipfrac = masked_mean((clipped > unclipped).astype(jnp.float32), mask)
  loss = 0.5 * aggregate_loss(per_token, mask, loss_agg_mode)
  return loss, {"vf_loss": loss, "vf_clipfrac": clipfrac, "vpred_mean": masked_mean(v, mask)}


def entropy_from_logits(logits: jax.Array, chunk_size: int = 0) -> jax.Array:
  """Per-token entropy `[B, T]` in float32 of `[B, T, V]` logits of any float dtype.

  Args:
    logits: `[B, T, V]` unnormalized logits, any float dtype.
    chunk_size: when > 0, the tokens are processed `chunk_size` at a time (less memory;
      `logps_and_entropy`); 0 processes all at once.

  Returns:
    float32 `[B, T]`: `-sum_v p_v log p_v` in nats.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> logits = jnp.array([[[0.0, 0.0], [10.0, -10.0]]])  # uniform, then almost certain
    >>> print(np.round(ops.entropy_from_logits(logits), 4))
    [[0.6931 0.    ]]
  """
  targets = jnp.zeros(logits.shape[:-1], jnp.int32)
  return logps_and_entropy(logits, targets, chunk_size=chunk_size)[1]


def _check_clip_args(epsilon_low: float, epsilon_high: float, epsilon_c: float | None) -> None:
  """Rejects clip ranges outside their domains (python floats only; traced values pass)."""
  if isinstance(epsilon_low, float | int) and not 0 < epsilon_low < 1:
    raise ValueError(f"epsilon_low must be in (0, 1); got {epsilon_low!r}")
  if isinstance(epsilon_high, float | int) and not epsilon_high > 0:
    raise ValueError(f"epsilon_high must be > 0; got {epsilon_high!r}")
  if epsilon_c is not None and isinstance(epsilon_c, float | int) and not epsilon_c > 1:
    raise ValueError(f"epsilon_c must be > 1 (or None to disable dual clipping); got {epsilon_c!r}")
