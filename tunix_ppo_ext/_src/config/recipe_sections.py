"""The run config's sections for the optimizers, the batch arithmetic, sampling, the
environment mix, validation and DAPO (`optim`, `batch`, `sampling`, `envs`, `validation`,
`dapo`), each field checked beside it (stdlib only: a config file is checked without JAX).
What they mean for a run is worked out in `tunix_ppo_ext._src.run.recipe` and
`tunix_ppo_ext._src.run.dapo_section`; the optimizers are built by
`tunix_ppo_ext._src.optim.optimizers`."""

from __future__ import annotations

import dataclasses
from typing import Any

from tunix_ppo_ext._src.checks import (
  ConfigError,
  FieldKeys,
  check_choice,
  check_integer,
  check_number,
)
from tunix_ppo_ext._src.config.rollout_sections import FilterGroupsSection, OverlongBufferSection

OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "linear", "cosine")


@dataclasses.dataclass
class OptimizerSpec:
  """One trainer's optimizer (`optim.actor` / `optim.critic` of a run config).

  `name`: `adam` or `adamw` (decoupled `weight_decay`, which plain `adam` refuses);
  `b1`, `b2`, `eps`: Adam's moment decays and epsilon; `clip_grad_norm`: clip the global
  gradient norm to this before the update (None: no clipping); `schedule`, `warmup_steps`
  (optimizer updates) and `min_lr_ratio` (the final learning rate of `linear`/`cosine` as a
  fraction of the peak): see the module docstring. The peak learning rate is
  `train.lr` / `train.critic_lr`.
  """

  name: str = "adam"
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  clip_grad_norm: float | None = None
  schedule: str = "constant"
  warmup_steps: int = 0
  min_lr_ratio: float = 0.0

  def validate(self, where: str) -> None:
    """ValueError naming `<where>.<key>` and the bad value."""
    check_choice(f"config key '{where}.name'", self.name, OPTIMIZERS)
    check_choice(f"config key '{where}.schedule'", self.schedule, SCHEDULES)
    check_number(f"config key '{where}.weight_decay'", self.weight_decay, low=0.0)
    if self.name == "adam" and self.weight_decay:
      raise ConfigError(
        f"config key '{where}.weight_decay'={self.weight_decay} needs '{where}.name'=adamw "
        "(decoupled weight decay); plain adam has none"
      )
    for key in ("b1", "b2"):
      check_number(
        f"config key '{where}.{key}'", getattr(self, key), low=0.0, high=1.0, high_open=True
      )
    check_number(f"config key '{where}.eps'", self.eps, low=0.0, low_open=True)
    if self.clip_grad_norm is not None:
      check_number(
        f"config key '{where}.clip_grad_norm'", self.clip_grad_norm, low=0.0, low_open=True
      )
    check_integer(f"config key '{where}.warmup_steps'", self.warmup_steps, low=0)
    check_number(f"config key '{where}.min_lr_ratio'", self.min_lr_ratio, low=0.0, high=1.0)


@dataclasses.dataclass
class OptimSection:
  """The actor's and the critic's optimizers (see `OptimizerSpec`).

  The embedded default's actor decays its learning rate along a cosine to a tenth of
  `train.lr` over `train.steps` (with the constant rate, 2 of 5 seeds of the default reached
  0.9 of the maximum; with the decay, 4 of 5 and no drop from the peak: README, "Measured").
  """

  actor: OptimizerSpec = dataclasses.field(
    default_factory=lambda: OptimizerSpec(schedule="cosine", min_lr_ratio=0.1)
  )
  critic: OptimizerSpec = dataclasses.field(default_factory=OptimizerSpec)


