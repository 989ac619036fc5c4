"""DAPO's reward-side pieces (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning
System at Scale", arXiv:2503.14476), as pure functions of per-episode arrays.

- `overlong_penalty`: soft overlong punishment (DAPO eq. 13), a linear penalty in the last
  `cache_len` tokens of the length budget.
- `informative_groups`: dynamic sampling's filter, which keeps only the sample groups whose
  scores are not all equal (a group of equal scores has zero group-relative advantage).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["informative_groups", "overlong_penalty"]


def overlong_penalty(
  lengths: jax.Array, max_len: int, cache_len: int, penalty_factor: float = 1.0
) -> jax.Array:
  """`[B]` reward to add for responses of `lengths` `[B]` (DAPO eq. 13, verl's
  `overlong_buffer` with `penalty_factor`).

  `0` for `len <= max_len - cache_len`, `-penalty_factor (len - (max_len - cache_len)) /
  cache_len` inside the last `cache_len` tokens, `-penalty_factor` beyond `max_len` (the
  paper's -1; verl's formula continues linearly there, which its truncation never reaches).

  Args:
    lengths: `[B]` response lengths in tokens (any numeric dtype).
    max_len: the length budget in tokens.
    cache_len: the soft-penalty window at the end of the budget, in `(0, max_len]`
      (ValueError otherwise).
    penalty_factor: the penalty at and beyond `max_len` (a positive number).

  Returns:
    float32 `[B]`, in `[-penalty_factor, 0]`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> ops.overlong_penalty(jnp.array([10, 16, 18, 25]), max_len=20, cache_len=4).tolist()
    [-0.0, -0.0, -0.5, -1.0]
  """
  if not 0 < cache_len <= max_len:
    raise ValueError(f"cache_len must be in (0, max_len={max_len}]; got {cache_len!r}")
  excess = jnp.asarray(lengths, jnp.float32) - (max_len - cache_len)
  return -penalty_factor * jnp.clip(excess / cache_len, 0.0, 1.0)


def informative_groups(scores: jax.Array, group_ids: jax.Array) -> jax.Array:
  """`[B]` bool: whether each sample's group (same id in `group_ids` `[B]`, ids in `[0, B)`)
  has scores that are not all equal, or has a single sample (verl keeps those too).

  DAPO's dynamic sampling drops the other groups and samples more until the batch is full.

  Args:
    scores: `[B]` per-sample scores (any numeric dtype).
    group_ids: `[B]` integer group ids in `[0, B)`.

  Returns:
    bool `[B]`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> scores = jnp.array([1.0, 1.0, 0.0, 1.0, 0.5])
    >>> ops.informative_groups(scores, jnp.array([0, 0, 1, 1, 2])).tolist()
    [False, False, True, True, True]
  """
  scores = jnp.asarray(scores, jnp.float32)
  ids = jnp.asarray(group_ids, jnp.int32)
  n = scores.shape[0]
  high = jax.ops.segment_max(scores, ids, num_segments=n)
  low = jax.ops.segment_min(scores, ids, num_segments=n)
  count = jax.ops.segment_sum(jnp.ones_like(scores), ids, num_segments=n)
  return (high[ids] > low[ids]) | (count[ids] == 1)
