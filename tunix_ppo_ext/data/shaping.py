"""Score normalization applied to a rollout's trajectories before any estimator (GAE
included), as GRL / RAGEN do for multi-turn agents (`ops.shaping` holds the math).

An episode's score is the sum of its token rewards. It is normalized within its segment:
`group` (the samples of one prompt, `group_ids`), `batch` (all episodes) or `state` (all
episodes with the same prompt tokens, i.e. the same start state, across groups). The
difference `normalized - score` is added to the episode's last agent token, so every turn
reward stays where it was and the episode's total becomes the normalized score.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from tunix_ppo_ext.data.trajectory import TrajectoryBatch
from tunix_ppo_ext.ops.shaping import normalize_scores

GROUPINGS = ("group", "batch", "state")


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
  rewards = np.asarray(batch.token_rewards, np.float32)
  scores = rewards.sum(-1)
  ids = segment_ids(batch, grouping)
  normalized = normalize_scores(jnp.asarray(scores), jnp.asarray(ids), len(scores), method, eps)
  loss = np.asarray(batch.loss_mask) > 0
  width = loss.shape[1]
  last = width - 1 - np.argmax(loss[:, ::-1], axis=1)  # last agent token (0 if none)
  shaped = rewards.copy()
  rows = np.arange(len(scores))
  shaped[rows, last] += np.where(loss.any(1), np.asarray(normalized) - scores, 0.0)
  return dataclasses.replace(batch, token_rewards=shaped)
