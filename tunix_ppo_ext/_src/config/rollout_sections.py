"""The config sections of the trajectory-source wrappers, each field checked beside it.

- `ShapingSection` (`shaping`): `ScoreShaping`'s score normalization and format penalty.
- `FilterSection` (`filter`): `GroupFilter`'s share of groups kept.
- `OverlongBufferSection` (`dapo.overlong_buffer`): `OverlongPenalty`'s soft overlong
  punishment (DAPO, Yu et al. 2025, arXiv:2503.14476, eq. 13).
- `FilterGroupsSection` (`dapo.filter_groups`): `DynamicSampling`'s rounds.

A run config builds each from its YAML section; a Python user builds one and hands it to
its wrapper (`tunix_ppo_ext.rollout`), which checks nothing again. A bad value is one
`ConfigError` line naming the key (`keys`: how a message names it).
"""

from __future__ import annotations

import dataclasses

from tunix_ppo_ext._src.checks import (
  ConfigError,
  FieldKeys,
  check_choice,
  check_integer,
  check_number,
)
from tunix_ppo_ext._src.names import GROUPINGS, SCORE_METRICS, SCORE_NORMALIZATIONS

FILTER_BY = ("std", "std_rev")  # `FilterSection.by`: the widest groups kept, or the narrowest


@dataclasses.dataclass
class ShapingSection:
  """Episode scores normalized before the estimator: `method` (`identity`, `mean`,
  `mean_std`, `asym_clip`) within `grouping` (`group`, `batch`, `state`); then
  `format_penalty` (<= 0, GRL's sign) added to the reward of every turn the environment
  flagged malformed (`info["invalid_action"]`)."""

  grouping: str = "group"
  method: str = "identity"
  eps: float = 1e-6
  format_penalty: float = 0.0
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    keys = keys or FieldKeys(prefix="shaping.")
    for key, choices in (("grouping", GROUPINGS), ("method", SCORE_NORMALIZATIONS)):
      check_choice(keys.subject(key), getattr(self, key), choices)
    check_number(keys.subject("eps"), self.eps, low=0.0, low_open=True)
    if self.format_penalty > 0:
      raise ConfigError(
        f"{keys.subject('format_penalty')}={self.format_penalty} must be <= 0: it is added "
        f"to a malformed turn's reward (GRL's sign: -0.1 takes 0.1 off)"
      )
    check_number(keys.subject("format_penalty"), self.format_penalty)

  def is_on(self) -> bool:
    """Whether the section changes any score (else its wrapper is left out)."""
    return self.method != "identity" or self.format_penalty != 0.0


@dataclasses.dataclass
class FilterSection:
  """Rollout filtering: keep `keep_ratio` of each rollout chunk's groups, those with the
  largest in-group score std (`by: std`) or the smallest (`std_rev`); 1.0: off."""

  keep_ratio: float = 1.0
  by: str = "std"
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    keys = keys or FieldKeys(prefix="filter.")
    check_number(keys.subject("keep_ratio"), self.keep_ratio, 0.0, 1.0, low_open=True)
    check_choice(keys.subject("by"), self.by, FILTER_BY)


@dataclasses.dataclass
class OverlongBufferSection:
  """Soft overlong punishment (DAPO eq. 13): `-penalty_factor * (n - (L_max - len)) / len`
  for an episode of `n` agent tokens in the last `len` of the budget `L_max`."""

  enable: bool = False
  len: int = 4
  penalty_factor: float = 1.0
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    keys = keys or FieldKeys(prefix="dapo.overlong_buffer.")
    check_integer(keys.subject("len"), self.len, low=1)
    check_number(keys.subject("penalty_factor"), self.penalty_factor, low=0.0)


@dataclasses.dataclass
class FilterGroupsSection:
  """Dynamic sampling: groups whose `metric` scores are all equal are dropped and new
  rounds generated, `max_num_gen_batches` rounds at most per rollout chunk (the first
  included; verl's 0, unlimited, is refused: a run must not hang on a task it always or
  never solves)."""

  enable: bool = False
  metric: str = "seq_reward"
  max_num_gen_batches: int = 4
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    keys = keys or FieldKeys(prefix="dapo.filter_groups.")
    check_choice(keys.subject("metric"), self.metric, SCORE_METRICS)
    check_integer(keys.subject("max_num_gen_batches"), self.max_num_gen_batches, low=1)
