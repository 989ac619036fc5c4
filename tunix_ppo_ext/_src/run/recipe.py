"""The training recipe around the PPO math: the run config's `optim`, `batch` and `sampling`
sections, their checks, and what they become for tunix.

- `optim.actor` / `optim.critic`: `tunix.optimizers.OptimizerSpec` each (Adam/AdamW,
  global-norm clipping, schedule with warm-up); the peak rates stay `train.lr` /
  `train.critic_lr`.
- `batch`: mini-batch and micro-batch sizes in *episodes* (the unit of `train.batch_size`);
  tunix counts prompts, so each must be a multiple of `ppo.num_generations` and is divided
  by it (`BatchPlan.tunix_sizes`). PPO epochs are `ppo.num_iterations`.
- `envs`: several environments in one run, each with its number of groups (`EnvEntry`).
- `validation`: evaluation's own environment(s), seeds and group size.
- `shaping`: episode-score normalization and the format penalty before any estimator
  (`data.shaping`).
- `sampling`: top-p / top-k of training rollouts and the temperature, top-p and top-k of
  evaluation rollouts (None: as in training).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import numpy as np
import optax

from tunix_ppo_ext._src.checks import (
  ConfigError,
  check_integer,
  whole_share,
)
from tunix_ppo_ext._src.config.recipe_sections import (
  BatchSection,
  EnvEntry,
  OptimSection,
  SamplingSection,
  ValidationSection,
)
from tunix_ppo_ext._src.config.rollout_sections import FilterSection, ShapingSection
from tunix_ppo_ext._src.config.run_sections import RunConfig
from tunix_ppo_ext._src.data.trajectory import SEED_KEY, VAL_ENV_KEY, VAL_SEED_KEY, spread_env_ids
from tunix_ppo_ext._src.envs.base import EnvSpec
from tunix_ppo_ext._src.optim.optimizers import build_optimizer
from tunix_ppo_ext._src.run.dapo_section import DapoSection, dapo_source
from tunix_ppo_ext._src.tunix.rollout.sources import GroupFilter, ScoreShaping, ValidationEpisodes


def validate_env_entries(key: str, entries: list[EnvEntry], group_size: int, rows: int) -> None:
  """Each entry with a unique tag (its name and `groups`: the entry's own checks; whether
  it builds: `run_config.resolve`, which builds each environment once); the groups of
  `group_size` episodes filling the `rows` episodes of a batch. ConfigError naming
  `key[i].<field>` and the sum."""
  tags: dict[str, int] = {}
  for i, entry in enumerate(entries):
    where = f"{key}[{i}]"
    tag = entry_tag(entry)
    if tag in tags:
      raise ConfigError(
        f"config key '{where}.tag'={tag!r} is also {key}[{tags[tag]}]'s: each environment needs "
        "its own tag (its metrics' name)"
      )
    tags[tag] = i
  groups = sum(entry.groups for entry in entries)
  if entries and groups * group_size != rows:
    counts = " + ".join(str(entry.groups) for entry in entries)
    raise ConfigError(
      f"config key '{key}': {counts} = {groups} groups x {group_size} episodes = "
      f"{groups * group_size} episodes, but a batch holds {rows} (train.batch_size): the "
      f"groups must add up to {rows} / {group_size} = {rows / group_size:g}"
    )


def entry_tag(entry: EnvEntry) -> str:
  """The entry's metric tag: `tag`, else `name`."""
  return entry.tag or str(entry.name)


def env_specs(entries: list[EnvEntry]) -> list[EnvSpec]:
  """The rollout's `EnvSpec`s of `entries`."""
  return [EnvSpec(str(e.name), dict(e.kwargs), tag=entry_tag(e)) for e in entries]


def entry_env_ids(entries: list[EnvEntry]) -> np.ndarray | None:
  """`[sum(groups)]` environment index per group (`spread_env_ids`); None for no entries."""
  return spread_env_ids([e.groups for e in entries]) if entries else None


def validate_filter(section: FilterSection, chunk: int, num_generations: int) -> None:
  """`keep_ratio` keeping a whole number of the `chunk / num_generations` groups each
  rollout chunk holds (its range and `by`: the section's own checks). ValueError explaining
  the sums."""
  groups = chunk // num_generations
  if whole_share(section.keep_ratio, groups) is None:
    raise ConfigError(
      f"config key 'filter.keep_ratio'={section.keep_ratio} keeps {section.keep_ratio} x "
      f"{groups} groups = {section.keep_ratio * groups:g}, not a whole number: the learner "
      f"receives rollouts in chunks of {chunk} episodes (train.batch_size, or the batch "
      f"section's micro-batches) = {groups} groups of ppo.num_generations={num_generations}"
    )


