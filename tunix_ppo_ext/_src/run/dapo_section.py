"""The run config's `dapo` section: DAPO's overlong reward shaping and dynamic sampling (Yu
et al. 2025, arXiv:2503.14476) around the training rollouts, with verl's key names.

  dapo:
    overlong_buffer:      # verl's reward_model.overlong_buffer
      enable: false
      len: 4              # L_cache: the last `len` agent tokens of the budget are penalized
      penalty_factor: 1.0
    filter_groups:        # verl's algorithm.filter_groups
      enable: false
      metric: seq_reward  # or episode_return
      max_num_gen_batches: 4

The budget (DAPO's L_max, verl's max response length) is the most agent tokens an episode
can hold: `min(env.max_completion_len, env.max_turns * env.max_tokens_per_turn)`
(`agent_token_budget`); single-turn, that is the response budget. Both act on training
rollouts only: evaluation measures the environment's rewards. Order: the rollout, the
overlong penalty, dynamic sampling (judging scores with the penalty, as verl's
`seq_reward`), then the `shaping` and `filter` sections.
"""

from __future__ import annotations

from typing import Any

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.config.recipe_sections import DapoSection
from tunix_ppo_ext._src.tunix.rollout.sources import (
  DynamicSampling,
  OverlongPenalty,
  check_overlong_budget,
)

# where a run's budget comes from, as the overlong buffer's check names it
BUDGET_SOURCE = "min(env.max_completion_len, env.max_turns * env.max_tokens_per_turn)"


def agent_token_budget(max_completion_len: int, max_turns: int, max_tokens_per_turn: int) -> int:
  """The most agent tokens an episode can hold (each turn samples at most
  `max_tokens_per_turn`, its EOS included; the completion is cut at `max_completion_len`)."""
  return min(max_completion_len, max_turns * max_tokens_per_turn)


def validate_dapo(section: DapoSection, budget: int, num_generations: int) -> None:
  """The buffer within the `budget` of agent tokens, and dynamic sampling only with groups
  (`ppo.num_generations` >= 2: groups of one are always kept); each key's own range: its
  section's checks."""
  over, groups = section.overlong_buffer, section.filter_groups
  if over.enable:
    check_overlong_budget(over, budget, BUDGET_SOURCE)
  if groups.enable and num_generations < 2:
    raise ConfigError(
      f"config key 'dapo.filter_groups.enable'=True needs groups: ppo.num_generations="
      f"{num_generations} makes groups of one, which dynamic sampling always keeps"
    )


def dapo_source(source: Any, section: DapoSection, budget: int) -> Any:
  """`source` wrapped in `OverlongPenalty`, then `DynamicSampling` (each only when enabled;
  neither: `source` itself), so dynamic sampling judges scores with the penalty."""
  if section.overlong_buffer.enable:
    source = OverlongPenalty(source, budget, section.overlong_buffer)
  if section.filter_groups.enable:
    source = DynamicSampling(source, section.filter_groups)
  return source
