"""DAPO's reward shaping and dynamic sampling on trajectory batches (Yu et al. 2025, "DAPO:
An Open-Source LLM Reinforcement Learning System at Scale", arXiv:2503.14476); the math is
`ops.overlong_penalty` and `ops.informative_groups`.

- `overlong_shaped`: soft overlong punishment (DAPO eq. 13, verl's
  `reward_model.overlong_buffer`) added to each episode's reward. An episode's length is its
  number of agent tokens (the loss mask: sampled tokens and the EOS that ended a turn), so
  in a multi-turn episode the environment's observations do not count against the budget;
  single-turn, that is the response length, as in the paper.
- `fill_with_informative_groups`: dynamic sampling (verl's `algorithm.filter_groups`):
  groups whose scores are all equal are dropped and more rounds generated until the batch
  holds only informative groups, or the budget of rounds is spent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tunix_ppo_ext._src.data.score_shaping import add_to_episode_rewards, mask_episodes, segment_ids
from tunix_ppo_ext._src.data.trajectory import (
  SEED_KEY,
  TrajectoryBatch,
  contiguous_group_ids,
  episode_seeds,
)
from tunix_ppo_ext._src.names import SCORE_METRICS
from tunix_ppo_ext._src.ops.overlong import informative_groups, overlong_penalty


def overlong_shaped(
  batch: TrajectoryBatch, max_len: int, cache_len: int, penalty_factor: float
) -> tuple[TrajectoryBatch, np.ndarray]:
  """`(batch, penalty [B])`: `batch` with `overlong_penalty(agent tokens, max_len,
  cache_len, penalty_factor)` (<= 0) added to each episode's reward on its last agent token
  (`add_to_episode_rewards`), i.e. before any estimator sees it."""
  lengths = (np.asarray(batch.loss_mask) > 0).sum(-1)
  penalty = np.asarray(overlong_penalty(lengths, max_len, cache_len, penalty_factor))
  return add_to_episode_rewards(batch, penalty), penalty


def episode_scores(batch: TrajectoryBatch, metric: str) -> np.ndarray:
  """`[B]` float32 score dynamic sampling compares within a group: `seq_reward` (the sum of
  the token rewards, overlong penalty included: verl's `seq_reward`) or `episode_return`
  (the environment's rewards alone)."""
  if metric == "seq_reward":
    return np.asarray(batch.token_rewards, np.float32).sum(-1)
  if metric == "episode_return":
    if batch.episode_returns is None:
      raise ValueError("dynamic sampling by 'episode_return': the batch has no episode_returns")
    return np.asarray(batch.episode_returns, np.float32)
  raise ValueError(f"dynamic sampling metric {metric!r} unknown (valid: {SCORE_METRICS})")


def take_rows(batch: TrajectoryBatch, rows: np.ndarray) -> TrajectoryBatch:
  """The episodes `rows` (indices or a `[B]` bool mask) of `batch`, every field kept."""
  index = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, int)
  changes: dict[str, Any] = {}
  for field in dataclasses.fields(batch):
    value = getattr(batch, field.name)
    if isinstance(value, list):
      changes[field.name] = [value[i] for i in index]
    elif value is not None and not isinstance(value, dict):  # `metrics`: the batch's, kept
      changes[field.name] = np.asarray(value)[index]
  return dataclasses.replace(batch, **changes)


def concat_batches(batches: Sequence[TrajectoryBatch]) -> TrajectoryBatch:
  """The episodes of `batches` (same type, same widths, same optional fields) in order."""
  changes: dict[str, Any] = {}
  for field in dataclasses.fields(batches[0]):
    values = [getattr(b, field.name) for b in batches]
    if isinstance(values[0], list):
      changes[field.name] = [item for value in values for item in value]
    elif isinstance(values[0], dict):
      changes[field.name] = merged_metrics(values)
    elif values[0] is not None:
      changes[field.name] = np.concatenate([np.asarray(v) for v in values])
  return dataclasses.replace(batches[0], **changes)


Metrics = dict[str, tuple[Any, Any]]  # `{name: (value, reducer)}`, tunix's buffer format


def merged_metrics(parts: Sequence[Metrics | None]) -> Metrics:
  """Several batches' `metrics` as one: each name's values reduced by its reducer, as
  tunix's buffer reduces what is buffered several times in a step."""
  values: dict[str, list[Any]] = {}
  reducers: dict[str, Any] = {}
  for part in parts:
    for name, (value, reducer) in (part or {}).items():
      values.setdefault(name, []).append(value)
      reducers[name] = reducer
  return {name: (float(reducers[name](v)), reducers[name]) for name, v in values.items()}


def round_input(training_input: dict[str, Any], round_index: int) -> dict[str, Any]:
  """The training input of dynamic sampling's round `round_index` (0: `training_input`):
  each episode seed replaced by one drawn from `(seed, round_index)`, so the rows of a
  group (one seed) stay a group and a rerun draws the same episodes; `prompts` follow the
  seeds, other keys are kept."""
  if round_index == 0:
    return training_input
  seeds = episode_seeds(training_input)
  draw = [np.random.SeedSequence([int(s), round_index]).generate_state(1)[0] for s in seeds]
  fresh = np.asarray(draw, np.int64) & 0x7FFFFFFF
  return {**training_input, SEED_KEY: fresh, "prompts": fresh.astype(str)}


def fill_with_informative_groups(
  generate: Callable[[int], TrajectoryBatch], max_rounds: int, metric: str = "seq_reward"
) -> tuple[TrajectoryBatch, dict[str, float]]:
  """DAPO's dynamic sampling: calls `generate(round)` (rounds 0, 1, ...; each a batch of
  `B` episodes in groups of equal size `g`) until `B` episodes of informative groups
  (`ops.informative_groups` of `episode_scores(batch, metric)`) are gathered or
  `max_rounds` rounds are done; the batch is the first `B` such episodes in order. When
  the rounds run out first, it is completed with dropped groups whose loss masks are zeroed
  (`mask_episodes`), so its shape stays the same for tunix.

  Returns `(batch, {rounds, kept_frac, masked_frac})`: rounds generated, the share of the
  generated groups that were informative, the share of the batch completed with masked ones.
  """
  kept: list[TrajectoryBatch] = []
  dropped: list[TrajectoryBatch] = []
  size = group = num_kept = rounds = 0
  while rounds < max_rounds and (rounds == 0 or num_kept < size):
    batch = generate(rounds)
    ids = segment_ids(batch, "group")
    if rounds == 0:
      size, group = len(ids), _group_size(ids)
    informative = np.asarray(informative_groups(episode_scores(batch, metric), ids))
    rounds += 1
    if rounds == 1 and informative.all():
      return batch, {"rounds": 1.0, "kept_frac": 1.0, "masked_frac": 0.0}
    kept.append(take_rows(batch, informative))
    dropped.append(take_rows(batch, ~informative))
    num_kept += int(informative.sum())
  missing = max(size - num_kept, 0)
  filled = take_rows(concat_batches([*kept, *dropped]), np.arange(size))
  filled = mask_episodes(filled, np.arange(size) < size - missing)
  filled = dataclasses.replace(filled, group_ids=contiguous_group_ids(size, group))
  stats = {"rounds": float(rounds), "kept_frac": num_kept / (rounds * size)}
  return filled, {**stats, "masked_frac": missing / size}


def _group_size(ids: np.ndarray) -> int:
  """The common size `g` of the groups `ids` `[B]`; ValueError unless they are consecutive
  runs of `g` rows (dynamic sampling swaps whole groups and renumbers them so)."""
  size = int(np.bincount(ids)[0])
  if not np.array_equal(ids, contiguous_group_ids(len(ids), size)):
    raise ValueError(
      f"dynamic sampling needs groups of consecutive rows of one size; got group ids {ids[:12]}"
    )
  return size
