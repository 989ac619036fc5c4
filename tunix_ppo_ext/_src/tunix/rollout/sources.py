"""Trajectory sources that wrap trajectory sources: what happens to a rollout's batch
between the environment and the estimator, composable from Python.

A trajectory source is what `PpoExtLearner(trajectory_source=...)` takes: a callable
`source(context, training_input, mode) -> TrajectoryBatch` (`MultiTurnRollout` is one). Each
class here wraps another source and is a source itself, so they stack:

  source = MultiTurnRollout("memory", max_turns=4, max_completion_len=16)
  source = OverlongPenalty(source, budget=8, buffer_len=4)   # DAPO eq. 13, training only
  source = DynamicSampling(source, max_rounds=4)             # DAPO's dynamic sampling
  source = ScoreShaping(source, method="mean_std")           # GRL / RAGEN score normalization
  source = GroupFilter(source, keep_ratio=0.5)               # StarPO-S's rollout filter
  learner = PpoExtLearner(rl_cluster, config, trajectory_source=source)

Order matters as it reads: dynamic sampling regenerates rounds through everything inside it
(so it judges scores with the overlong penalty, as verl's `seq_reward` does); the filter
sees shaped scores. What a wrapper did is logged on the cluster as `rollout/<name>`
metrics (means over a step's batches).

Checkpointed state has one route: a wrapper has no state of its own and hands
`state_dict` / `load_state_dict` through to the source it wraps (the rollout's sampling
state), so the learner saves and restores the innermost source's state however deep it is
wrapped; a wrapped source without state has neither method, as before wrapping.

The run config's `shaping`, `filter`, `validation`, `dapo` and `env.loss_on_observations`
build these (`run.recipe`, `run.dapo_section`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import ConfigError, check_choice, check_integer, check_number
from tunix_ppo_ext._src.data.dynamic_sampling import (
  SCORE_METRICS,
  fill_with_informative_groups,
  overlong_shaped,
  round_input,
)
from tunix_ppo_ext._src.data.score_shaping import (
  GROUPINGS,
  filter_groups,
  normalize_batch_scores,
  penalize_malformed_turns,
)
from tunix_ppo_ext._src.data.trajectory import (
  ENV_KEY,
  SEED_KEY,
  VAL_ENV_KEY,
  VAL_SEED_KEY,
  TrajectoryBatch,
)
from tunix_ppo_ext._src.ops.score_norm import SCORE_NORMALIZATIONS
from tunix_ppo_ext._src.tunix.rollout.context import Mode, RolloutContext

Source = Callable[[Any, dict[str, Any], Any], TrajectoryBatch]
FILTER_BY = ("std", "std_rev")


def buffer_rollout_stats(context: RolloutContext, stats: dict[str, Any], mode: Any) -> None:
  """Buffers every entry of `stats` on the context's cluster as metric `rollout/<name>`,
  a float averaged over the batches of a step: how a wrapper reports what it did.

  Args:
    context: the rollout context (its `rl_cluster` buffers the metrics).
    stats: name -> a number.
    mode: tunix's metrics mode (train or eval).
  """
  metrics = {f"rollout/{k}": (float(v), np.mean) for k, v in stats.items()}
  context.rl_cluster.buffer_metrics(metrics, mode=mode)


def check_source(owner: str, what: str, source: Any) -> None:
  """TypeError naming `owner`'s argument `what` unless `source` is a callable instance (a
  class, e.g. `MultiTurnRollout` itself, would be called with the rollout context as its first
  argument)."""
  if isinstance(source, type):
    raise TypeError(
      f"{owner}: {what} {source.__name__} is a class, not a source: pass an instance, "
      f"e.g. {source.__name__}(...)"
    )
  if not callable(source):
    raise TypeError(f"{owner}: {what} {source!r} is not callable")


def as_mode(mode: Any) -> Mode:
  """tunix's `Mode` of `mode`: a `Mode`, or its value `"train"` / `"eval"`."""
  try:
    return Mode(mode)
  except ValueError:
    accepted = [m.value for m in Mode]
    raise ValueError(f"mode {mode!r} is not one of tunix's modes {accepted}") from None


