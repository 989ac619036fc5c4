"""Reward policies applied to a batch before any estimator: non-finite rewards.

`NonFiniteRewards` finds episodes whose rewards are NaN or inf, and either rejects the
batch naming them (`error`) or drops them (`drop`: loss mask and rewards zeroed, counted
under `DROPPED_METRIC`), as `PpoExtConfig.nonfinite_rewards` says.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tunix_ppo_ext._src.names import NONFINITE_REWARD_MODES

DROPPED_METRIC = "learner/dropped_episodes"


def nonfinite_rows(token_rewards: Any, episode_returns: Any | None = None) -> np.ndarray:
  """Rows (episodes) with a NaN or inf among their `[B, T]` token rewards or `[B]` returns,
  or whose rewards overflow float32 when summed (3e38 a turn: returns and advantages,
  computed in float32, would be NaN)."""
  rewards = np.asarray(token_rewards, np.float64)
  bad = ~np.isfinite(rewards).all(axis=-1)
  with np.errstate(over="ignore", invalid="ignore"):
    bad |= ~np.isfinite(np.abs(rewards).sum(axis=-1).astype(np.float32))
    if episode_returns is not None:
      bad |= ~np.isfinite(np.asarray(episode_returns, np.float64).astype(np.float32))
  return np.flatnonzero(bad)


def drop_rows(batch: Any, rows: Sequence[int]) -> Any:
  """A copy of a `TrajectoryBatch` whose `rows` are out of training.

  Their loss mask and token rewards become 0 (no gradient, finite advantages) and their
  episode return 0; the rows stay (fixed batch shape). A group estimator still counts a
  dropped row as a zero-score member of its group.
  """
  rows = np.asarray(rows, np.int64)
  changes: dict[str, Any] = {}
  for name in ("loss_mask", "token_rewards", "episode_returns"):
    value = getattr(batch, name)
    if value is not None:
      value = np.array(value, copy=True)
      value[rows] = 0
      changes[name] = value
  if getattr(batch, "sampler_logp_mask", None) is not None:
    changes["sampler_logp_mask"] = np.array(batch.sampler_logp_mask, copy=True)
    changes["sampler_logp_mask"][rows] = 0
  return dataclasses.replace(batch, **changes)


def describe_rows(batch: Any, rows: Sequence[int], limit: int = 3) -> str:
  """`row 2 (reward nan, completion 'ab')`, ... for error messages (first `limit` rows)."""
  parts = []
  for row in list(rows)[:limit]:
    rewards = np.asarray(batch.token_rewards, np.float64)[row]
    value = next((v for v in rewards if not np.isfinite(v)), None)
    if value is None and batch.episode_returns is not None:
      value = float(np.asarray(batch.episode_returns)[row])
    text = f", completion {batch.texts[row]!r}" if batch.texts is not None else ""
    parts.append(f"row {row} (reward {value}{text})")
  more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
  return ", ".join(parts) + more


def one_per_completion(reward_fn: Callable[..., Any], scores: Any, count: int) -> np.ndarray:
  """`scores` as float64 `[count]`; ValueError naming `reward_fn` and what it returned
  unless it is one number per completion (tunix's reward manager broadcast a scalar
  silently and failed on a 2-D array naming no function)."""
  name = getattr(reward_fn, "__name__", repr(reward_fn))
  shape = np.shape(scores) if not isinstance(scores, (str, bytes)) else ()
  try:
    values = np.asarray(scores, np.float64)
  except (TypeError, ValueError):
    values = None
  if values is not None and shape == (count,):
    return values
  if isinstance(scores, (list, tuple)):
    kind = f"a {type(scores).__name__} of " + (
      f"{len(scores)}" if len(shape) <= 1 else f"shape {shape}"
    )
    if values is None and len(scores) == count:
      kind += f" that is not numbers ({scores[0]!r}, ...)"
  elif hasattr(scores, "shape"):
    kind = f"an array of shape {shape}"
  else:
    kind = f"a {type(scores).__name__} ({str(scores)[:40]})"
  raise ValueError(
    f"reward function {name!r} returned {kind}; it must return one number per completion "
    f"({count} here), e.g. a list of floats"
  )


class NonFiniteRewards:
  """Applies `PpoExtConfig.nonfinite_rewards` (`error` or `drop`) to a batch's rewards.

  For reward functions it also wraps each one (`check`) to catch NaN, which tunix's
  reward manager would otherwise sum away as 0 (`np.nansum`).
  """

  def __init__(self, mode: str):
    if mode not in NONFINITE_REWARD_MODES:
      raise ValueError(f"nonfinite_rewards={mode!r}: must be one of {NONFINITE_REWARD_MODES}")
    self.mode = mode
    self.reported: dict[int, str] = {}  # row -> what a reward function returned

  def check(self, reward_fn: Callable[..., Any]) -> Callable[..., Any]:
    """`reward_fn` (same name and signature) recording rows where it returns NaN or inf."""

    @functools.wraps(reward_fn)
    def checked(prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> Any:
      scores = reward_fn(prompts=prompts, completions=completions, **kwargs)
      values = one_per_completion(reward_fn, scores, len(completions))
      for row in np.flatnonzero(~np.isfinite(values)):
        self.reported.setdefault(
          int(row), f"reward function {reward_fn.__name__!r} returned {float(values[row])}"
        )
      return scores

    return checked

  def mark_reported(self, scores: np.ndarray, prompts: Sequence[str], texts: Sequence[str]):
    """`scores [B]` with reported rows set to NaN (drop), or ValueError naming them (error)."""
    reported, self.reported = dict(self.reported), {}
    if not reported:
      return scores
    if self.mode == "error":
      row = min(reported)
      raise ValueError(
        f"{reported[row]} for episode row {row} (prompt {str(prompts[row])!r}, completion "
        f"{texts[row]!r}); {len(reported)} row(s) {sorted(reported)} are not finite. "
        "Fix the reward function, or set PpoExtConfig.nonfinite_rewards='drop' "
        "(ppo.nonfinite_rewards=drop) to drop such episodes."
      )
    scores = np.array(scores, np.float32, copy=True)
    scores[sorted(reported)] = np.nan
    return scores

  def apply(self, batch: Any) -> tuple[Any, int]:
    """`(batch, dropped episodes)`: unchanged if all finite; else raises or drops rows."""
    rows = nonfinite_rows(batch.token_rewards, batch.episode_returns)
    if not rows.size:
      return batch, 0
    if self.mode == "error":
      raise ValueError(
        f"non-finite reward (or a return past float32's range) in {rows.size} episode(s): "
        f"{describe_rows(batch, rows)}. "
        "Fix the reward source, or set PpoExtConfig.nonfinite_rewards='drop' "
        "(ppo.nonfinite_rewards=drop) to drop such episodes."
      )
    if rows.size == np.shape(batch.token_rewards)[0]:
      warnings.warn(
        f"every episode of the batch ({rows.size}) has a non-finite reward (or return) and "
        "was dropped "
        f"(ppo.nonfinite_rewards=drop): the batch trains nothing; {describe_rows(batch, rows)}. "
        "Fix the reward source.",
        RuntimeWarning,
        stacklevel=2,
      )
    return drop_rows(batch, rows), int(rows.size)
