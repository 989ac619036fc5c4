"""Toy tunix clusters and multi-turn learners.

Toy data and clusters are tunix's own machinery: `RLCluster` with the "vanilla" rollout
engine, `rl_trainer.Trainer` with optax Adam, the Qwen3 models of
`tunix_ppo_ext._src.tunix.models.toy_models` and `CharTokenizer`; every role shares one
`(fsdp=1, tp=1)` mesh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
  from flax import nnx


def record_turns(monkeypatch) -> list[tuple[list[list[int]], Any]]:
  """Spies on the multi-turn rollout's real sampler: every turn's `(contexts, TurnOutput)`
  (`output.tokens[row]`, `output.logprobs[row]`), in call order."""
  from tunix_ppo_ext._src.tunix.rollout.continuing_sampler import Conversation

  original, turns = Conversation.turn, []

  def turn(self, contexts, active, sampling, fresh_width):
    output = original(self, contexts, active, sampling, fresh_width)
    turns.append(([list(c) for c in contexts], output))
    return output

  monkeypatch.setattr(Conversation, "turn", turn)
  return turns


class MetricsRecorder:
  """The learner's one surface a trajectory source uses, `rl_cluster.buffer_metrics`,
  recorded: `metrics[key]` is the value, `modes[key]` the mode it was buffered under."""

  def __init__(self):
    self.rl_cluster, self.metrics, self.modes = self, {}, {}

  def buffer_metrics(self, metrics: dict[str, tuple[Any, Any]], mode: Any) -> None:
    for key, (value, _) in metrics.items():
      self.metrics[key], self.modes[key] = value, mode


def param_leaf(model: nnx.Module) -> np.ndarray:
  """A host copy of one trained leaf (first decoder layer's q projection)."""
  return np.array(model.layers[0].attn.q_proj.w[...])


def toy_cluster(
  tokenizer: Any,
  seed: int = 0,
  *,
  prompt_len: int,
  tokens_per_call: int,
  max_steps: int = 2,
  batch: int = 4,
  with_critic: bool = True,
  with_reference: bool = True,
  **kwargs: Any,
) -> Any:
  """A tunix cluster of toy models (`make_models(tokenizer, seed)`, the critic left out
  with `with_critic=False`, the reference with `with_reference=False`): `prompt_len` prompt
  tokens, `tokens_per_call` generated tokens per engine call; the policy is
  `cluster.actor_trainer.model`. `kwargs` are `ClusterSpec` fields or `build_cluster`
  keywords."""
  import dataclasses

  from tunix_ppo_ext.models import ClusterSpec, build_cluster, make_models

  fields = {field.name for field in dataclasses.fields(ClusterSpec)}
  spec = ClusterSpec(
    max_steps=max_steps,
    batch=batch,
    max_prompt_length=prompt_len,
    max_tokens_to_generate=tokens_per_call,
    **{key: value for key, value in kwargs.items() if key in fields},
  )
  policy, critic, reference = make_models(tokenizer, seed=seed)
  others = {key: value for key, value in kwargs.items() if key not in fields}
  reference = reference if with_reference else None
  return build_cluster(
    policy, critic if with_critic else None, tokenizer, spec, reference=reference, **others
  )


def multi_turn_learner(
  tokenizer: Any, seed: int, source: Any, config: Any = None, *, prompt_len: int, **kwargs: Any
) -> Any:
  """`PpoExtLearner(cluster, config or PpoExtConfig(), trajectory_source=source)` on a
  `toy_cluster` sized for the multi-turn `source` (room per engine call for its whole width
  plus one turn), the sampler's log-probs returned. The cluster is `learner.rl_cluster`;
  `kwargs` go to `toy_cluster`."""
  from tunix_ppo_ext import PpoExtConfig, PpoExtLearner

  width = source.max_completion_len + source.max_turn_tokens
  cluster = toy_cluster(
    tokenizer, seed, prompt_len=prompt_len, tokens_per_call=width, return_logprobs=True, **kwargs
  )
  return PpoExtLearner(cluster, config or PpoExtConfig(), trajectory_source=source)


def replayed_group(monkeypatch, learner: Any, seed: int) -> tuple[Any, list[tuple[int, list]]]:
  """One training batch of the learner's multi-turn source on 2 episodes of one seed, the
  engine's outputs recorded (`record_turns`): `(batch, rows)`, `rows[i]` the episode seed
  of row `i` and the agent's token ids of each of its turns, to replay on the environment."""
  from tunix_ppo_ext._src.data.trajectory import episode_batches
  from tunix_ppo_ext._src.tunix.rollout.multi_turn import Mode

  source = learner.trajectory_source
  turns = record_turns(monkeypatch)  # the real sampler, its outputs kept
  data = {k: np.repeat(v, 2, axis=0) for k, v in next(episode_batches(1, 2, seed=seed)).items()}
  batch = source(learner, data, Mode.TRAIN)
  monkeypatch.undo()
  batch.validate()
  outputs = [output for _, output in turns]
  rows = []
  for row, episode in enumerate(data["seed"]):
    played = outputs[: int(batch.num_turns[row])]
    rows.append((int(episode), [out.tokens[row].tolist() for out in played]))
  return batch, rows


def assert_row_is(batch: Any, row: int, tokens: list[int], loss: list[int]) -> None:
  """Row `row` of `batch` holds `tokens` with loss mask `loss`, cut to the batch's width
  and padded out of the attention mask."""
  width = batch.completion_ids.shape[1]
  n = min(len(tokens), width)
  np.testing.assert_array_equal(batch.completion_ids[row][:n], tokens[:n])
  np.testing.assert_array_equal(batch.loss_mask[row], loss[:n] + [0] * (width - n))
  np.testing.assert_array_equal(batch.attention_mask[row], [1] * n + [0] * (width - n))


def assert_training_moves_the_policy(learner: Any, steps: int = 2) -> None:
  """`learner` trains `steps` steps on episode batches and the policy's weights move."""
  from tunix_ppo_ext._src.data.trajectory import episode_batches

  trainer = learner.rl_cluster.actor_trainer
  before = param_leaf(trainer.model)
  learner.train(episode_batches(steps, 2, seed=0))
  assert trainer.train_steps == steps and not np.allclose(param_leaf(trainer.model), before)


def toy_policy(vocab_size, seed=7, **sizes):
  """A toy tunix Qwen3 policy (1 layer, width 32 unless `sizes` say otherwise)."""
  sizes = {
    "num_layers": 1,
    "embed_dim": 32,
    "hidden_dim": 64,
    "num_heads": 2,
    "head_dim": 32,
    "num_kv_heads": 1,
    **sizes,
  }
  from tunix_ppo_ext._src.tunix.models import toy_models

  return toy_models.make_policy(toy_models.tiny_qwen3_config(vocab_size, **sizes), seed)
