"""Every estimator's advantage noise on one scale: its signal coefficient (NumPy only).

An advantage estimator's policy gradient `E[A grad log pi(a|s)]` is `c` times the true one
`E[A* grad log pi]` (`A*` the true advantage `Q(s, a) - V(s)`), `c` its signal coefficient:
a baseline that does not depend on the action changes the gradient's variance, not its
mean, so `c` counts only how the estimator scales. Dividing each advantage by its token's
`c` puts every estimator on the scale of `A*`, where `E[(A / c)^2]` compares their noise
(on one batch; Adam does not see the scale). Per agent token (derived in the metrics guide,
"The advantages' noise"):

- `grpo`: the score minus the mean of its group of `n`, itself included, is `(n-1)/n` times
  the score minus the others' mean (an unbiased baseline): `c = (n-1)/n`, divided by the
  group's std + epsilon where the advantages are; a group of one (its score, no baseline):
  `c = 1` (`1 / (1 + epsilon)` with the std division);
- `rloo`: the others' mean: `c = 1`;
- `gigpo`: the episode part as `grpo`, plus `step_weight` times the step part's: `(m-1)/m`
  for a turn in a step group of `m` (its own std division), 0 for a step group of one;
- `gae`, `turn_gae`: a critic's baseline: `c = 1`; whitened, `1 / std` of the raw
  advantages over the mask (the whitening's scale; its shift is a baseline);
- `reinforce_plus_plus`: returns (no baseline), always whitened: `1 / std` of the returns;
- any other estimator: `c = 1` (unknown).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# the epsilon of masked_whiten's variance, and the group estimators' default std epsilon
WHITEN_EPSILON = 1e-8
STD_EPSILON = 1e-6


def group_counts_and_stds(values: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per element: its group's size and sample std (ddof 1; 0 for a group of one)."""
  _, dense = np.unique(ids, return_inverse=True, axis=0)
  dense = dense.reshape(-1)
  count = np.bincount(dense).astype(np.float64)
  total = np.bincount(dense, weights=values)
  mean = total / count
  squares = np.bincount(dense, weights=(values - mean[dense]) ** 2)
  std = np.sqrt(squares / np.maximum(count - 1.0, 1.0))
  return count[dense], std[dense]


def agent_turns(mask: np.ndarray) -> np.ndarray:
  """`[B, T]` each agent token's turn (0, 1, ...: maximal runs of `mask == 1`), -1 off it."""
  agent = np.asarray(mask) > 0
  starts = agent & ~np.pad(agent[:, :-1], ((0, 0), (1, 0)))
  return np.where(agent, np.cumsum(starts, axis=1) - 1, -1)


def turn_returns(rewards: np.ndarray, mask: np.ndarray, gamma_turn: float) -> np.ndarray:
  """`[B, T]` each agent token's turn's discounted return `sum_{j >= k} gamma^(j-k) r_j`."""
  turn = agent_turns(mask)
  width = turn.shape[1] + 1  # the last column collects the tokens off the mask
  per_turn = np.zeros((turn.shape[0], width))
  rows = np.repeat(np.arange(turn.shape[0]), turn.shape[1])
  np.add.at(per_turn, (rows, np.where(turn < 0, width - 1, turn).ravel()), rewards.ravel())
  per_turn[:, -1] = 0.0
  returns = np.zeros_like(per_turn)
  for k in range(width - 2, -1, -1):  # over turns, not tokens
    returns[:, k] = per_turn[:, k] + gamma_turn * returns[:, k + 1]
  return np.take_along_axis(returns, np.maximum(turn, 0), axis=1)


def _group_part(counts: np.ndarray, stds: np.ndarray, std_division: bool) -> np.ndarray:
  """`(n-1)/n` per element (1 for a group of one), divided by std + epsilon with it."""
  single = counts < 2
  part = np.where(single, 1.0, (counts - 1.0) / np.maximum(counts, 1.0))
  if std_division:
    part = part / (np.where(single, 1.0, stds) + STD_EPSILON)
  return part