@dataclasses.dataclass
class BatchSection:
  """Batch arithmetic, in episodes (None: the whole `train.batch_size`).

  `mini_batch_size`: episodes per optimizer update (tunix rolls out and trains each
  mini-batch in turn, so a batch of B makes B / mini_batch_size updates per epoch);
  `train_micro_batch_size`: episodes per forward/backward pass, gradients accumulated
  over `mini_batch_size / train_micro_batch_size` passes; or give
  `gradient_accumulation_steps` instead and the micro-batch is the mini-batch divided by
  it; `rollout_micro_batch_size` / `logps_micro_batch_size`: episodes per rollout chunk /
  per log-prob (and value) pass. Every optimizer update counts as one of `train.steps`.
  """

  mini_batch_size: int | None = None
  train_micro_batch_size: int | None = None
  gradient_accumulation_steps: int | None = None
  rollout_micro_batch_size: int | None = None
  logps_micro_batch_size: int | None = None


@dataclasses.dataclass
class SamplingSection:
  """Sampling of rollouts: `top_p` in (0, 1], `top_k` (0: off); evaluation's own
  `eval_temperature` (0: greedy), `eval_top_p`, `eval_top_k` (None: training's)."""

  top_p: float = 1.0
  top_k: int = 0
  eval_temperature: float | None = None
  eval_top_p: float | None = None
  eval_top_k: int | None = None
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    keys = keys or FieldKeys(prefix="sampling.")
    name = keys.subject
    check_number(name("top_p"), self.top_p, low=0.0, high=1.0, low_open=True)
    check_integer(name("top_k"), self.top_k, low=0)
    if self.eval_temperature is not None:
      check_number(name("eval_temperature"), self.eval_temperature, low=0.0)
    if self.eval_top_p is not None:
      check_number(name("eval_top_p"), self.eval_top_p, low=0.0, high=1.0, low_open=True)
    if self.eval_top_k is not None:
      check_integer(name("eval_top_k"), self.eval_top_k, low=0)


@dataclasses.dataclass
class EnvEntry:
  """One environment of a mixed run (GRL's `agent_group_num` per agent, RAGEN's
  `n_groups` per tag): `name` (as `env.name`), `kwargs`, `groups` of `ppo.num_generations`
  episodes each (in `validation.envs`: of `validation.group_size`), and `tag`, the name of
  its metrics `{train,eval}/env/<tag>/...` (default: `name`; needed when two entries share
  one). The groups of all entries make up the batch exactly."""

  name: str | None = None
  kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
  groups: int = 1
  tag: str | None = None
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    keys = keys or FieldKeys(owner="EnvEntry")
    if self.name is None:
      raise ConfigError(f"{keys.subject('name')} is required (an environment name)")
    check_integer(keys.subject("groups"), self.groups, low=1)


@dataclasses.dataclass
class ValidationSection:
  """Evaluation episodes of their own (GRL's validation agents): `env` / `kwargs` (None:
  the training environment and its kwargs) or several `envs` (`EnvEntry`s, groups of
  `group_size`), a fixed set of episode seeds drawn from `seed` (None: the run's
  `seed + 1`), and `group_size` episodes per seed (None: `ppo.num_generations`). Sampling:
  the `sampling.eval_*` keys; how often: `train.eval_every`; how many:
  `train.eval_batches` x `train.batch_size` episodes, each batch with its own seeds."""

  env: str | None = None
  kwargs: dict[str, Any] | None = None
  seed: int | None = None
  group_size: int | None = None
  envs: list[EnvEntry] = dataclasses.field(default_factory=list)
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    keys = keys or FieldKeys(prefix="validation.")
    if self.group_size is not None:
      check_integer(keys.subject("group_size"), self.group_size, low=1)
    if self.seed is not None:
      check_integer(keys.subject("seed"), self.seed, low=0)
    if self.envs and (self.env is not None or self.kwargs is not None):
      raise ConfigError(
        f"config keys '{keys.key('envs')}' and '{keys.key('env')}'/'{keys.key('kwargs')}' "
        "both name the validation environment: give one"
      )

  def is_default(self) -> bool:
    return self == ValidationSection()


@dataclasses.dataclass
class DapoSection:
  """DAPO's reward-side pieces (see the module docstring)."""

  overlong_buffer: OverlongBufferSection = dataclasses.field(default_factory=OverlongBufferSection)
  filter_groups: FilterGroupsSection = dataclasses.field(default_factory=FilterGroupsSection)
