"""`ClusterSpec`: every plain setting of a tunix `RLCluster`, resolved once.

`build_cluster` takes it beside the objects a cluster holds (models, tokenizer, meshes,
optimizers, metric sinks, directories); a run's spec comes from `resolve`
(`ResolvedRun.cluster`), a Python user writes one directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tunix_ppo_ext._src.checks import ConfigError


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
  """The settings of tunix's `RLTrainingConfig` and `RolloutConfig` that are plain values.

  Attributes:
    max_steps: optimizer updates of the run (tunix's `max_steps`).
    batch: prompts per global step (checks that the mini-batch divides it).
    max_prompt_length: prompt tokens the sampler takes.
    max_tokens_to_generate: tokens one engine call may generate (the KV cache holds the
      prompt and these).
    lr: the default actor optimizer's learning rate (guarded Adam).
    critic_lr: the default critic optimizer's (None: `lr`).
    mini_batch_size, train_micro_batch_size, rollout_micro_batch_size,
      logps_micro_batch_size: tunix's batch sizes, in prompts (None: tunix's default).
    checkpoint_every: steps between checkpoints (two kept).
    eval_every: steps between evaluations.
    temperature: training rollouts' sampling temperature (0: greedy).
    seed: the sampler's seed.
    return_logprobs: whether the sampler returns its tokens' log-probs.
    sampling: training rollouts' `top_p` / `top_k`.
    eval_sampling: what evaluation rollouts change (`temperature`, `top_p`, `top_k`);
      empty or None: they sample as training does.
  """

  max_steps: int
  batch: int
  max_prompt_length: int
  max_tokens_to_generate: int
  lr: float = 1e-3
  critic_lr: float | None = None
  mini_batch_size: int | None = None
  train_micro_batch_size: int | None = None
  rollout_micro_batch_size: int | None = None
  logps_micro_batch_size: int | None = None
  checkpoint_every: int = 1
  eval_every: int = 10**9
  temperature: float = 1.0
  seed: int = 0
  return_logprobs: bool = False
  sampling: Mapping[str, Any] | None = None
  eval_sampling: Mapping[str, Any] | None = None

  def __post_init__(self) -> None:
    if self.mini_batch_size is not None and self.batch % self.mini_batch_size:
      raise ConfigError(
        f"batch={self.batch} is not a multiple of mini_batch_size={self.mini_batch_size}"
      )