def validate_validation(
  section: ValidationSection, batch_size: int, chunk: int, num_generations: int
) -> None:
  """`group_size` dividing the evaluation batch and its rollout chunks, `envs` filling the
  batch (each key's own range: the section's checks; whether its environments build:
  `run_config.resolve`)."""
  group = section.group_size or num_generations
  if section.group_size is not None:
    batch = f"batch of train.batch_size={batch_size}"
    for what, rows in ((batch, batch_size), (f"chunk of {chunk}", chunk)):
      if rows % section.group_size:
        raise ConfigError(
          f"config key 'validation.group_size'={section.group_size} must divide the evaluation "
          f"{what} episodes: {rows} / {section.group_size} = {rows / section.group_size:g} "
          "groups (chunks: the batch section's rollout / log-prob micro-batches)"
        )
  validate_env_entries("validation.envs", section.envs, group, batch_size)


def validation_seeds(section: ValidationSection, rows: int, group_size: int) -> np.ndarray:
  """`[rows]` episode seeds: `rows / group_size` seeds from `section.seed`, each repeated
  `group_size` times (the same set at every evaluation)."""
  rng = np.random.default_rng(section.seed)
  seeds = rng.integers(0, 2**31 - 1, size=rows // group_size, dtype=np.int64)
  return np.repeat(seeds, group_size)


def validation_entries(
  section: ValidationSection, train_entries: list[EnvEntry], num_generations: int
) -> list[EnvEntry]:
  """The validation environments: `validation.envs`; else, when validation keeps a mixed
  run's training environments (`train_entries`, the `envs` key), those with their episodes
  in groups of `validation.group_size`; else none (one environment). ValueError when a
  training environment's episodes do not divide into such groups."""
  if section.envs or section.env is not None or section.kwargs is not None:
    return list(section.envs)
  group = section.group_size or num_generations
  regrouped = []
  for i, entry in enumerate(train_entries):
    episodes = entry.groups * num_generations
    if episodes % group:
      raise ConfigError(
        f"config key 'validation.group_size'={group} must divide envs[{i}]'s {entry.groups} "
        f"x {num_generations} = {episodes} episodes per batch (or give validation.envs)"
      )
    regrouped.append(dataclasses.replace(entry, groups=episodes // group))
  return regrouped


def validation_batches(
  section: ValidationSection,
  entries: list[EnvEntry],
  num_batches: int,
  batch_size: int,
  num_generations: int,
  seed: int,
) -> list[dict[str, np.ndarray]]:
  """The evaluation dataset of a custom `validation`: `num_batches` inputs of
  `batch_size / num_generations` prompts (tunix repeats each `num_generations` times), each
  carrying its copies' validation episodes as `[P, num_generations]` leaves: `validation_seed`
  (`validation_seeds` from `section.seed`, else `seed`; groups of `group_size`) and
  `validation_env` (which of `entries`, `spread_env_ids` within each batch). tunix's rollout
  chunks hold whole prompts, so a chunk's row `i` is copy `i % num_generations`."""
  group = section.group_size or num_generations
  base = section.seed if section.seed is not None else seed
  rows = num_batches * batch_size
  seeds = validation_seeds(dataclasses.replace(section, seed=base), rows, group)
  envs = entry_env_ids(entries)
  per_batch = np.zeros(batch_size, np.int64) if envs is None else np.repeat(envs, group)
  shape = (batch_size // num_generations, num_generations)
  return [
    {
      "prompts": seeds[b * batch_size : (b + 1) * batch_size : num_generations].astype(str),
      SEED_KEY: seeds[b * batch_size : (b + 1) * batch_size : num_generations],
      VAL_SEED_KEY: seeds[b * batch_size : (b + 1) * batch_size].reshape(shape),
      VAL_ENV_KEY: per_batch.reshape(shape),
    }
    for b in range(num_batches)
  ]


def validate_optim(section: OptimSection, steps: int) -> None:
  """Each optimizer's keys, by name (`optim.actor.<key>`, `optim.critic.<key>`); a warning
  for a warm-up of at least the run's `steps` updates (the peak rate is never reached)."""
  for role, spec in (("actor", section.actor), ("critic", section.critic)):
    spec.validate(f"optim.{role}")
    if spec.warmup_steps >= steps:
      warnings.warn(
        f"optim.{role}.warmup_steps={spec.warmup_steps} is not below train.steps={steps}: "
        f"the {role}'s learning rate never reaches its peak",
        stacklevel=2,
      )


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """Every batch size of a run in episodes, each filled once (`resolve_batch`).

  `batch_size`: episodes a training batch (`train.batch_size`); `mini_batch_size`:
  episodes an optimizer update (default: the batch); `train_micro_batch_size`: episodes a
  forward/backward pass (default: the mini-batch); `rollout_micro_batch_size`: episodes a
  rollout call plays (tunix's default: the train micro-batch); `rollout_chunk`: episodes
  the learner receives at once, tunix's `lcm(rollout, log-prob micro-batch)` (the log-prob
  one defaulting to the train micro-batch there); `logps_micro_batch_size`: rows a log-prob
  or value pass sees (default: the whole chunk, as the learner's passes run unchunked);
  `accumulation`: passes per update when a micro-batch is set (tunix then wraps the
  optimizer in `optax.MultiSteps`), else None; `tunix_sizes`: the sizes the config set,
  in tunix's unit (prompts), as `ClusterSpec` fields (unset: tunix's own default,
  which also decides how tunix logs a step's metrics).
  """

  batch_size: int
  mini_batch_size: int
  train_micro_batch_size: int
  rollout_micro_batch_size: int
  rollout_chunk: int
  logps_micro_batch_size: int
  accumulation: int | None
  tunix_sizes: dict[str, int]

  @property
  def updates_per_epoch(self) -> int:
    """Optimizer updates per pass over a batch: its mini-batches."""
    return self.batch_size // self.mini_batch_size


def resolve_batch(section: BatchSection, batch_size: int, num_generations: int) -> BatchPlan:
  """The run's `BatchPlan`, checked: each size set a multiple of `num_generations` (tunix
  keeps a prompt's samples together) dividing what contains it. ConfigError explaining
  the sums."""
  given = _given_sizes(section, batch_size)
  for key, value in given.items():
    if value % num_generations:
      raise ConfigError(
        f"config key 'batch.{key}'={value} episodes must be a multiple of "
        f"ppo.num_generations={num_generations}: tunix splits batches by prompt, and each "
        f"prompt brings its {num_generations} samples"
      )
  mini = given.get("mini_batch_size", batch_size)
  micro = given.get("train_micro_batch_size", mini)
  rollout = given.get("rollout_micro_batch_size", micro)
  chunk = math.lcm(rollout, given.get("logps_micro_batch_size", micro))
  return BatchPlan(
    batch_size=batch_size,
    mini_batch_size=mini,
    train_micro_batch_size=micro,
    rollout_micro_batch_size=rollout,
    rollout_chunk=chunk,
    logps_micro_batch_size=given.get("logps_micro_batch_size", chunk),
    accumulation=mini // micro if "train_micro_batch_size" in given else None,
    tunix_sizes={key: value // num_generations for key, value in given.items()},
  )


def _given_sizes(section: BatchSection, batch_size: int) -> dict[str, int]:
  """The sizes the section sets, checked and in episodes (gradient accumulation as the
  micro-batch it implies; a micro-batch also sets the mini-batch); absent: unset."""
  for key in BatchSection.__dataclass_fields__:
    value = getattr(section, key)
    if value is not None:
      check_integer(f"config key 'batch.{key}'", value, low=1)
  mini = section.mini_batch_size or batch_size
  _divides("batch.mini_batch_size", mini, "train.batch_size", batch_size, "updates per epoch")
  micro = section.train_micro_batch_size
  if section.gradient_accumulation_steps is not None:
    if micro is not None:
      raise ConfigError(
        "config keys 'batch.train_micro_batch_size' and 'batch.gradient_accumulation_steps' "
        "say the same thing (accumulation = mini_batch_size / train_micro_batch_size): give one"
      )
    steps = section.gradient_accumulation_steps
    if mini % steps:
      raise ConfigError(
        f"config key 'batch.gradient_accumulation_steps'={steps} must divide the mini-batch of "
        f"{mini} episodes (each pass takes mini_batch_size / gradient_accumulation_steps)"
      )
    micro = mini // steps
  # tunix's default (None) when unset: a mini-batch changes how tunix logs a step's metrics
  sizes = {"mini_batch_size": mini} if section.mini_batch_size or micro else {}
  if micro is not None:
    _divides("batch.train_micro_batch_size", micro, "the mini-batch", mini, "accumulated passes")
    sizes["train_micro_batch_size"] = micro
  for key in ("rollout_micro_batch_size", "logps_micro_batch_size"):
    value = getattr(section, key)
    if value is not None:
      _divides(f"batch.{key}", value, "train.batch_size", batch_size, "chunks")
      sizes[key] = value
  return sizes


def _divides(key: str, part: int, whole_name: str, whole: int, what: str) -> None:
  if whole % part:
    raise ConfigError(
      f"config key {key!r}={part} must divide {whole_name}={whole}: {whole} / {part} = "
      f"{whole / part:g} {what}, not a whole number"
    )


def optimizers(
  section: OptimSection, lr: float, critic_lr: float, total_steps: int
) -> tuple[optax.GradientTransformation, optax.GradientTransformation]:
  """`(actor, critic)` optimizers of the section at peaks `lr` / `critic_lr`, guarded."""
  return (
    build_optimizer(section.actor, lr, total_steps),
    build_optimizer(section.critic, critic_lr, total_steps),
  )


def check_top_k(section: SamplingSection, vocab: int) -> None:
  """Refuses a `top_k` above the model's vocabulary (`vocab` ids), naming the key."""
  for key, value in (("top_k", section.top_k), ("eval_top_k", section.eval_top_k)):
    if value and value > vocab:
      raise ConfigError(
        f"config key 'sampling.{key}'={value} is larger than the model's vocabulary "
        f"({vocab} ids): use at most {vocab}, or 0 for no top-k"
      )


def sampling_kwargs(section: SamplingSection) -> tuple[dict[str, Any], dict[str, Any]]:
  """`(sampling, eval_sampling)` for `ClusterSpec`: training's top-p/top-k, and what
  evaluation changes (empty: evaluation samples as training does)."""
  train = {"top_p": section.top_p, "top_k": section.top_k or None}
  evaluation: dict[str, Any] = {}
  if section.eval_temperature is not None:
    evaluation["temperature"] = section.eval_temperature
  if section.eval_top_p is not None:
    evaluation["top_p"] = section.eval_top_p
  if section.eval_top_k is not None:
    evaluation["top_k"] = section.eval_top_k or None
  return train, evaluation


@dataclasses.dataclass(frozen=True)
class RecipePlan:
  """The recipe sections of a run worked out once (`resolve_recipe`): the batch sizes, the
  validation entries, the rollouts' environment specs, the optimizers and the sampling
  settings of training (`sampling`) and of evaluation (`eval_sampling`: what it changes)."""

  batch: BatchPlan
  validation_entries: tuple[EnvEntry, ...]
  rollout_envs: tuple[EnvSpec, ...]
  validation_envs: tuple[EnvSpec, ...]
  optimizers: tuple[optax.GradientTransformation, optax.GradientTransformation]
  sampling: dict[str, Any]
  eval_sampling: dict[str, Any]


def resolve_recipe(run: RunConfig, num_generations: int) -> RecipePlan:
  """Checks the recipe sections of `run` against each other and the batch (the environment
  mix's groups, the optimizers' schedules, the batch arithmetic, filtering, validation)
  and works them out once, for groups of `num_generations` episodes."""
  train = run.train
  validate_env_entries("envs", run.envs, num_generations, train.batch_size)
  validate_optim(run.optim, train.steps)
  batch = resolve_batch(run.batch, train.batch_size, num_generations)
  validate_filter(run.filter, batch.rollout_chunk, num_generations)
  validate_validation(run.validation, train.batch_size, batch.rollout_chunk, num_generations)
  validation = validation_entries(run.validation, run.envs, num_generations)
  sampling, eval_sampling = sampling_kwargs(run.sampling)
  return RecipePlan(
    batch=batch,
    validation_entries=tuple(validation),
    rollout_envs=tuple(env_specs(run.envs)),
    validation_envs=tuple(env_specs(validation)),
    optimizers=optimizers(run.optim, train.lr, train.critic_lr, train.steps),
    sampling=sampling,
    eval_sampling=eval_sampling,
  )


def wrapped_source(
  source: Any,
  evaluation: Any,
  validation: ValidationSection,
  dapo: DapoSection,
  budget: int,
  shaping: ShapingSection,
  groups: FilterSection,
) -> Any:
  """The training rollout `source` wrapped, in order, by what the sections turn on (each
  left out when off; all off: `source` itself).

  Args:
    source: the training rollout.
    evaluation: the `validation` section's own rollout (its environment(s), group size),
      which evaluation plays on the rows' `validation_batches` episodes
      (`ValidationEpisodes`) unless the section is the default.
    validation: the `validation` section.
    dapo: the `dapo` section (`dapo_section.dapo_source`, over `budget` agent tokens).
    budget: the most agent tokens an episode holds.
    shaping: the `shaping` section (`ScoreShaping`: normalization, format penalty).
    groups: the `filter` section (`GroupFilter`; `keep_ratio` 1.0: off).

  Returns:
    The wrapped source.
  """
  if not validation.is_default():
    source = ValidationEpisodes(source, evaluation)
  source = dapo_source(source, dapo, budget)
  if shaping.is_on():
    source = ScoreShaping(source, shaping)
  if groups.keep_ratio < 1.0:
    source = GroupFilter(source, groups)
  return source
