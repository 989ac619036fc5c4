"""`AgenticPpoLearner`: PPO with a critic over tunix main's own agentic stack.

tunix main's `AgenticRLLearner` runs the episodes (its orchestrator, agents, environments
and tools), the asynchronous producer and consumer, the trainers' updates (`update_actor`,
and `update_critic` when the engine has a critic) and the weight syncs; its only PPO-capable
learner is missing (`training_mode: agentic_ppo` in tunix's CLI raises). This learner is
that subclass: it implements the one hook an algorithm implements (`process_results`: a
group's episodes to `TrainExample`s) with this package's rollout phase, and sets up the two
trainers with this package's losses.

It subclasses `AgenticRLLearner`, not tunix's agentic `GRPOLearner`: what GRPO adds is its
config (`num_generations > 1`, its loss keys), its loss installed on the actor and its
`_process_results` (scalar group advantages, no values), all of which PPO replaces.

One group's rollout phase (`advantage_example`): the episodes padded as tunix pads them
(`rollout.agentic_rows`), scored by tunix's reward manager (the environment's trajectory
reward plus the reward functions, on the last agent token), the behaviour log-probs (the
sampler's, `use_rollout_logps`; else the rollout policy's pass), the critic's values per
token, the KL to the reference in the reward or the loss, advantages and value targets
through the project's estimator registry (`advantage_step`, as `PpoExtLearner`), and the
project's metrics (`actor/...`, `critic/...`, `train/...` once published).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl import utils as rl_utils
from tunix.rl.agentic.agents import model_agent
from tunix.rl.agentic.environments import task_environment

from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.math import kl as kl_lib
from tunix_ppo_ext._src.math import kl_methods as names
from tunix_ppo_ext._src.math.masked import masked_mean
from tunix_ppo_ext._src.metrics import keys as metric_keys
from tunix_ppo_ext._src.metrics import stats as batch_stats
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.learner import advantage_step, passes
from tunix_ppo_ext._src.tunix.learner import loss_fns as tunix_losses
from tunix_ppo_ext._src.tunix.learner import ppo_learner as ppo_ext
from tunix_ppo_ext._src.tunix.learner.agentic_ppo_config import AgenticPpoConfig
from tunix_ppo_ext._src.tunix.learner.role_passes import ModelInputs, RolePasses
from tunix_ppo_ext._src.tunix.rollout import agentic_rows

Mode = rl_cluster_lib.Mode


@flax.struct.dataclass(frozen=True)
class AgenticTrainExample(ppo_ext.TrainExample):
  """`PpoExtLearner`'s example plus tunix's agentic `policy_version` (`[B]`)."""

  policy_version: jax.Array | None = None


class AgenticPpoLearner(compat.AgenticHooks):
  """PPO with a critic on tunix main's `AgenticRLLearner` (see the module docstring).

  Takes `AgenticRLLearner`'s arguments: `rl_engine` (tunix's `RLEngine`/`RLCluster`: a
  critic for estimators that take values, e.g. `gae`, `turn_gae`; none for `grpo`, `rloo`,
  `reinforce_plus_plus`; a reference for a KL), an `AgenticPpoConfig`, `reward_fns`,
  `chat_parser` (tunix's, needed to tokenize the episodes), `metric_fns`, `agent_class`,
  `agent_kwargs`, `env_class`, `env_kwargs`; `train(dataset)` is tunix's. Runs on tunix
  main only: on tunix 0.1.7 building it raises one line saying so.
  """

  def __init__(
    self,
    rl_engine: rl_cluster_lib.RLCluster | None = None,
    algo_config: AgenticPpoConfig | None = None,
    reward_fns: Callable[..., Any] | list[Callable[..., Any]] | None = None,
    chat_parser: Any | None = None,
    metric_fns: Sequence[Callable[..., Any]] | None = None,
    agent_class: type = model_agent.ModelAgent,
    agent_kwargs: dict[str, Any] | None = None,
    env_class: type = task_environment.TaskEnvironment,
    env_kwargs: dict[str, Any] | None = None,
    *,
    rl_cluster: rl_cluster_lib.RLCluster | None = None,
  ):
    compat.needs_main("AgenticPpoLearner")
    engine = ppo_ext.one_of("rl_engine", rl_engine, "rl_cluster", rl_cluster)
    if not isinstance(algo_config, AgenticPpoConfig):
      raise TypeError(f"algo_config must be an AgenticPpoConfig, got {type(algo_config).__name__}")
    self.ppo_config = algo_config.ppo_ext_config()  # what the losses and estimators read
    super().__init__(  # first: tunix's checks of the rollout config
      rl_engine=engine,
      algo_config=algo_config,
      reward_fns=reward_fns,
      chat_parser=chat_parser,
      metric_fns=metric_fns,
      agent_class=agent_class,
      agent_kwargs=agent_kwargs,
      env_class=env_class,
      env_kwargs=env_kwargs,
    )
    if engine.cluster_config.training_config.max_seq_token_per_tpu is not None:
      raise ValueError("AgenticPpoLearner trains padded rows: set max_seq_token_per_tpu=None")
    with warnings.catch_warnings():  # the warning names the caller's line: `_set_up` warns
      warnings.simplefilter("ignore")
      ppo_ext.check_critic(self.ppo_config, ppo_ext.critic_trainer(engine))
    tunix_losses.register_configured(self.ppo_config)
    sampler = compat.vanilla_sampler(engine.rollout)
    if sampler is not None:  # as PpoExtLearner: `model.remat` and splash are the trainers'
      compat.sample_without_training_options(sampler)
      compat.keep_prompt_width_static(sampler)
    compat.sample_each_call_anew(engine.rollout)  # else a group's episodes are copies
    self._set_up(engine)

  def _set_up(self, engine: rl_cluster_lib.RLCluster) -> None:
    """The KL controller and estimator, the passes, and the two trainers."""
    config = self.ppo_config
    if self.has_critic and not config.uses_critic:
      warnings.warn(
        f"advantage_estimator={config.advantage_estimator!r} uses no critic, yet the engine "
        "has one: it is trained for nothing (build the engine with critic=None)",
        stacklevel=3,
      )
    self.kl_controller = kl_lib.make_kl_controller(
      config.kl_ctrl, config.kl_coef, config.kl_target, config.kl_horizon
    )
    self._kl_method = names.resolve_kl_method(config.kl_method)
    logps_rows = engine.cluster_config.training_config.compute_logps_micro_batch_size
    rows = None if logps_rows is None else logps_rows * config.num_generations
    self._passes = RolePasses(engine, rows, chunk_size=config.logits_chunk_size)
    self._tunix_own = {
      kind: tunix_losses.tunix_own(kind, name)
      for kind, name in (
        (registry.POLICY_LOSSES, config.policy_loss_fn),
        (registry.VALUE_LOSSES, config.value_loss_fn),
      )
    }
    self._set_up_actor(engine.actor_trainer)
    if self.has_critic:
      self._set_up_critic(engine.critic_trainer)

  def _set_up_actor(self, actor: Any) -> None:
    """The actor trainer's loss (the configured policy loss), inputs and logged terms."""
    config = self.ppo_config
    loss = tunix_losses.configured_loss(registry.POLICY_LOSSES, config.policy_loss_fn)
    actor.with_loss_fn(loss, has_aux=True)
    actor.with_gen_model_input_fn(self._actor_inputs)
    if self._tunix_own[registry.POLICY_LOSSES]:
      actor.with_rl_metrics_to_log(compat.tunix_loss_metrics(config)[0])
      return
    logged = ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy")
    kl_loss = ("kl_loss",) if config.kl_penalty == "loss" else ()
    actor.with_rl_metrics_to_log(dict.fromkeys((*logged, *kl_loss), np.mean))

  def _set_up_critic(self, critic: Any) -> None:
    """The critic trainer's loss (the configured value loss), inputs and logged terms;
    tunix's loop updates it (`update_critic`) after the actor on every micro-batch."""
    config = self.ppo_config
    critic.with_loss_fn(
      tunix_losses.configured_loss(registry.VALUE_LOSSES, config.value_loss_fn), has_aux=True
    )
    critic.with_gen_model_input_fn(self._critic_inputs)
    if self._tunix_own[registry.VALUE_LOSSES]:
      critic.with_rl_metrics_to_log(compat.tunix_loss_metrics(config)[1])
      return
    critic.with_rl_metrics_to_log(dict.fromkeys(("vf_loss", "vpred_mean", "vf_clipfrac"), np.mean))

  @property
  def temperature(self) -> float:
    """The temperature of the trainer's log-probs: `logps_temperature`, else the train
    rollout's (the sampler's log-probs were taken at it), else 1."""
    if self.ppo_config.logps_temperature:
      return float(self.ppo_config.logps_temperature)
    return float(self.rl_engine.get_rollout_config(Mode.TRAIN).temperature or 1.0)

  @property
  def has_critic(self) -> bool:
    """Whether the engine has a critic (built for estimators that take values)."""
    return ppo_ext.critic_trainer(self.rl_engine) is not None

  def _ids(self) -> dict[str, int]:
    return {"pad_id": self.rl_engine.rollout.pad_id(), "eos_id": self.rl_engine.rollout.eos_id()}

  def _actor_inputs(self, example: AgenticTrainExample) -> dict[str, Any]:
    inputs = {"train_example": example, "algo_config": self.ppo_config, **self._ids()}
    if not self._tunix_own[registry.POLICY_LOSSES]:
      inputs["temperature"] = self.temperature
    return inputs

  def _critic_inputs(self, example: AgenticTrainExample) -> dict[str, Any]:
    inputs = {"train_example": example, "clip_range_value": self.ppo_config.clip_range_value}
    inputs.update(self._ids())
    if not self._tunix_own[registry.VALUE_LOSSES]:
      inputs["loss_agg_mode"] = self.ppo_config.value_loss_agg_mode
    return inputs

  # ----- the rollout phase -----

  def process_results(
    self, trajectories: list[Any], mode: Any, expected_step: int | None
  ) -> list[AgenticTrainExample]:
    """tunix's hook: one group's (or several groups') episodes to one `TrainExample`."""
    rollout = self.rl_engine.get_rollout_config(mode)
    rows = agentic_rows.agentic_rows(
      trajectories,
      max_prompt_length=rollout.max_prompt_length,
      width=self.algo_config.max_response_length,
      pad_id=self.rl_engine.rollout.pad_id(),
    )
    inputs = rl_utils.merge_micro_batches(rows.original_inputs) if rows.original_inputs else {}
    prompts = list(inputs.get("prompts", [""] * len(trajectories)))
    extra = {key: value for key, value in inputs.items() if key != "prompts"}
    scores = compat.agentic_rewards(
      self,
      prompts=prompts,
      completions=rows.completions,
      mode=mode,
      expected_step=expected_step,
      trajectory_rewards=rows.trajectory_rewards,
      **extra,
    )
    batch = agentic_rows.with_scores(rows.batch, scores)
    example = self.advantage_example(batch, rows.behaviour_logps, mode, expected_step)
    self._buffer_user_metrics(prompts, batch, example.advantages, mode, expected_step)
    return [example.replace(policy_version=jnp.asarray(rows.policy_versions))]

  def advantage_example(
    self,
    batch: TrajectoryBatch,
    behaviour_logps: np.ndarray | None,
    mode: Any = Mode.TRAIN,
    step: int | None = None,
  ) -> AgenticTrainExample:
    """The rollout phase of scored rows: the `TrainExample` tunix's trainers consume.

    `behaviour_logps` `[B, T]`: the log-probs the rows were sampled with (used with
    `use_rollout_logps`; None: the rollout policy's pass gives them).
    """
    batch.validate()
    inputs = self._model_inputs(batch)
    old_logps = self._old_logps(inputs, behaviour_logps)
    values = self._values(inputs)
    rewards, ref_logps, kl = self._kl_penalty(batch, inputs, old_logps, mode)
    groups = advantage_step.group_ids(batch, self.ppo_config.num_generations)
    advantages, returns = advantage_step.advantages_and_returns(
      self.ppo_config,
      rewards,
      values,
      inputs.loss_mask,
      groups,
      warming_up=False,
      has_critic=self.has_critic,
    )
    self._buffer_rollout_metrics(batch, (rewards, values, advantages, returns, kl), mode, step)
    kl_in_loss = self.ppo_config.kl_penalty == "loss"
    return AgenticTrainExample(
      prompt_ids=inputs.prompt,
      prompt_mask=(inputs.prompt != inputs.pad_id).astype(jnp.int32),
      completion_ids=inputs.completion,
      completion_mask=inputs.loss_mask,  # tunix's code that reads it trains agent tokens only
      ref_per_token_logps=ref_logps if kl_in_loss else None,
      advantages=advantages,
      returns=returns,
      old_per_token_logps=old_logps,
      old_values=values,
      attention_mask=inputs.attention_mask,
      loss_mask=inputs.loss_mask,
      kl_coef=jnp.full((len(groups),), self.kl_controller.value if kl_in_loss else 0.0),
    )

  def _model_inputs(self, batch: TrajectoryBatch) -> ModelInputs:
    return ModelInputs(
      prompt=jnp.asarray(batch.prompt_ids),
      completion=jnp.asarray(batch.completion_ids),
      attention_mask=jnp.asarray(batch.attention_mask, jnp.int32),
      loss_mask=jnp.asarray(batch.loss_mask, jnp.float32),
      temperature=self.temperature,
      **self._ids(),
    )

  def _old_logps(self, inputs: ModelInputs, behaviour_logps: np.ndarray | None) -> jax.Array:
    """The behaviour log-probs `[B, T]`: the sampler's (`use_rollout_logps`), else the
    rollout policy's pass."""
    if self.algo_config.use_rollout_logps and behaviour_logps is not None:
      return jnp.asarray(behaviour_logps, jnp.float32) * inputs.loss_mask
    return self._passes.old_logps(inputs)

  def _values(self, inputs: ModelInputs) -> jax.Array:
    """The critic's value of each agent token `[B, T]` (0 elsewhere; all 0 without one)."""
    if not self.has_critic:
      return jnp.zeros_like(inputs.loss_mask)
    width = inputs.completion.shape[1]
    return passes.predicting_positions(self._passes.values(inputs), width) * inputs.loss_mask

  def _kl_penalty(self, batch: TrajectoryBatch, inputs: ModelInputs, old_logps, mode: Any):
    """`(rewards, ref_logps or None, per-token KL or None)`; updates the KL controller.

    With `kl_penalty="reward"` the rewards are `token_rewards - kl_coef * KL` (as
    `PpoExtLearner`); the KL is of the behaviour policy to the reference."""
    config, kl_coef = self.ppo_config, self.kl_controller.value
    rewards = jnp.asarray(batch.token_rewards, jnp.float32)
    if config.kl_penalty == "none" or kl_coef <= 0:
      return rewards, None, None
    ref_logps = self._passes.ref_logps(inputs)
    method = self._kl_method
    kl = kl_lib.kl_divergence(
      old_logps, ref_logps, method.estimator, method.straight_through, config.kl_clamp_value
    )
    kl = kl * inputs.loss_mask
    if config.kl_penalty == "reward":
      rewards = rewards - kl_coef * kl
    if mode == Mode.TRAIN:
      seq_kl = masked_mean(kl, inputs.loss_mask, axis=-1)
      self.kl_controller.update(float(jnp.mean(seq_kl)), n_steps=inputs.completion.shape[0])
    return rewards, ref_logps, kl

  def _buffer(self, metrics: dict[str, Any], mode: Any, step: int | None) -> None:
    step = self.rl_engine.global_steps if step is None else step
    self.rl_engine.buffer_metrics_async(metrics, mode=mode, step=step)

  def _buffer_rollout_metrics(self, batch: TrajectoryBatch, terms, mode, step) -> None:
    """The project's rollout statistics (`metrics.stats`) and advantage noise."""
    rewards, values, advantages, returns, kl = terms
    groups = advantage_step.group_ids(batch, self.ppo_config.num_generations)
    coefficients = {
      "learner/kl_coef": float(self.kl_controller.value),
      "learner/entropy_coef": float(self.ppo_config.entropy_coef),
    }
    stats, tunix_stats, _ = batch_stats.rollout_statistics(
      batch,
      rewards,
      values,
      advantages,
      returns,
      kl,
      groups=groups,
      has_critic=self.has_critic,
      coefficients=coefficients,
      rollout_s=0.0,
    )
    mask = jnp.asarray(batch.loss_mask, jnp.float32)
    stats |= advantage_step.noise_metrics(self.ppo_config, rewards, values, mask, groups)
    self._buffer({k: (v, np.mean) for k, v in stats.items()}, mode, step)
    self._buffer(tunix_stats, mode, step)

  def _buffer_user_metrics(self, prompts, batch: TrajectoryBatch, advantages, mode, step) -> None:
    """tunix's `metric_fns(prompts, completions, advantages, rewards)` on this batch; a
    name without `/` lands in `custom/` (as `PpoExtLearner`)."""
    for metric_fn in self.metric_fns:
      values = metric_fn(
        prompts=list(prompts),
        completions=batch.texts,
        advantages=advantages,
        rewards=np.asarray(batch.token_rewards).sum(-1),
      )
      self._buffer({metric_keys.custom_name(k): v for k, v in values.items()}, mode, step)
