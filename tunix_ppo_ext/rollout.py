"""Multi-turn rollouts: episodes of text environments through tunix's rollout engine, and
the trajectory sources that wrap them.

`MultiTurnRollout` plays episodes turn by turn and hands `PpoExtLearner` token-exact
trajectories (attention mask = every real token, loss mask = agent tokens only). The
wrappers (`OverlongPenalty`, `DynamicSampling`, `ScoreShaping`, `GroupFilter`,
`ValidationEpisodes`, `ObservationsInLoss`; any `SourceWrapper` subclass of your own) are
trajectory sources around another source, stacked from Python, each configured by its run
config section (`ShapingSection`, `FilterSection`, `OverlongBufferSection`,
`FilterGroupsSection`: checked when built); their checkpointed state is the wrapped
rollout's. A source is called as `source(context, training_input, mode)` with
a `RolloutContext` (the cluster and the algorithm config), never the learner itself.
`ContinuingSampler` is the sampler the rollout plays turns with: tunix's `Sampler`,
continued from its own KV cache turn after turn (`Conversation`, one `TurnSampling` and
one `TurnOutput` a turn).
"""

from tunix_ppo_ext._src.config.rollout_sections import (
  FilterGroupsSection,
  FilterSection,
  OverlongBufferSection,
  ShapingSection,
)
from tunix_ppo_ext._src.tunix.rollout.agentic_envs import TunixEnv
from tunix_ppo_ext._src.tunix.rollout.context import Mode, RolloutContext, TrajectorySource
from tunix_ppo_ext._src.tunix.rollout.continuing_sampler import (
  ContinuingSampler,
  Conversation,
  TurnOutput,
  TurnSampling,
)
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
  "ContinuingSampler",
  "Conversation",
  "DynamicSampling",
  "FilterGroupsSection",
  "FilterSection",
  "GroupFilter",
  "Mode",
  "MultiTurnRollout",
  "ObservationsInLoss",
  "OverlongBufferSection",
  "OverlongPenalty",
  "RolloutContext",
  "ScoreShaping",
  "ShapingSection",
  "SourceWrapper",
  "TrajectorySource",
  "TunixEnv",
  "TurnOutput",
  "TurnSampling",
  "ValidationEpisodes",
  "buffer_rollout_stats",
]
