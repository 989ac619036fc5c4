"""Trajectory sources that wrap trajectory sources: what happens to a rollout's batch
between the environment and the estimator, composable from Python.

A trajectory source is what `PpoExtLearner(trajectory_source=...)` takes: a callable
`source(context, training_input, mode) -> TrajectoryBatch` (`MultiTurnRollout` is one). Each
class here wraps another source and is a source itself, so they stack:

  source = MultiTurnRollout("memory", max_turns=4, max_completion_len=16)
  source = OverlongPenalty(source, 8, OverlongBufferSection(len=4))  # DAPO eq. 13
  source = DynamicSampling(source, FilterGroupsSection(max_num_gen_batches=4))  # DAPO
  source = ScoreShaping(source, ShapingSection(method="mean_std"))  # GRL / RAGEN
  source = GroupFilter(source, FilterSection(keep_ratio=0.5))  # StarPO-S's rollout filter
  learner = PpoExtLearner(rl_cluster, config, trajectory_source=source)

Each takes its settings as the run config's section (`config.rollout_sections`), checked
when the section is built; the wrapper checks nothing again.

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

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.config.rollout_sections import (
  FilterGroupsSection,
  FilterSection,
  OverlongBufferSection,
  ShapingSection,
)
from tunix_ppo_ext._src.data.dynamic_sampling import (
  fill_with_informative_groups,
  overlong_shaped,
  round_input,
)
from tunix_ppo_ext._src.data.score_shaping import (
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
from tunix_ppo_ext._src.tunix.rollout.context import Mode, RolloutContext

Source = Callable[[Any, dict[str, Any], Any], TrajectoryBatch]


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


class SectionWrapper(SourceWrapper):
  """A wrapper configured by one config section (`self.section`), checked when it was built
  (`config.rollout_sections`).

  Args:
    inner: the wrapped source.
    section: the wrapper's settings.
  """

  def __init__(self, inner: Source, section: Any):
    super().__init__(inner)
    self.section = section


def check_overlong_budget(section: OverlongBufferSection, budget: int, budget_source: str) -> None:
  """Refuses a `budget` (DAPO's L_max) that `section`'s buffer does not fit in.

  Args:
    section: the overlong buffer.
    budget: the most agent tokens an episode holds.
    budget_source: where the budget came from, for the message.

  Raises:
    ConfigError: `budget` is not an integer of at least `section.len`.
  """
  if isinstance(budget, bool) or not isinstance(budget, int) or budget < section.len:
    raise ConfigError(
      f"config key 'dapo.overlong_buffer.len'={section.len} exceeds the budget of {budget!r} "
      f"agent tokens: {budget_source}"
    )


class OverlongPenalty(SectionWrapper):
  """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13; verl's
  `reward_model.overlong_buffer`) on training batches: an episode of `n` agent tokens in the
  last `section.len` of the `budget` gets `-penalty_factor * (n - (budget - len)) / len`
  (`ops.overlong_penalty`). Logs `rollout/overlong_penalty` (mean added reward) and
  `rollout/overlong_frac` (share penalized). Evaluation: `inner` untouched.

  Args:
    inner: the wrapped source.
    budget: the most agent tokens an episode holds (DAPO's L_max), at least `section.len`.
    section: the buffer's `len` and `penalty_factor` (`enable` is the run config's switch).
  """

  def __init__(self, inner: Source, budget: int, section: OverlongBufferSection):
    super().__init__(inner, section)
    check_overlong_budget(section, budget, "OverlongPenalty's budget")
    self.budget = budget

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    batch = self.inner(context, training_input, mode)
    if mode != Mode.TRAIN:  # evaluation measures the environment's own rewards
      return batch
    over = self.section
    batch, penalty = overlong_shaped(batch, self.budget, over.len, over.penalty_factor)
    stats = {"overlong_penalty": penalty.mean(), "overlong_frac": (penalty < 0).mean()}
    buffer_rollout_stats(context, stats, mode)
    return batch


class DynamicSampling(SectionWrapper):
  """DAPO's dynamic sampling (verl's `algorithm.filter_groups`) on training batches: groups
  whose `section.metric` scores (`seq_reward`: the token rewards' sum; `episode_return`) are
  all equal are dropped and `inner` plays new rounds (fresh episode seeds),
  `section.max_num_gen_batches` at most, the first included; a batch still short is
  completed with masked groups. Logs `rollout/dynamic_sampling_rounds`, `..._kept_frac`
  (share of generated groups kept) and `..._masked_frac`. Evaluation: `inner` untouched.

  Args:
    inner: the wrapped source.
    section: the metric and the most rounds (`enable` is the run config's switch).
  """

  section: FilterGroupsSection

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    if mode != Mode.TRAIN:
      return self.inner(context, training_input, mode)
    batch, stats = fill_with_informative_groups(
      lambda r: self.inner(context, round_input(training_input, r), mode),
      self.section.max_num_gen_batches,
      self.section.metric,
    )
    buffer_rollout_stats(context, {f"dynamic_sampling_{k}": v for k, v in stats.items()}, mode)
    return batch


class ScoreShaping(SectionWrapper):
  """Episode scores normalized within the section's `grouping` (`group`, `batch`, `state`)
  by its `method` (`identity`, `mean`, `mean_std`, `asym_clip`; `ops.normalize_scores`), as
  GRL and RAGEN do before any estimator; then its `format_penalty` (<= 0) added to the
  reward of every turn the environment flagged malformed, logging `rollout/malformed_turns`
  and `rollout/format_penalty` (means per episode). Training and evaluation alike.

  Args:
    inner: the wrapped source.
    section: grouping, method, eps and format penalty.
  """

  section: ShapingSection

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    batch = self.inner(context, training_input, mode)
    shaping = self.section
    batch = normalize_batch_scores(batch, shaping.grouping, shaping.method, shaping.eps)
    if shaping.format_penalty == 0.0:
      return batch
    batch, stats = penalize_malformed_turns(batch, shaping.format_penalty)
    buffer_rollout_stats(context, stats, mode)
    return batch


class GroupFilter(SectionWrapper):
  """The rollout filter (RAGEN's StarPO-S): in training, keeps the section's `keep_ratio` of
  each batch's groups, those with the largest in-group score std (`by="std"`) or the
  smallest (`"std_rev"`); the others' loss masks are zeroed (`data.filter_groups`). Logs
  `rollout/filter_kept_frac`, `rollout/in_group_std`, `rollout/kept_in_group_std`.
  Evaluation measures every episode.

  Args:
    inner: the wrapped source.
    section: the share of groups kept and by what.
  """

  section: FilterSection

  def _call(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Any
  ) -> TrajectoryBatch:
    batch = self.inner(context, training_input, mode)
    if mode != Mode.TRAIN:
      return batch
    batch, stats = filter_groups(batch, self.section.keep_ratio, self.section.by == "std_rev")
    names = {"kept_frac": "filter_kept_frac"}
    buffer_rollout_stats(context, {names.get(k, k): v for k, v in stats.items()}, mode)
    return batch
