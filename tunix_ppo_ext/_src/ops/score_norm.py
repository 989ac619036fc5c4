"""Reward shaping before any advantage estimator (GAE included): episode scores normalized
within segments (a group, the batch, or all episodes of one start state), as RAGEN / GRL
do for multi-turn agents (a malformed turn's format penalty is added per turn afterwards,
`data.shaping`).

For a segment S with population mean mu_S and standard deviation sigma_S of its scores:

  identity:   x
  mean:       x - mu_S
  mean_std:   (x - mu_S) / (sigma_S + eps)   if sigma_S > eps, else 0
  asym_clip:  clip(mean_std(x), -1, 3)

A segment of one has sigma 0 (mean_std, asym_clip: 0; mean: 0).
Computed on `x / s` (`s` the largest finite |x| of the segment) and rescaled, so scores
of 1e20 neither overflow the variance nor lose the result. Segment sums use
`jax.ops.segment_sum`: no Python loop over groups.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tunix_ppo_ext._src.names import SCORE_NORMALIZATIONS

ASYM_CLIP = (-1.0, 3.0)


def segment_mean_std(
  x: jax.Array, segment_ids: jax.Array, num_segments: int
) -> tuple[jax.Array, jax.Array]:
  """Per-row population mean and std of its segment: `[B]` each (float32).

  `x`: `[B]` scores; `segment_ids`: `[B]` ints in `[0, num_segments)`.
  """
  x = x.astype(jnp.float32)
  ones = jnp.ones_like(x)
  count = jax.ops.segment_sum(ones, segment_ids, num_segments)
  mean = jax.ops.segment_sum(x, segment_ids, num_segments) / jnp.maximum(count, 1.0)
  centered = x - mean[segment_ids]
  var = jax.ops.segment_sum(centered**2, segment_ids, num_segments) / jnp.maximum(count, 1.0)
  return mean[segment_ids], jnp.sqrt(var)[segment_ids]


def normalize_scores(
  scores: jax.Array,
  segment_ids: jax.Array,
  num_segments: int,
  method: str = "identity",
  eps: float = 1e-6,
) -> jax.Array:
  """Episode scores `[B]` normalized within their segments by `method` (module
  docstring). Returns float32 `[B]`.

  Args:
    scores: `[B]` episode scores (any float dtype).
    segment_ids: `[B]` integer segment ids in `[0, num_segments)`.
    num_segments: the number of segments (static).
    method: `"identity"`, `"mean"`, `"mean_std"` or `"asym_clip"` (ValueError otherwise).
    eps: added to the std; a segment whose std is at most `eps` normalizes to 0.

  Returns:
    float32 `[B]`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> scores, ids = jnp.array([1.0, 5.0, 4.0, 4.0]), jnp.array([0, 0, 1, 1])
    >>> print(np.round(ops.normalize_scores(scores, ids, 2, "mean"), 4))
    [-2.  2.  0.  0.]
    >>> print(np.round(ops.normalize_scores(scores, ids, 2, "mean_std"), 4))
    [-1.  1.  0.  0.]
  """
  if method not in SCORE_NORMALIZATIONS:
    raise ValueError(f"normalization method {method!r} unknown (valid: {SCORE_NORMALIZATIONS})")
  x = scores.astype(jnp.float32)
  if method == "identity":
    return x
  finite_abs = jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0)
  scale = jax.ops.segment_max(finite_abs, segment_ids, num_segments)[segment_ids]
  scale = jnp.where(scale > 0, scale, 1.0)  # per segment: one group's 1e20 spares the others
  mean, std = segment_mean_std(x / scale, segment_ids, num_segments)
  centered = x / scale - mean
  if method == "mean":
    return centered * scale
  spread = std * scale
  z = jnp.where(spread > eps, centered / (std + eps / scale), 0.0)
  if method == "asym_clip":
    z = jnp.clip(z, *ASYM_CLIP)
  return z


def top_spread_groups(
  scores: jax.Array, group_ids: jax.Array, num_groups: int, keep: int, reverse: bool = False
) -> tuple[jax.Array, jax.Array]:
  """Rollout filtering (GRL's `rollout_filter_ratio`): the `keep` groups with the largest
  in-group score std (`reverse`: the smallest), so the batch trains on informative groups.

  `scores`: `[B]`; `group_ids`: `[B]` ints in `[0, num_groups)`, every id used. Returns
  `(kept [B] bool, group_std [num_groups])` (population std; ties keep the lower id).

  Args:
    scores: `[B]` episode scores.
    group_ids: `[B]` integer group ids in `[0, num_groups)`, every id used.
    num_groups: the number of groups (static).
    keep: how many groups to keep, in `[0, num_groups]` (static).
    reverse: keep the groups with the smallest std instead.

  Returns:
    `(kept, group_std)`: bool `[B]`, whether a sample's group is kept; float32
    `[num_groups]`, each group's population std.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> scores = jnp.array([0.0, 1.0, 1.0, 1.0, 0.0, 4.0])
    >>> kept, std = ops.top_spread_groups(scores, jnp.array([0, 0, 1, 1, 2, 2]), 3, keep=2)
    >>> kept.tolist(), std.tolist()
    ([True, True, False, False, True, True], [0.5, 0.0, 2.0])
  """
  _, std = segment_mean_std(scores, group_ids, num_groups)
  group_std = jax.ops.segment_max(std, group_ids, num_groups)  # equal within a group
  _, chosen = jax.lax.top_k(-group_std if reverse else group_std, keep)
  kept_groups = jnp.zeros(num_groups, bool).at[chosen].set(True)
  return kept_groups[group_ids], group_std