def signal_coefficients(
  estimator: str, terms: dict[str, Any], *, std_division: bool, whiten: bool
) -> np.ndarray:
  """`[B, T]` each agent token's signal coefficient `c` (module docstring), 0 off the mask.

  Args:
    estimator: the advantage estimator's name (`grpo`, `rloo`, `gigpo`, `gae`, `turn_gae`,
      `reinforce_plus_plus`; any other: `c = 1`).
    terms: `rewards`, `mask` `[B, T]`, `groups` `[B]`; `anchors` `[B, K]` (gigpo);
      `advantages_raw` `[B, T]` (gae, turn_gae: the unwhitened advantages); `returns`
      `[B, T]` (reinforce_plus_plus); `step_weight`, `gamma_turn` (gigpo).
    std_division: the group estimators divide by their groups' std.
    whiten: GAE's advantages are whitened.

  Returns:
    float64 `[B, T]`.
  """
  mask = np.asarray(terms["mask"]) > 0
  c = np.ones(mask.shape)
  if estimator in ("grpo", "gigpo"):
    rewards = np.asarray(terms["rewards"], np.float64)
    scores = (rewards * mask).sum(-1)
    counts, stds = group_counts_and_stds(scores, np.asarray(terms["groups"]))
    c = np.broadcast_to(_group_part(counts, stds, std_division)[:, None], mask.shape).copy()
    if estimator == "gigpo":
      c += terms["step_weight"] * _step_part(terms, mask, std_division)
  elif estimator in ("gae", "turn_gae") and whiten:
    c[:] = 1.0 / _masked_std(terms["advantages_raw"], mask)
  elif estimator == "reinforce_plus_plus":
    c[:] = 1.0 / _masked_std(terms["returns"], mask)
  return np.where(mask, c, 0.0)


def _step_part(terms: dict[str, Any], mask: np.ndarray, std_division: bool) -> np.ndarray:
  """GiGPO's step coefficient per agent token: `(m-1)/m` (over its step group's std +
  epsilon with the division) for a step group of `m >= 2`, else 0."""
  anchors = np.asarray(terms["anchors"])
  turn = agent_turns(mask)
  returns = turn_returns(np.asarray(terms["rewards"], np.float64), mask, terms["gamma_turn"])
  rows, cols = np.nonzero(mask & (turn < anchors.shape[1]))
  groups = np.asarray(terms["groups"])[rows]
  keys = np.stack([groups, anchors[rows, turn[rows, cols]], rows, turn[rows, cols]], axis=1)
  # one value per turn (its tokens repeat it): counts and stds over distinct turns
  turns, first = np.unique(keys, axis=0, return_index=True)
  counts, stds = group_counts_and_stds(returns[rows[first], cols[first]], turns[:, :2])
  part = np.where(counts < 2, 0.0, _group_part(counts, stds, std_division))
  _, where = np.unique(keys, axis=0, return_inverse=True)
  out = np.zeros(mask.shape)
  out[rows, cols] = part[where.reshape(-1)]
  return out


def _masked_std(values: Any, mask: np.ndarray) -> float:
  """`sqrt(var + 1e-8)` over the mask (unbiased variance), as `masked_whiten` divides."""
  picked = np.asarray(values, np.float64)[mask]
  var = picked.var(ddof=1) if picked.size > 1 else 0.0
  return float(np.sqrt(var + WHITEN_EPSILON))


def common_scale_noise(advantages: Any, coefficients: np.ndarray, mask: Any) -> dict[str, float]:
  """`{token, turn}`: the mean over agent tokens of `(A / c)^2`, and over agent turns of
  the square of each turn's mean `A / c`; {} without agent tokens. A token whose `c` is 0
  (no signal: a constant group's std division) counts 0.

  Args:
    advantages: `[B, T]` advantages.
    coefficients: `[B, T]` their signal coefficients (`signal_coefficients`).
    mask: `[B, T]` 0/1 loss mask (agent tokens).

  Returns:
    `{"token": float, "turn": float}`, or {}.
  """
  agent = np.asarray(mask) > 0
  if not agent.any():
    return {}
  safe = np.where(coefficients != 0, coefficients, 1.0)
  scaled = np.where(coefficients != 0, np.asarray(advantages, np.float64) / safe, 0.0)
  turn = agent_turns(agent)
  key = (np.arange(agent.shape[0])[:, None] * (agent.shape[1] + 1) + turn)[agent]
  counts = np.bincount(key)
  means = np.bincount(key, weights=scaled[agent])[counts > 0] / counts[counts > 0]
  return {"token": float(np.mean(scaled[agent] ** 2)), "turn": float(np.mean(means**2))}
