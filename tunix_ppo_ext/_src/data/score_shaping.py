"""Score normalization applied to a rollout's trajectories before any estimator (GAE
included), as GRL / RAGEN do for multi-turn agents (`ops.normalize_scores` holds the math).

An episode's score is the sum of its token rewards. It is normalized within its segment:
`group` (the samples of one prompt, `group_ids`), `batch` (all episodes) or `state` (all
episodes with the same prompt tokens, i.e. the same start state, across groups). The
difference `normalized - score` is added to the episode's last agent token, so every turn
reward stays where it was and the episode's total becomes the normalized score.

The format penalty comes after the normalization (as RAGEN / GRL add it to the normalized
score): each malformed turn's reward token gets `penalty`, so a group-wide penalty is not
normalized away and the turn that was malformed carries it.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from tunix_ppo_ext._src.checks import whole_share
from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.names import GROUPINGS
from tunix_ppo_ext._src.ops.score_norm import normalize_scores, top_spread_groups


def segment_ids(batch: TrajectoryBatch, grouping: str) -> np.ndarray:
  """`[B]` segment index of each episode for `grouping` (see the module docstring)."""
  size = batch.token_rewards.shape[0]
  if grouping == "batch":
    return np.zeros(size, np.int32)
  if grouping == "state":
    _, inverse = np.unique(np.asarray(batch.prompt_ids), axis=0, return_inverse=True)
    return inverse.reshape(-1).astype(np.int32)
  if grouping == "group":
    if batch.group_ids is None:
      return np.arange(size, dtype=np.int32)  # no groups: each episode alone
    _, inverse = np.unique(np.asarray(batch.group_ids), return_inverse=True)
    return inverse.reshape(-1).astype(np.int32)
  raise ValueError(f"score grouping {grouping!r} unknown (valid: {GROUPINGS})")


def normalize_batch_scores(
  batch: TrajectoryBatch, grouping: str, method: str, eps: float = 1e-6
) -> TrajectoryBatch:
  """`batch` with each episode's total reward replaced by its normalized score (the
  change sits on the last agent token); `identity` returns `batch` unchanged."""
  if method == "identity":
    return batch
  scores = np.asarray(batch.token_rewards, np.float32).sum(-1)
  ids = segment_ids(batch, grouping)
  normalized = normalize_scores(jnp.asarray(scores), jnp.asarray(ids), len(scores), method, eps)
  return add_to_episode_rewards(batch, np.asarray(normalized) - scores)


def add_to_episode_rewards(batch: TrajectoryBatch, delta: np.ndarray) -> TrajectoryBatch:
  """`batch` with `delta` `[B]` added to each episode's reward, on its last agent token
  (every turn reward stays where it was); episodes without agent tokens are unchanged."""
  rewards = np.asarray(batch.token_rewards, np.float32)
  loss = np.asarray(batch.loss_mask) > 0
  width = loss.shape[1]
  last = width - 1 - np.argmax(loss[:, ::-1], axis=1)  # last agent token (0 if none)
  shaped = rewards.copy()
  rows = np.arange(len(rewards))
  shaped[rows, last] += np.where(loss.any(1), np.asarray(delta, np.float32), 0.0)
  return dataclasses.replace(batch, token_rewards=shaped)


def mask_episodes(batch: TrajectoryBatch, kept: np.ndarray) -> TrajectoryBatch:
  """`batch` with the loss mask (and sampler log-prob mask) of episodes not `kept` `[B]`
  zeroed: neither actor nor critic trains on them, while the batch keeps its shape."""
  kept = np.asarray(kept, bool)
  changes = {"loss_mask": np.where(kept[:, None], np.asarray(batch.loss_mask), 0)}
  if getattr(batch, "sampler_logp_mask", None) is not None:  # stays within the loss mask
    changes["sampler_logp_mask"] = np.where(kept[:, None], batch.sampler_logp_mask, 0)
  return dataclasses.replace(batch, **changes)


def filter_groups(
  batch: TrajectoryBatch, keep_ratio: float, reverse: bool = False
) -> tuple[TrajectoryBatch, dict[str, float]]:
  """Keeps `keep_ratio` of the batch's groups by in-group score spread (`top_spread_groups`):
  the others' loss masks are zeroed (`mask_episodes`). Returns the batch and `{kept_frac,
  in_group_std, kept_in_group_std}` (means over groups)."""
  ids = segment_ids(batch, "group")
  num_groups = int(ids.max()) + 1 if len(ids) else 0
  keep = whole_share(keep_ratio, num_groups)
  if keep is None or keep < 1:
    raise ValueError(
      f"rollout filter keep_ratio={keep_ratio} of {num_groups} groups is "
      f"{keep_ratio * num_groups:g} groups: not a whole number >= 1"
    )
  scores = np.asarray(batch.token_rewards, np.float32).sum(-1)
  kept, group_std = top_spread_groups(
    jnp.asarray(scores), jnp.asarray(ids), num_groups, keep, reverse
  )
  kept, group_std = np.asarray(kept), np.asarray(group_std)
  chosen = np.zeros(num_groups, bool)
  chosen[ids[kept]] = True
  stats = {
    "kept_frac": keep / num_groups,
    "in_group_std": float(group_std.mean()),
    "kept_in_group_std": float(group_std[chosen].mean()),
  }
  if keep == num_groups:
    return batch, stats
  return mask_episodes(batch, kept), stats


def penalize_malformed_turns(
  batch: TrajectoryBatch, penalty: float
) -> tuple[TrajectoryBatch, dict[str, float]]:
  """The format penalty (GRL's `format_penalty`): `penalty` (<= 0) added to the reward of
  every turn the environment called malformed, on that turn's reward token:

    token_rewards' = token_rewards + penalty * malformed_turns        ([B, T])

  `malformed_turns` (the rollout's `[B, T]` counts) absent or `penalty` 0: `batch` as it is.
  Returns the batch and `{malformed_turns: mean malformed turns per episode,
  format_penalty: mean penalty per episode}`.
  """
  malformed = getattr(batch, "malformed_turns", None)
  if malformed is None:
    return batch, {}
  counts = np.asarray(malformed, np.float32)
  per_episode = counts.sum(-1)
  stats = {
    "malformed_turns": float(per_episode.mean()) if len(per_episode) else 0.0,
    "format_penalty": float(penalty * per_episode.mean()) if len(per_episode) else 0.0,
  }
  if penalty == 0.0:
    return batch, stats
  shaped = np.asarray(batch.token_rewards, np.float32) + np.float32(penalty) * counts
  return dataclasses.replace(batch, token_rewards=shaped), stats