class SourceWrapper:
  """A trajectory source around `inner`: subclasses define `_call` (the mode given as
  tunix's `Mode` or its string value). `state_dict` and `load_state_dict` are `inner`'s (the
  module docstring's one route for checkpointed state); `inner` without them: neither
  exists here either."""

  _STATE = ("state_dict", "load_state_dict")

  def __init__(self, inner: Source):
    check_source(type(self).__name__, "the wrapped source", inner)
    self.inner = inner

  def __call__(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    return self._call(context, training_input, as_mode(mode))

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Mode
  ) -> TrajectoryBatch:
    raise NotImplementedError

  def __getattr__(self, name: str) -> Any:
    if name in self._STATE:
      return getattr(self.__dict__["inner"], name)
    raise AttributeError(name)


class ObservationsInLoss(SourceWrapper):
  """Ablation: every real token under the loss mask, the environment's observations included
  (what a learner that conflates the attention and loss masks trains on)."""

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    batch = self.inner(context, training_input, mode)
    return dataclasses.replace(batch, loss_mask=np.asarray(batch.attention_mask).copy())


class ValidationEpisodes(SourceWrapper):
  """`inner` in training; in evaluation, `evaluation` (a source with the validation
  environment(s) and group size) plays the episodes each input row carries as `[P, G]`
  leaves `validation_seed` / `validation_env` (row `i` plays copy `i % G`: tunix's chunks
  hold whole prompts, `num_generations` copies each; `run.recipe.validation_batches`)."""

  def __init__(self, inner: Source, evaluation: Source):
    super().__init__(inner)
    check_source("ValidationEpisodes", "evaluation", evaluation)
    self.evaluation = evaluation

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    if mode == Mode.TRAIN:
      return self.inner(context, training_input, mode)
    rows = np.arange(len(training_input[VAL_SEED_KEY]))
    copies = rows % np.shape(training_input[VAL_SEED_KEY])[1]
    seeds = np.asarray(training_input[VAL_SEED_KEY])[rows, copies]
    envs = np.asarray(training_input[VAL_ENV_KEY])[rows, copies]
    inputs = {"prompts": seeds.astype(str), SEED_KEY: seeds, ENV_KEY: envs}
    return self.evaluation(context, inputs, mode)


class OverlongPenalty(SourceWrapper):
  """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13; verl's
  `reward_model.overlong_buffer`) on training batches: an episode of `n` agent tokens in the
  last `buffer_len` of the `budget` gets `-penalty_factor * (n - (budget - buffer_len)) /
  buffer_len` (`ops.overlong_penalty`). Logs `rollout/overlong_penalty` (mean added reward)
  and `rollout/overlong_frac` (share penalized). Evaluation: `inner` untouched."""

  def __init__(self, inner: Source, budget: int, buffer_len: int, penalty_factor: float = 1.0):
    super().__init__(inner)
    check_integer("OverlongPenalty's budget", budget, low=1)
    check_integer("OverlongPenalty's buffer_len", buffer_len, low=1)
    if buffer_len > budget:
      raise ConfigError(f"OverlongPenalty's buffer_len={buffer_len} exceeds budget={budget}")
    check_number("OverlongPenalty's penalty_factor", penalty_factor, low=0.0)
    self.budget, self.buffer_len, self.penalty_factor = budget, buffer_len, penalty_factor

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    batch = self.inner(context, training_input, mode)
    if mode != Mode.TRAIN:  # evaluation measures the environment's own rewards
      return batch
    batch, penalty = overlong_shaped(batch, self.budget, self.buffer_len, self.penalty_factor)
    stats = {"overlong_penalty": penalty.mean(), "overlong_frac": (penalty < 0).mean()}
    buffer_rollout_stats(context, stats, mode)
    return batch


