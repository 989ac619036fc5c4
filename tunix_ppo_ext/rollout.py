"""Multi-turn rollouts: episodes of text environments through tunix's rollout engine, and
the trajectory sources that wrap them.

`MultiTurnRollout` plays episodes turn by turn and hands `PpoExtLearner` token-exact
trajectories (attention mask = every real token, loss mask = agent tokens only). The
wrappers (`OverlongPenalty`, `DynamicSampling`, `ScoreShaping`, `GroupFilter`,
`ValidationEpisodes`, `ObservationsInLoss`; any `SourceWrapper` subclass of your own) are
trajectory sources around another source, stacked from Python; their checkpointed state is
the wrapped rollout's.
"""

from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.tunix.rollout.agentic_envs import TunixEnv
from tunix_ppo_ext._src.tunix.rollout.multi_turn import Mode, MultiTurnRollout
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
  "CharTokenizer",
  "DynamicSampling",
  "GroupFilter",
  "Mode",
  "MultiTurnRollout",
  "ObservationsInLoss",
  "OverlongPenalty",
  "ScoreShaping",
  "SourceWrapper",
  "TunixEnv",
  "ValidationEpisodes",
  "buffer_rollout_stats",
]
