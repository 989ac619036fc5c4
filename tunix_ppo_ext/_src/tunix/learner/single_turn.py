"""tunix's single-turn rollout as `PpoExtLearner` runs it without a trajectory source: one
completion per prompt from the cluster's engine, scored by tunix's reward functions (their
reward manager) or the reward model, the score on the completion's last token."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from tunix.generate import utils as generate_utils

from tunix_ppo_ext._src.data.rewards import NonFiniteRewards
from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.learner.role_passes import ModelInputs, RolePasses


@dataclasses.dataclass(frozen=True)
class SingleTurn:
  """The single-turn rollout of `learner` (tunix's `PPOLearner`, set up by tunix's
  constructor: its reward manager, reward-model flag and rollout micro-batch size)."""

  learner: Any
  passes: RolePasses
  nonfinite_rewards: NonFiniteRewards

  def __call__(self, training_input: dict[str, Any], mode: Any) -> TrajectoryBatch:
    """One completion per prompt, its score on the last token."""
    cluster = self.learner.rl_cluster
    rollout_config = cluster.get_rollout_config(mode)
    pad_id = cluster.rollout.pad_id()
    check_prompt_lengths(
      cluster.tokenizer, training_input["prompts"], rollout_config.max_prompt_length
    )
    output = cluster.generate(
      prompts=training_input["prompts"],
      mode=mode,
      micro_batch_size=compat.rollout_micro_batch_size(self.learner),
    )
    width = rollout_config.max_tokens_to_generate
    completion_ids = np.array(
      [generate_utils.pad_to_length(t, width, pad_id, left=False) for t in output.tokens]
    )
    attention = (completion_ids != pad_id).astype(np.int32)
    prompt_ids = np.asarray(output.left_padded_prompt_tokens)
    scores = self._scores(training_input, output.text, prompt_ids, completion_ids, mode)
    last = np.maximum(attention.sum(-1) - 1, 0)
    rewards = np.zeros(completion_ids.shape, np.float32)
    rewards[np.arange(len(scores)), last] = scores
    return TrajectoryBatch(
      prompt_ids=prompt_ids,
      completion_ids=completion_ids,
      attention_mask=attention,
      loss_mask=attention,
      token_rewards=rewards,
      texts=list(output.text),
      truncated=attention.sum(-1) >= width,  # hit the limit
    )

  def _scores(self, training_input, texts, prompt_ids, completion_ids, mode) -> np.ndarray:
    """Float32 scores `[B]` from the reward functions or the reward model."""
    if not compat.uses_reward_model(self.learner):
      extra = {k: v for k, v in training_input.items() if k != "prompts"}
      scores = compat.compute_rewards(
        self.learner, prompts=training_input["prompts"], completions=texts, mode=mode, **extra
      )
      scores = np.asarray(scores, np.float32)  # NaN rows: error, or NaN again to be dropped
      return self.nonfinite_rewards.mark_reported(scores, training_input["prompts"], texts)
    rollout = self.learner.rl_cluster.rollout
    attention = (completion_ids != rollout.pad_id()).astype(np.int32)
    inputs = ModelInputs(
      jnp.asarray(prompt_ids),
      jnp.asarray(completion_ids),
      jnp.asarray(attention),
      jnp.asarray(attention, jnp.float32),
      rollout.pad_id(),
      rollout.eos_id(),
      self.learner.algo_config.logps_temperature,
    )
    scores = self.passes.rewards(inputs)[:, -completion_ids.shape[1] :]
    last = np.maximum(attention.sum(-1) - 1, 0)
    return np.asarray(scores, np.float32)[np.arange(len(last)), last]


def check_prompt_lengths(tokenizer: Any, prompts: Sequence[str], max_prompt_length: int) -> None:
  """ValueError naming the first prompt that is not a string, or is longer than the
  sampler's `max_prompt_length`.

  Counts tokens as tunix's sampler does (BOS + text); tunix would otherwise fail with a
  cache-size error that names neither the prompt nor the setting.
  """
  bos = [tokenizer.bos_id()] if tokenizer.bos_id() else []
  for row, prompt in enumerate(prompts):
    if not isinstance(prompt, str):  # np.str_ is a str
      raise ValueError(
        f"training input 'prompts' row {row} is a {type(prompt).__name__} ({prompt!r:.60}), "
        "not a string: give each batch as a dict of NumPy arrays, e.g. "
        "{'prompts': np.array(['...', '...'])} (tunix's learner maps over every leaf of a "
        "batch, so a Python list is split into one leaf per string)"
      )
    length = len(tokenizer.dedup_bos_ids(bos + list(tokenizer.encode(str(prompt)))))
    if length > max_prompt_length:
      raise ValueError(
        f"prompt of episode row {row} is {length} tokens (with BOS), longer than the rollout "
        f"max_prompt_length={max_prompt_length}: {str(prompt)[:80]!r}; shorten the prompt "
        "or raise max_prompt_length"
      )
