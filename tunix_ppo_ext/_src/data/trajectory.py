"""Trajectory containers: what a rollout hands the learner, with its two masks.

`TrajectoryBatch` holds `B` episodes as NumPy arrays: prompt and completion tokens, the
attention mask (every real completion token) and the loss mask (the agent's own tokens,
a subset), token rewards and optional episode outcomes; `validate` names the field that
is wrong. `MultiTurnBatch` adds which sampler log-probs are real. `episode_batches` and
`episode_seeds` carry the episode seeds that make a rollout reproducible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tunix_ppo_ext._src.data.rewards import nonfinite_rows

SEED_KEY = "seed"
ENV_KEY = "env"  # which environment of a mixed run plays the row (index into the run's list)
# an evaluation input's own episodes: `[P, num_generations]` seeds and environment indices
VAL_SEED_KEY, VAL_ENV_KEY = "validation_seed", "validation_env"


@dataclasses.dataclass
class TrajectoryBatch:
  """Pre-built trajectories for the learner (all NumPy, `B` rows).

  Attributes:
    prompt_ids: `[B, P]` left-padded prompt tokens.
    completion_ids: `[B, T]` completion tokens: agent turns and environment observations.
    attention_mask: `[B, T]` 1 on every real completion token, 0 on padding.
    loss_mask: `[B, T]` 1 on the agent's own tokens (a subset of `attention_mask`).
    token_rewards: `[B, T]` float rewards (turn rewards on the last agent token of a turn).
    sampler_logps: optional `[B, T]` log-probs the sampler reported for agent tokens.
    group_ids: optional `[B]` ints grouping samples of one prompt (group estimators).
    texts: optional completion texts (for user metric functions).
    episode_returns, num_turns, truncated, turn_limited: optional `[B]` episode outcomes
      (sum of environment rewards, agent turns, cut at the width, out of turns) for metrics.
    anchor_ids: optional `[B, K]` ints, the anchor state of each row's k-th agent turn
      (equal ids in one group: the same state; GiGPO's step groups); turns not played -1.
    metrics: optional `{name: (value, reducer)}`, the source's own metrics of this batch
      (tunix's `buffer_metrics` format); the learner logs them in the batch's mode.
  """

  prompt_ids: np.ndarray
  completion_ids: np.ndarray
  attention_mask: np.ndarray
  loss_mask: np.ndarray
  token_rewards: np.ndarray
  sampler_logps: np.ndarray | None = None
  group_ids: np.ndarray | None = None
  texts: list[str] | None = None
  episode_returns: np.ndarray | None = None
  num_turns: np.ndarray | None = None
  truncated: np.ndarray | None = None
  turn_limited: np.ndarray | None = None
  anchor_ids: np.ndarray | None = None
  metrics: dict[str, tuple[Any, Any]] | None = None

  def validate(self, allow_nonfinite_rewards: bool = False) -> None:
    """Raises ValueError naming the field when shapes, masks or rewards are wrong.

    Masks must hold only 0 and 1. Token rewards must be finite unless
    `allow_nonfinite_rewards` (the learner then applies `PpoExtConfig.nonfinite_rewards`).
    """
    if np.ndim(self.completion_ids) != 2:
      raise ValueError(f"completion_ids shape {np.shape(self.completion_ids)} must be [B, T]")
    b, t = self.completion_ids.shape
    if self.prompt_ids.ndim != 2 or self.prompt_ids.shape[0] != b:
      raise ValueError(f"prompt_ids shape {self.prompt_ids.shape} must be [B={b}, P]")
    for name in ("attention_mask", "loss_mask", "token_rewards", "sampler_logps"):
      value = getattr(self, name)
      if value is not None and np.shape(value) != (b, t):
        raise ValueError(f"{name} shape {np.shape(value)} must equal completion_ids' {(b, t)}")
    for name in ("attention_mask", "loss_mask"):
      values = np.asarray(getattr(self, name))
      wrong = ~np.isin(values, (0, 1))
      if wrong.any():
        row = int(np.argwhere(wrong)[0][0])
        raise ValueError(
          f"{name} must hold only 0 and 1; row {row} holds {np.unique(values[wrong])[:5]}"
        )
    if np.any((self.loss_mask > 0) & (self.attention_mask == 0)):
      raise ValueError("loss_mask marks tokens that attention_mask marks as padding")
    rows = nonfinite_rows(self.token_rewards)
    if rows.size and not allow_nonfinite_rewards:
      raise ValueError(f"token_rewards contains NaN or inf in episode row(s) {rows.tolist()}")
    for name in ("group_ids", "episode_returns", "num_turns", "truncated", "turn_limited"):
      value = getattr(self, name)
      if value is not None and np.shape(value) != (b,):
        raise ValueError(f"{name} shape {np.shape(value)} must be [B={b}]")
    anchors = self.anchor_ids
    if anchors is not None and (np.ndim(anchors) != 2 or np.shape(anchors)[0] != b):
      raise ValueError(f"anchor_ids shape {np.shape(anchors)} must be [B={b}, K]")


@dataclasses.dataclass
class MultiTurnBatch(TrajectoryBatch):
  """A `TrajectoryBatch` that says which `sampler_logps` are real sampler values.

  Attributes:
    sampler_logp_mask: optional `[B, T]` 1 where `sampler_logps` holds the engine's
      log-prob (agent tokens it sampled); 0 elsewhere, including the end-of-turn EOS
      tokens put back after the sampler stripped them (their log-prob is not returned).
    malformed_turns: optional `[B, T]` count of the turns whose reply the environment
      called malformed (`info["invalid_action"]`) and whose reward sits on that token (the
      format penalty's place, `data.shaping.penalize_malformed_turns`).
  """

  sampler_logp_mask: np.ndarray | None = None
  malformed_turns: np.ndarray | None = None

  def validate(self, allow_nonfinite_rewards: bool = False) -> None:
    """`TrajectoryBatch.validate`, plus: the sampler mask is `[B, T]` and within `loss_mask`,
    `malformed_turns` `[B, T]`."""
    super().validate(allow_nonfinite_rewards)
    malformed = self.malformed_turns
    if malformed is not None and np.shape(malformed) != self.completion_ids.shape:
      raise ValueError(
        f"malformed_turns shape {np.shape(malformed)} must equal completion_ids' "
        f"{self.completion_ids.shape}"
      )
    mask = self.sampler_logp_mask
    if mask is None:
      return
    if np.shape(mask) != self.completion_ids.shape:
      raise ValueError(
        f"sampler_logp_mask shape {np.shape(mask)} must equal completion_ids' "
        f"{self.completion_ids.shape}"
      )
    if np.any((mask > 0) & (self.loss_mask == 0)):
      raise ValueError("sampler_logp_mask marks tokens outside loss_mask")


@dataclasses.dataclass(frozen=True)
class RolloutStats:
  """Per-episode outcomes of one `MultiTurnRollout` call (`B` episodes).

  Attributes:
    episode_return: `[B]` float, sum of the environment's rewards (all kept in the batch).
    num_turns: `[B]` int, agent turns played.
    truncated: `[B]` bool, the trajectory hit `max_completion_len` (cut or out of room).
    turn_limited: `[B]` bool, `max_turns` ran out before the environment ended.
    max_return: the environment's `max_return`.
  """

  episode_return: np.ndarray
  num_turns: np.ndarray
  truncated: np.ndarray
  turn_limited: np.ndarray
  max_return: float

  @property
  def truncated_frac(self) -> float:
    return float(np.mean(self.truncated))

  @property
  def turn_limit_frac(self) -> float:
    return float(np.mean(self.turn_limited))


def episode_batches(
  num_batches: int, batch_size: int, seed: int = 0, env_ids: np.ndarray | None = None
) -> Iterator[dict[str, np.ndarray]]:
  """Yields `num_batches` training inputs of `batch_size` episode seeds each.

  Each is `{"prompts": [batch_size] str array of the seeds, "seed": [batch_size] int64}`:
  NumPy arrays, since tunix `np.repeat`s every leaf `num_generations` times (the copies
  of a row then form one group playing the same episode). Deterministic given `seed`.
  `env_ids` (`[batch_size]` ints, a mixed run's `spread_env_ids`) adds `"env"`: which
  environment each row plays.

  Args:
    num_batches: how many batches to yield.
    batch_size: episode seeds per batch.
    seed: seeds the generator that draws the episode seeds.
    env_ids: optional `[batch_size]` int environment index of each row.

  Yields:
    `{"prompts", "seed"}` (and `"env"`) dicts of `[batch_size]` NumPy arrays.
  """
  rng = np.random.default_rng(seed)
  for _ in range(num_batches):
    seeds = rng.integers(0, 2**31 - 1, size=batch_size, dtype=np.int64)
    batch = {"prompts": seeds.astype(str), SEED_KEY: seeds}
    if env_ids is not None:
      batch[ENV_KEY] = np.asarray(env_ids, np.int64).copy()
    yield batch


def spread_env_ids(groups: Sequence[int]) -> np.ndarray:
  """`[sum(groups)]` environment index of each group of a mixed batch: environment `i`
  holds `groups[i]` groups, spread evenly through the batch (group `k` of environment `i`
  sits at fraction `(k + 1/2) / groups[i]`; ties keep list order), so a mini-batch or
  rollout chunk of `1/n` of the batch holds `1/n` of each environment's groups when that
  divides. `[2, 2]` -> `[0, 1, 0, 1]`; `[3, 1]` -> `[0, 0, 1, 0]`."""
  counts = [int(g) for g in groups]
  if not counts or min(counts) < 1:
    raise ValueError(f"every environment needs at least one group, got {counts}")
  positions = np.concatenate([(np.arange(g) + 0.5) / g for g in counts])
  owners = np.repeat(np.arange(len(counts)), counts)
  return owners[np.argsort(positions, kind="stable")]


def episode_env_ids(training_input: dict[str, Any], num_envs: int) -> np.ndarray:
  """`[B]` environment index of each row: `training_input["env"]`, else all 0. ValueError
  when an index is outside `[0, num_envs)`."""
  rows = len(episode_seeds(training_input))
  if ENV_KEY not in training_input:
    return np.zeros(rows, np.int64)
  ids = np.asarray(training_input[ENV_KEY]).astype(np.int64).reshape(-1)
  bad = ids[(ids < 0) | (ids >= num_envs)]
  if len(ids) != rows or bad.size:
    raise ValueError(
      f"training input {ENV_KEY!r} must hold one index in [0, {num_envs}) per row ({rows} "
      f"rows), got {len(ids)} values{f', e.g. {int(bad[0])}' if bad.size else ''}"
    )
  return ids


def episode_seeds(training_input: dict[str, Any]) -> np.ndarray:
  """`[B]` int64 episode seeds: `training_input["seed"]`, else the `"prompts"` parsed as ints.

  Args:
    training_input: one batch of `episode_batches` (after tunix's repeat), a dict with a
      `"seed"` or a `"prompts"` entry of `[B]` values.

  Returns:
    int64 `[B]`.
  """
  if SEED_KEY in training_input:
    return np.asarray(training_input[SEED_KEY]).astype(np.int64).reshape(-1)
  prompts = np.asarray(training_input["prompts"]).reshape(-1)
  try:
    return np.array([int(str(p)) for p in prompts], np.int64)
  except ValueError as err:
    raise ValueError(
      f"training input has no {SEED_KEY!r} key and its prompts are not integer seeds: {err}"
    ) from err


def sampler_logprob_gap(batch: TrajectoryBatch, old_logps: Any, mask: Any) -> float:
  """Mean |sampler - trainer| log-prob over `mask` tokens whose sampler log-prob is known.

  Args:
    batch: with `sampler_logps` `[B, T]`; a `MultiTurnBatch`'s `sampler_logp_mask`
      further restricts the comparison (re-added EOS tokens have no sampler value).
    old_logps: `[B, T]` the trainer's log-probs of the same tokens.
    mask: `[B, T]` tokens to compare (e.g. the loss mask).

  Returns:
    The mean absolute gap; NaN when no token qualifies.
  """
  if batch.sampler_logps is None:
    raise ValueError("batch has no sampler_logps (set return_logprobs=True in the rollout config)")
  known = np.asarray(mask) > 0
  sampler_mask = getattr(batch, "sampler_logp_mask", None)
  if sampler_mask is not None:
    known &= np.asarray(sampler_mask) > 0
  if not known.any():
    return float("nan")
  gap = np.abs(np.asarray(batch.sampler_logps, np.float64) - np.asarray(old_logps, np.float64))
  return float(gap[known].mean())


def contiguous_group_ids(num_rows: int, group_size: int) -> np.ndarray:
  """`[num_rows]` group ids `0, 0, ..., 1, 1, ...`: consecutive runs of `group_size` rows.

  tunix repeats each prompt `num_generations` times in a row, so its copies form a group.

  Args:
    num_rows: `B`, the rows of the batch.
    group_size: rows per group (tunix's `num_generations`), >= 1.

  Returns:
    int `[num_rows]`, row `i` in group `i // group_size`.
  """
  return np.arange(num_rows) // group_size
