"""Multi-turn rollouts: episodes of text environments through tunix's rollout engine, and
the trajectory sources that wrap them.

`MultiTurnRollout` plays episodes turn by turn and hands `PpoExtLearner` token-exact
trajectories (attention mask = every real token, loss mask = agent tokens only). The
wrappers (`OverlongPenalty`, `DynamicSampling`, `ScoreShaping`, `GroupFilter`,
`ValidationEpisodes`, `ObservationsInLoss`; any `SourceWrapper` subclass of your own) are
trajectory sources around another source, stacked from Python; their checkpointed state is
the wrapped rollout's. A source is called as `source(context, training_input, mode)` with
a `RolloutContext` (the cluster and the algorithm config), never the learner itself.
"""

from tunix_ppo_ext._src.tunix.rollout.agentic_envs import TunixEnv
from tunix_ppo_ext._src.tunix.rollout.context import Mode, RolloutContext, TrajectorySource
from tunix_ppo_ext._src.tunix.rollout.multi_turn import MultiTurnRollout
from tunix_ppo_ext._src.tunix.rollout.sources import (
  DynamicSampling,
  GroupFilter,
  ObservationsInLoss,
  OverlongPenalty,
  ScoreShaping,
  SourceWrapper,
  ValidationEpisodes,
  buffer_rollout_stats,
)

__all__ = [
  "DynamicSampling",
  "GroupFilter",
  "Mode",
  "MultiTurnRollout",
  "ObservationsInLoss",
  "OverlongPenalty",
  "RolloutContext",
  "ScoreShaping",
  "SourceWrapper",
  "TrajectorySource",
  "TunixEnv",
  "ValidationEpisodes",
  "buffer_rollout_stats",
]
