"""What a trajectory source is handed each step: the cluster and the algorithm's config.

A `TrajectorySource` is called as `source(context, training_input, mode)` and returns a
`TrajectoryBatch`. `context` is a `RolloutContext`: the `RLCluster` (rollout engine,
tokenizer, meshes, rollout configs, `buffer_metrics`) and the algorithm config (the
learner's `algo_config`, e.g. `num_generations`). The learner is not handed over, so a
source (the multi-turn rollout among them) depends on these two and nothing else; the
learner itself has both attributes, so code that calls a source with a learner still works.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from tunix.rl import rl_cluster as rl_cluster_lib

from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch

Mode = rl_cluster_lib.Mode


@dataclasses.dataclass(frozen=True)
class RolloutContext:
  """The cluster and the algorithm config a trajectory source samples with."""

  rl_cluster: rl_cluster_lib.RLCluster
  algo_config: Any  # the learner's PpoExtConfig (a tunix PPOConfig)


class TrajectorySource(Protocol):
  """Builds a `TrajectoryBatch` for one batch of training input (e.g. a multi-turn rollout)."""

  def __call__(
    self, context: RolloutContext, training_input: dict[str, Any], mode: Mode
  ) -> TrajectoryBatch: ...
