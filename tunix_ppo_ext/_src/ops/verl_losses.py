"""verl's other policy losses: GSPO, SAPO, GMPO (`geo_mean`), CISPO, Clip-Cov, KL-Cov, GPG.

Each is a pure function of per-token arrays `[B, T]` (log-probs of the current and the
old policy, advantages `[B, T]` or `[B]`, a 0/1 loss mask) returning `(pg_loss, metrics)`,
computed in float32 whatever the input dtype. Conventions follow verl's `core_algos`
(`compute_policy_loss_<name>`) so results transfer: which aggregation a loss forces, where
the log-ratio is clamped and what `pg_clipfrac`, `pg_clipfrac_lower` and `ppo_kl` mean for
it; each docstring says where this module deviates. Every function returns the four keys
`pg_loss`, `pg_clipfrac`, `pg_clipfrac_lower`, `ppo_kl` (0 where a loss has no clip), so a
dashboard keeps its curves when the loss changes.

`is_weights` (optional `[B, T]`, stop-gradient'ed) are rollout-correction importance weights
(`ops.rollout_is_weights`); they multiply the per-token loss before aggregation, as in verl.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tunix_ppo_ext._src.ops.kl import LOG_RATIO_LIMIT
from tunix_ppo_ext._src.ops.masked import masked_mean, masked_sum
from tunix_ppo_ext._src.ops.ppo_losses import (
  aggregate_loss,
  canonical_loss_agg_mode,
  clipped_surrogate,
  policy_inputs,
  weighted,
)

__all__ = [
  "GSPO_LOG_RATIO_MAX",
  "cispo_loss",
  "clip_cov_loss",
  "geo_mean_loss",
  "gpg_loss",
  "gspo_loss",
  "kl_cov_loss",
  "sapo_loss",
]

GSPO_LOG_RATIO_MAX = 10.0  # verl clamps GSPO's sequence log-ratio from above at 10
Metrics = dict[str, jax.Array]


def _metrics(pg_loss, clipfrac, clipfrac_lower, ppo_kl) -> Metrics:
  zero = jnp.zeros((), jnp.float32)
  return {
    "pg_loss": pg_loss,
    "pg_clipfrac": zero if clipfrac is None else clipfrac,
    "pg_clipfrac_lower": zero if clipfrac_lower is None else clipfrac_lower,
    "ppo_kl": ppo_kl,
  }


def gspo_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  epsilon_low: float = 0.2,
  epsilon_high: float = 0.2,
  is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """GSPO, Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071).

  Sequence ratio `s_i = exp(mean_t(logp - old_logp))` over the row's mask, applied per token
  as `s_it = sg(s_i) * pi / sg(pi)` (value `s_i`, gradient of GSPO-token), in log space
  clamped from above at 10 (verl). `pg = max(-A s_it, -A clip(s_it, 1 - eps_low,
  1 + eps_high))`, always aggregated `seq-mean-token-mean` (verl forces it).
  `pg_clipfrac`: share of tokens where the clipped term is larger; `ppo_kl`: masked mean of
  `old_logp - logp`; `pg_clipfrac_lower` 0. An empty row has `s_i = 1` and no weight.

  Args:
    logp: `[B, T]` log pi(a_t) of the policy being trained, any float dtype.
    old_logp: `[B, T]` log-probs of the policy that sampled the rollout.
    advantages: `[B, T]` per token or `[B]` per sequence.
    mask: `[B, T]` 0/1 loss mask (1 on the agent's own tokens).
    epsilon_low: lower clip range: the ratio is clipped at `1 - epsilon_low`.
    epsilon_high: upper clip range: the ratio is clipped at `1 + epsilon_high`.
    is_weights: optional `[B, T]` rollout-correction weights (module docstring).

  Returns:
    `(pg_loss, metrics)`: float32 scalar loss; metrics `pg_loss`, `pg_clipfrac`,
    `pg_clipfrac_lower`, `ppo_kl`, float32 scalars.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> old_logp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
    >>> logp = jnp.log(jnp.array([[0.75, 0.5, 0.25]]))
    >>> advantages, mask = jnp.array([1.0]), jnp.ones((1, 3))
    >>> loss, metrics = ops.gspo_loss(logp, old_logp, advantages, mask)
    >>> round(loss.item(), 4), round(metrics["pg_clipfrac"].item(), 4)
    (-0.9086, 0.0)
  """
  logp, old_logp, adv, mask = policy_inputs(logp, old_logp, advantages, mask)
  log_ratio = logp - old_logp
  seq_log_ratio = masked_mean(log_ratio, mask, axis=-1)[:, None]
  log_s = logp - jax.lax.stop_gradient(logp) + jax.lax.stop_gradient(seq_log_ratio)
  ratio = jnp.exp(jnp.minimum(log_s, GSPO_LOG_RATIO_MAX))
  pg1, pg2 = clipped_surrogate(ratio, adv, epsilon_low, epsilon_high)
  per_token = weighted(jnp.maximum(pg1, pg2), is_weights)
  pg_loss = aggregate_loss(per_token, mask, "seq-mean-token-mean")
  clipfrac = masked_mean((pg2 > pg1).astype(jnp.float32), mask)
  return pg_loss, _metrics(pg_loss, clipfrac, None, masked_mean(-log_ratio, mask))


def sapo_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  tau_pos: float = 1.0,
  tau_neg: float = 1.05,
  is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv:2511.20347).

  A soft gate instead of the hard clip: `r = exp(clip(logp - old_logp, -20, 20))`,
  `tau = tau_pos if A > 0 else tau_neg`, `f(r) = sigmoid(tau (r - 1)) * 4 / tau` (slope 1
  at `r = 1`), `pg = -f(r) A`, always aggregated `seq-mean-token-mean` (verl forces it).
  No clip: `pg_clipfrac` and `pg_clipfrac_lower` are 0; `ppo_kl` as for PPO (the masked mean
  of the clamped `old_logp - logp`, as verl).

  Args:
    logp: `[B, T]` log pi(a_t) of the policy being trained, any float dtype.
    old_logp: `[B, T]` log-probs of the policy that sampled the rollout.
    advantages: `[B, T]` per token or `[B]` per sequence.
    mask: `[B, T]` 0/1 loss mask (1 on the agent's own tokens).
    tau_pos: the gate's temperature where `A > 0`.
    tau_neg: the gate's temperature where `A <= 0`.
    is_weights: optional `[B, T]` rollout-correction weights (module docstring).

  Returns:
    `(pg_loss, metrics)`: float32 scalar loss; metrics `pg_loss`, `pg_clipfrac`,
    `pg_clipfrac_lower`, `ppo_kl`, float32 scalars.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> old_logp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
    >>> logp = jnp.log(jnp.array([[0.75, 0.5, 0.25]]))
    >>> advantages, mask = jnp.array([1.0]), jnp.ones((1, 3))
    >>> loss, metrics = ops.sapo_loss(logp, old_logp, advantages, mask)
    >>> round(loss.item(), 4), round(metrics["pg_clipfrac"].item(), 4)
    (-2.0, 0.0)
  """
  logp, old_logp, adv, mask = policy_inputs(logp, old_logp, advantages, mask)
  log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # ppo_kl's too
  ratio = jnp.exp(log_ratio)
  tau = jnp.where(adv > 0, jnp.float32(tau_pos), jnp.float32(tau_neg))
  gate = jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
  per_token = weighted(-gate * adv, is_weights)
  pg_loss = aggregate_loss(per_token, mask, "seq-mean-token-mean")
  return pg_loss, _metrics(pg_loss, None, None, masked_mean(-log_ratio, mask))


def geo_mean_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  epsilon_low: float = 0.2,
  epsilon_high: float = 0.2,
  is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673).

  Token log-ratios `l = logp - old_logp` are clipped in log space on the side the advantage
  makes pessimistic: `l' = sgn(A) min(sgn(A) l, sgn(A) clip(l, -eps_low, eps_high))`; the
  sequence ratio is their geometric mean `R_i = exp(sum_t l' / (n_i + 1e-8))`, the sequence
  advantage `A_i = sum_t A / (n_i + 1e-8)`, `pg_i = -A_i R_i` (times the geometric mean of
  `is_weights` over the row), and the loss the mean of `pg_i` over rows (verl ignores
  `loss_agg_mode` here). Deviations from verl: the mean is over non-empty rows (verl's
  `torch.mean` counts empty rows as zeros), and `sum_t l' / n_i` is clamped to [-20, 20]
  before `exp` (verl leaves it unclamped; only log-ratios beyond 20 differ).
  `pg_clipfrac` / `pg_clipfrac_lower`: share of tokens where the clamp changed `l` and
  `A > 0` / `A < 0`; `ppo_kl` as for PPO.

  Args:
    logp: `[B, T]` log pi(a_t) of the policy being trained, any float dtype.
    old_logp: `[B, T]` log-probs of the policy that sampled the rollout.
    advantages: `[B, T]` per token or `[B]` per sequence.
    mask: `[B, T]` 0/1 loss mask (1 on the agent's own tokens).
    epsilon_low: lower clip range: the ratio is clipped at `1 - epsilon_low`.
    epsilon_high: upper clip range: the ratio is clipped at `1 + epsilon_high`.
    is_weights: optional `[B, T]` rollout-correction weights (module docstring).

  Returns:
    `(pg_loss, metrics)`: float32 scalar loss; metrics `pg_loss`, `pg_clipfrac`,
    `pg_clipfrac_lower`, `ppo_kl`, float32 scalars.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> old_logp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
    >>> logp = jnp.log(jnp.array([[0.75, 0.5, 0.25]]))
    >>> advantages, mask = jnp.array([1.0]), jnp.ones((1, 3))
    >>> loss, metrics = ops.geo_mean_loss(logp, old_logp, advantages, mask)
    >>> round(loss.item(), 4), round(metrics["pg_clipfrac"].item(), 4)
    (-0.8484, 0.6667)
  """
  logp, old_logp, adv, mask = policy_inputs(logp, old_logp, advantages, mask)
  log_ratio = logp - old_logp
  sign = jnp.sign(adv)
  clamped = jnp.clip(log_ratio, -epsilon_low, epsilon_high)
  pessimistic = sign * jnp.minimum(sign * log_ratio, sign * clamped)
  count = jnp.sum(mask, axis=-1)
  seq_log_ratio = masked_sum(pessimistic, mask, axis=-1) / (count + 1e-8)
  ratio = jnp.exp(jnp.clip(seq_log_ratio, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
  seq_adv = masked_sum(adv, mask, axis=-1) / (count + 1e-8)
  per_seq = -seq_adv * ratio
  if is_weights is not None:
    log_w = jnp.log(jax.lax.stop_gradient(is_weights.astype(jnp.float32)) + 1e-10)
    per_seq = per_seq * jnp.exp(masked_sum(log_w, mask, axis=-1) / (count + 1e-8))
  pg_loss = masked_mean(per_seq, (count > 0).astype(jnp.float32))
  changed = (log_ratio != clamped).astype(jnp.float32)
  upper = masked_mean(changed * (adv > 0), mask)
  lower = masked_mean(changed * (adv < 0), mask)
  return pg_loss, _metrics(pg_loss, upper, lower, masked_mean(-log_ratio, mask))


def cispo_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  epsilon_low: float = 0.2,
  epsilon_high: float = 0.2,
  loss_agg_mode: str = "token-mean",
  is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """CISPO, Clipped IS-weight Policy Optimization (MiniMax-M1, MiniMax 2025, arXiv:2506.13585).

  `r = exp(clip(logp - old_logp, -20, 20))`, `pg = -sg(clip(r, 1 - eps_low, 1 + eps_high))
  A logp`: every token keeps a gradient (REINFORCE through `logp`), the clipped ratio only
  weights it. Aggregated with `loss_agg_mode`. `pg_clipfrac`: share of tokens whose ratio
  the clip changed; `pg_clipfrac_lower` 0; `ppo_kl` as for PPO (of the clamped log-ratio,
  as verl).

  Args:
    logp: `[B, T]` log pi(a_t) of the policy being trained, any float dtype.
    old_logp: `[B, T]` log-probs of the policy that sampled the rollout.
    advantages: `[B, T]` per token or `[B]` per sequence.
    mask: `[B, T]` 0/1 loss mask (1 on the agent's own tokens).
    epsilon_low: lower clip range: the ratio is clipped at `1 - epsilon_low`.
    epsilon_high: upper clip range: the ratio is clipped at `1 + epsilon_high`.
    loss_agg_mode: how the `[B, T]` loss becomes a scalar (`ops.aggregate_loss`).
    is_weights: optional `[B, T]` rollout-correction weights (module docstring).

  Returns:
    `(pg_loss, metrics)`: float32 scalar loss; metrics `pg_loss`, `pg_clipfrac`,
    `pg_clipfrac_lower`, `ppo_kl`, float32 scalars.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> old_logp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
    >>> logp = jnp.log(jnp.array([[0.75, 0.5, 0.25]]))
    >>> advantages, mask = jnp.array([1.0]), jnp.ones((1, 3))
    >>> loss, metrics = ops.cispo_loss(logp, old_logp, advantages, mask)
    >>> round(loss.item(), 4), round(metrics["pg_clipfrac"].item(), 4)
    (0.7158, 0.6667)
  """
  logp, old_logp, adv, mask = policy_inputs(logp, old_logp, advantages, mask)
  log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # ppo_kl's too
  ratio = jnp.exp(log_ratio)
  clipped = jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
  per_token = weighted(-jax.lax.stop_gradient(clipped) * adv * logp, is_weights)
  pg_loss = aggregate_loss(per_token, mask, canonical_loss_agg_mode(loss_agg_mode))
  clipfrac = masked_mean((ratio != clipped).astype(jnp.float32), mask)
  return pg_loss, _metrics(pg_loss, clipfrac, None, masked_mean(-log_ratio, mask))


def gpg_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  loss_agg_mode: str = "token-mean",
  is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """GPG, Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546): plain REINFORCE.

  `pg = -A logp`, aggregated with `loss_agg_mode`; no ratio, no clip. verl reports no
  metric for it; here `pg_clipfrac` and `pg_clipfrac_lower` are 0 and `ppo_kl` is the
  masked mean of `old_logp - logp` as for every other loss.

  Args:
    logp: `[B, T]` log pi(a_t) of the policy being trained, any float dtype.
    old_logp: `[B, T]` log-probs of the policy that sampled the rollout.
    advantages: `[B, T]` per token or `[B]` per sequence.
    mask: `[B, T]` 0/1 loss mask (1 on the agent's own tokens).
    loss_agg_mode: how the `[B, T]` loss becomes a scalar (`ops.aggregate_loss`).
    is_weights: optional `[B, T]` rollout-correction weights (module docstring).

  Returns:
    `(pg_loss, metrics)`: float32 scalar loss; metrics `pg_loss`, `pg_clipfrac`,
    `pg_clipfrac_lower`, `ppo_kl`, float32 scalars.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> old_logp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
    >>> logp = jnp.log(jnp.array([[0.75, 0.5, 0.25]]))
    >>> advantages, mask = jnp.array([1.0]), jnp.ones((1, 3))
    >>> loss, metrics = ops.gpg_loss(logp, old_logp, advantages, mask)
    >>> round(loss.item(), 4), round(metrics["pg_clipfrac"].item(), 4)
    (0.789, 0.0)
  """
  logp, old_logp, adv, mask = policy_inputs(logp, old_logp, advantages, mask)
  per_token = weighted(-adv * logp, is_weights)
  pg_loss = aggregate_loss(per_token, mask, canonical_loss_agg_mode(loss_agg_mode))
  return pg_loss, _metrics(pg_loss, None, None, masked_mean(old_logp - logp, mask))


def _covariance(adv: jax.Array, logp: jax.Array, mask: jax.Array) -> jax.Array:
  """Per-token `(A - mean_m A) (logp - mean_m logp)`, means over the whole mask, no gradient."""
  logp = jax.lax.stop_gradient(logp)
  return (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))


def _rank(scores: jax.Array) -> jax.Array:
  """Rank of every entry of `scores` in ascending order over the flattened array (0 first)."""
  flat = scores.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  return jnp.zeros_like(order).at[order].set(jnp.arange(flat.size)).reshape(scores.shape)


def clip_cov_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  key: jax.Array,
  *,
  epsilon_low: float = 0.2,
  epsilon_high: float = 0.2,
  clip_cov_ratio: float = 0.0002,
  clip_cov_lb: float = 1.0,
  clip_cov_ub: float = 5.0,
  loss_agg_mode: str = "token-mean",
  is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs",
  arXiv:2505.22617): detach the gradient of a few high-covariance tokens.

  PPO's clipped surrogate `max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`; the tokens the
  clip does not already bind whose centred covariance `(A - mean A)(logp - mean logp)`
  (means over the batch mask) lies strictly in `(clip_cov_lb, clip_cov_ub)` are candidates,
  and `k = max(floor(clip_cov_ratio * n_tokens), 1)` of them, drawn uniformly without
  replacement with `key` (verl: `torch.randperm`), have their loss (and gradient) zeroed.
  Aggregated with `loss_agg_mode`. `pg_clipfrac`: share of tokens zeroed (verl's meaning);
  `ppo_kl` as for PPO. Deviation: `r` is computed from the log-ratio clamped to [-20, 20]
  (verl leaves it unclamped, which overflows beyond 88).

  Args:
    logp: `[B, T]` log pi(a_t) of the policy being trained, any float dtype.
    old_logp: `[B, T]` log-probs of the policy that sampled the rollout.
    advantages: `[B, T]` per token or `[B]` per sequence.
    mask: `[B, T]` 0/1 loss mask (1 on the agent's own tokens).
    key: a JAX PRNG key, draws the detached tokens among the candidates.
    epsilon_low: lower clip range: the ratio is clipped at `1 - epsilon_low`.
    epsilon_high: upper clip range: the ratio is clipped at `1 + epsilon_high`.
    loss_agg_mode: how the `[B, T]` loss becomes a scalar (`ops.aggregate_loss`).
    clip_cov_ratio: the share of all masked tokens to detach (at least one token).
    clip_cov_lb: candidates' covariance lower bound (exclusive).
    clip_cov_ub: candidates' covariance upper bound (exclusive).
    is_weights: optional `[B, T]` rollout-correction weights (module docstring).

  Returns:
    `(pg_loss, metrics)`: float32 scalar loss; metrics `pg_loss`, `pg_clipfrac`,
    `pg_clipfrac_lower`, `ppo_kl`, float32 scalars.

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> old_logp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
    >>> logp = jnp.log(jnp.array([[0.75, 0.5, 0.25]]))
    >>> advantages, mask = jnp.array([1.0]), jnp.ones((1, 3))
    >>> loss, metrics = ops.clip_cov_loss(
    ...   logp, old_logp, advantages, mask, jax.random.key(0), clip_cov_lb=-1.0
    ... )
    >>> round(loss.item(), 4), round(metrics["pg_clipfrac"].item(), 4)
    (-0.7333, 0.3333)
  """
  logp, old_logp, adv, mask = policy_inputs(logp, old_logp, advantages, mask)
  log_ratio = logp - old_logp
  ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
  pg1, pg2 = clipped_surrogate(ratio, adv, epsilon_low, epsilon_high)
  valid = mask > 0
  cov = _covariance(adv, logp, mask)
  candidate = valid & ~(pg2 > pg1) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
  draw = jnp.where(candidate, jax.random.uniform(key, cov.shape), 2.0)
  k = jnp.maximum(jnp.floor(clip_cov_ratio * jnp.sum(mask)), 1.0)
  chosen = candidate & (_rank(draw) < k)
  per_token = weighted(jnp.maximum(pg1, pg2) * (1.0 - chosen), is_weights)
  pg_loss = aggregate_loss(per_token, mask, canonical_loss_agg_mode(loss_agg_mode))
  clipfrac = masked_mean(chosen.astype(jnp.float32), mask)
  return pg_loss, _metrics(pg_loss, clipfrac, None, masked_mean(-log_ratio, mask))


def kl_cov_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  kl_cov_ratio: float = 0.0002,
  ppo_kl_coef: float = 0.1,
  loss_agg_mode: str = "token-mean",
  is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """KL-Cov (Cui et al. 2025, arXiv:2505.22617): a KL penalty on the highest-covariance tokens.

  `r = exp(clip(logp - old_logp, -20, 20))`, `pg = -A r` (no clip); on the
  `k = max(floor(kl_cov_ratio * n_tokens), 1)` tokens of largest centred covariance
  `(A - mean A)(logp - mean logp)` (means over the batch mask) `pg = -A r + ppo_kl_coef
  |logp - old_logp|`. Aggregated with `loss_agg_mode`. `ppo_kl` is the masked mean of
  `|logp - old_logp|` (verl's meaning for this loss); no clip, so `pg_clipfrac` and
  `pg_clipfrac_lower` are 0. Deviation: the ratio's log is clamped to [-20, 20] (verl does
  not clamp). Ties in the covariance go to the earlier token (row-major).

  Args:
    logp: `[B, T]` log pi(a_t) of the policy being trained, any float dtype.
    old_logp: `[B, T]` log-probs of the policy that sampled the rollout.
    advantages: `[B, T]` per token or `[B]` per sequence.
    mask: `[B, T]` 0/1 loss mask (1 on the agent's own tokens).
    loss_agg_mode: how the `[B, T]` loss becomes a scalar (`ops.aggregate_loss`).
    kl_cov_ratio: the share of all masked tokens that get the KL penalty (at least one).
    ppo_kl_coef: the penalty's weight on `|logp - old_logp|`.
    is_weights: optional `[B, T]` rollout-correction weights (module docstring).

  Returns:
    `(pg_loss, metrics)`: float32 scalar loss; metrics `pg_loss`, `pg_clipfrac`,
    `pg_clipfrac_lower`, `ppo_kl`, float32 scalars.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> old_logp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
    >>> logp = jnp.log(jnp.array([[0.75, 0.5, 0.25]]))
    >>> advantages, mask = jnp.array([1.0]), jnp.ones((1, 3))
    >>> loss, metrics = ops.kl_cov_loss(logp, old_logp, advantages, mask)
    >>> round(loss.item(), 4), round(metrics["pg_clipfrac"].item(), 4)
    (-0.9865, 0.0)
  """
  logp, old_logp, adv, mask = policy_inputs(logp, old_logp, advantages, mask)
  log_ratio = logp - old_logp
  ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
  valid = mask > 0
  cov = _covariance(adv, logp, mask)
  k = jnp.maximum(jnp.floor(kl_cov_ratio * jnp.sum(mask)), 1.0)
  chosen = valid & (_rank(jnp.where(valid, -cov, jnp.inf)) < k)
  per_token = -adv * ratio + jnp.where(chosen, ppo_kl_coef * jnp.abs(log_ratio), 0.0)
  per_token = weighted(per_token, is_weights)
  pg_loss = aggregate_loss(per_token, mask, canonical_loss_agg_mode(loss_agg_mode))
  return pg_loss, _metrics(pg_loss, None, None, masked_mean(jnp.abs(log_ratio), mask))