class DynamicSampling(SourceWrapper):
  """DAPO's dynamic sampling (verl's `algorithm.filter_groups`) on training batches: groups
  whose `metric` scores (`seq_reward`: the token rewards' sum; `episode_return`) are all equal
  are dropped and `inner` plays new rounds (fresh episode seeds), `max_rounds` at most, the
  first included; a batch still short is completed with masked groups. Logs
  `rollout/dynamic_sampling_rounds`, `..._kept_frac` (share of generated groups kept) and
  `..._masked_frac`. Evaluation: `inner` untouched."""

  def __init__(self, inner: Source, max_rounds: int = 4, metric: str = "seq_reward"):
    super().__init__(inner)
    check_integer("DynamicSampling's max_rounds", max_rounds, low=1)
    check_choice("DynamicSampling's metric", metric, SCORE_METRICS)
    self.max_rounds, self.metric = max_rounds, metric

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    if mode != Mode.TRAIN:
      return self.inner(context, training_input, mode)
    batch, stats = fill_with_informative_groups(
      lambda r: self.inner(context, round_input(training_input, r), mode),
      self.max_rounds,
      self.metric,
    )
    buffer_rollout_stats(context, {f"dynamic_sampling_{k}": v for k, v in stats.items()}, mode)
    return batch


class ScoreShaping(SourceWrapper):
  """Episode scores normalized within their `grouping` (`group`, `batch`, `state`) by
  `method` (`identity`, `mean`, `mean_std`, `asym_clip`; `ops.normalize_scores`), as GRL and
  RAGEN do before any estimator; then `format_penalty` (<= 0) added to the reward of every
  turn the environment flagged malformed, logging `rollout/malformed_turns` and
  `rollout/format_penalty` (means per episode). Training and evaluation alike."""

  def __init__(
    self,
    inner: Source,
    grouping: str = "group",
    method: str = "identity",
    eps: float = 1e-6,
    format_penalty: float = 0.0,
  ):
    super().__init__(inner)
    check_choice("ScoreShaping's grouping", grouping, GROUPINGS)
    check_choice("ScoreShaping's method", method, SCORE_NORMALIZATIONS)
    check_number("ScoreShaping's eps", eps, low=0.0, low_open=True)
    check_number("ScoreShaping's format_penalty", format_penalty, high=0.0)
    self.grouping, self.method, self.eps = grouping, method, eps
    self.format_penalty = format_penalty

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    batch = self.inner(context, training_input, mode)
    batch = normalize_batch_scores(batch, self.grouping, self.method, self.eps)
    if self.format_penalty == 0.0:
      return batch
    batch, stats = penalize_malformed_turns(batch, self.format_penalty)
    buffer_rollout_stats(context, stats, mode)
    return batch


class GroupFilter(SourceWrapper):
  """The rollout filter (RAGEN's StarPO-S): in training, keeps `keep_ratio` of each batch's
  groups, those with the largest in-group score std (`by="std"`) or the smallest
  (`"std_rev"`); the others' loss masks are zeroed (`data.filter_groups`). Logs
  `rollout/filter_kept_frac`, `rollout/in_group_std`, `rollout/kept_in_group_std`.
  Evaluation measures every episode."""

  def __init__(self, inner: Source, keep_ratio: float, by: str = "std"):
    super().__init__(inner)
    check_number("GroupFilter's keep_ratio", keep_ratio, low=0.0, high=1.0, low_open=True)
    check_choice("GroupFilter's by", by, FILTER_BY)
    self.keep_ratio, self.by = keep_ratio, by

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    batch = self.inner(context, training_input, mode)
    if mode != Mode.TRAIN:
      return batch
    batch, stats = filter_groups(batch, self.keep_ratio, self.by == "std_rev")
    names = {"kept_frac": "filter_kept_frac"}
    buffer_rollout_stats(context, {names.get(k, k): v for k, v in stats.items()}, mode)
    return batch
