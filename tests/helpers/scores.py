"""NumPy references of the score shaping (overlong penalty, score normalisation) and trajectory
batches of given scores.
"""

from __future__ import annotations

import numpy as np

from tunix_ppo_ext._src.data.trajectory import MultiTurnBatch, TrajectoryBatch


def np_overlong(length, max_len, cache, factor):
  """DAPO eq. 13, scaled by `factor`."""
  if length <= max_len - cache:
    return 0.0
  if length <= max_len:
    return factor * ((max_len - cache) - length) / cache
  return -factor


EPS = 1e-6


def ref_normalize(x, ids, method):
  """Loop over segments: population mean/std, the four methods."""
  x = np.asarray(x, np.float64)
  out = x.copy()
  for seg in set(ids.tolist()):
    rows = [i for i in range(len(x)) if ids[i] == seg]
    vals = x[rows]
    mu = sum(vals) / len(vals)
    sigma = (sum((v - mu) ** 2 for v in vals) / len(vals)) ** 0.5
    for i in rows:
      if method == "mean":
        out[i] = x[i] - mu
      elif method in ("mean_std", "asym_clip"):
        z = (x[i] - mu) / (sigma + EPS) if sigma > EPS else 0.0
        out[i] = min(max(z, -1.0), 3.0) if method == "asym_clip" else z
  return out


def batch() -> TrajectoryBatch:
  """6 episodes in 3 groups of 2; groups 0 and 2 start from the same prompt (state)."""
  prompts = np.array([[1, 5]] * 2 + [[1, 6]] * 2 + [[1, 5]] * 2)
  loss = np.array(
    [
      [1, 1, 0, 1, 0],
      [1, 0, 0, 1, 1],
      [1, 1, 1, 0, 0],
      [0, 0, 0, 0, 0],  # no agent token: left as it is
      [1, 0, 0, 0, 0],
      [1, 1, 0, 1, 1],
    ]
  )
  rewards = np.zeros((6, 5), np.float32)
  rewards[0, 1], rewards[0, 3] = 0.25, 1.0  # two turn rewards
  rewards[1, 4] = -2.0
  rewards[2, 2] = 0.5
  rewards[4, 0] = 3.0
  rewards[5, 1], rewards[5, 4] = 1.0, 1.0
  return TrajectoryBatch(
    prompt_ids=prompts,
    completion_ids=np.ones((6, 5), int),
    attention_mask=np.ones((6, 5), int),
    loss_mask=loss,
    token_rewards=rewards,
    group_ids=np.array([0, 0, 1, 1, 2, 2]),
  )


def multi_turn_batch(scores, round_index=0, group=2, returns=None) -> MultiTurnBatch:
  """`len(scores)` episodes in consecutive groups of `group`, each score on its last token;
  `completion_ids` tag the round and row (`100 * round + row`) so moved rows can be traced."""
  size = len(scores)
  rewards = np.zeros((size, 3), np.float32)
  rewards[:, 2] = scores
  tags = np.repeat((100 * round_index + np.arange(size))[:, None], 3, axis=1)
  return MultiTurnBatch(
    prompt_ids=np.ones((size, 2), int),
    completion_ids=tags,
    attention_mask=np.ones((size, 3), int),
    loss_mask=np.ones((size, 3), int),
    token_rewards=rewards,
    sampler_logps=np.full((size, 3), -1.0, np.float32),
    sampler_logp_mask=np.ones((size, 3), int),
    group_ids=np.arange(size) // group,
    texts=[f"r{round_index}e{i}" for i in range(size)],
    episode_returns=np.asarray(scores if returns is None else returns, np.float32),
  )
