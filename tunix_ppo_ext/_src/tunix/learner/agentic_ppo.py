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
through the project's estimator registry and the pure rollout phase (`_src/ppo/`, as
`PpoExtLearner`), and the project's metrics (`actor/...`, `critic/...`, `train/...` once published).
The rollout phase's state (`PhaseState`: the adaptive KL controller's, the critic
warm-up's) goes into the actor's checkpoints and comes back with them, as `PpoExtLearner`'s.

Under tunix's sequence packing (`max_seq_token_per_tpu`) the rollout phase runs on the
padded rows as above, and the actor's and the critic's updates on tunix's packed rows,
each episode its own row again after the model pass (`agentic_packing`).
"""

from __future__ import annotations

import dataclasses
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
from tunix_ppo_ext._src.metrics import keys as metric_keys
from tunix_ppo_ext._src.metrics import stats as batch_stats
from tunix_ppo_ext._src.ops import kl_methods as names
from tunix_ppo_ext._src.ppo import rollout_correction_step, rollout_phase
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.cluster import nan_guard
from tunix_ppo_ext._src.tunix.learner import agentic_packing, passes, ppo_config, trainer_setup
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


def agentic_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
  """The rollout phase's metrics as this learner logs them: without tunix 0.1.7's
  `PPOLearner` family (`advantages/*`, `rewards/score/*`, ...; `metric_keys.TUNIX_NAMES`),
  which tunix's agentic learners do not log and which would report the quantities of
  `train/advantage/*`, `train/score/*`, ... a second time, aggregated otherwise over a
  step's groups (tunix's reward manager logs its own `rewards/*`)."""
  return {name: value for name, value in metrics.items() if name not in _TUNIX_NAMES}


_TUNIX_NAMES = frozenset(metric_keys.TUNIX_NAMES)


def check_chat_parser(chat_parser: Any) -> None:
  """ValueError (one line) for `chat_parser=None`: tunix's loop then sends the chat through
  the tokenizer's own template and keeps no token ids of an episode, so there is nothing
  to train on (the first rollout failed inside tunix)."""
  if chat_parser is None:
    raise ValueError(
      "AgenticPpoLearner(chat_parser=None) is invalid: give tunix's chat template parser "
      "(e.g. tunix.rl.agentic.parser.chat_template_parser.parser.DefaultChatTemplateParser"
      "(tokenizer)); without one tunix's episodes carry no token ids to train on"
    )


class AgenticPpoLearner(compat.AgenticHooks):
  """PPO with a critic on tunix main's `AgenticRLLearner` (see the module docstring).

  Takes `AgenticRLLearner`'s arguments: `rl_engine` (tunix's `RLEngine`/`RLCluster`: a
  critic for estimators that take values, e.g. `gae`, `turn_gae`; none for `grpo`, `rloo`,
  `reinforce_plus_plus`; a reference for a KL, which building checks), an `AgenticPpoConfig`,
  `reward_fns`, `chat_parser` (tunix's, needed to tokenize the episodes: None is refused),
  `metric_fns`, `agent_class`, `agent_kwargs`, `env_class`, `env_kwargs`; `train(dataset)`
  is tunix's. Runs on tunix main only: on tunix 0.1.7 building it raises one line saying so.
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
    engine = compat.one_of("rl_engine", rl_engine, "rl_cluster", rl_cluster)
    if not isinstance(algo_config, AgenticPpoConfig):
      raise TypeError(f"algo_config must be an AgenticPpoConfig, got {type(algo_config).__name__}")
    self.ppo_config = algo_config.ppo_ext_config()  # what the losses and estimators read
    check_chat_parser(chat_parser)
    trainer_setup.check_reference(self.ppo_config, engine, "AgenticPpoConfig")
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
    self._packed = self._packed_rows(engine)
    with warnings.catch_warnings():  # the warning names the caller's line: `_set_up` warns
      warnings.simplefilter("ignore")
      trainer_setup.check_critic(
        self.ppo_config, trainer_setup.critic_trainer(engine), agentic=True
      )
    if rollout_correction_step.enabled(self.ppo_config):
      if not engine.get_rollout_config(Mode.TRAIN).return_logprobs:
        raise ValueError(
          "AgenticPpoConfig.rollout_is/rollout_rs need the sampler's log-probs: set "
          "return_logprobs=True in the train rollout config"
        )
    self._set_up(engine)

  def _packed_rows(self, engine: rl_cluster_lib.RLCluster) -> agentic_packing.PackedRows | None:
    """The rows kept for tunix's sequence packing (`max_seq_token_per_tpu`; None: off).
    Packing needs losses whose pass this package runs (tunix's read its packed rows alone)."""
    if engine.cluster_config.training_config.max_seq_token_per_tpu is None:
      return None
    tunix_own = ppo_config.tunix_own_losses(self.ppo_config)
    if tunix_own:
      name, value = tunix_own[0]
      raise ValueError(
        f"max_seq_token_per_tpu (sequence packing) needs this package's or a plugin's "
        f"losses: AgenticPpoConfig.{name}={value!r} is tunix's"
      )
    return agentic_packing.PackedRows()

  def train(self, *args: Any, **kwargs: Any) -> Any:
    """tunix's `train`; rows kept for packing and states kept for checkpoints by an earlier
    call are dropped first. The checkpoint tunix's trainers save as they close, when the
    newest one is older, carries the global step and the learner's state as the scheduled
    ones do (`compat.save_at_close`)."""
    self._states.clear()
    if self._packed is not None:
      self._packed.clear()
    with compat.save_at_close(self.rl_engine, self._save_at_close):
      return super().train(*args, **kwargs)

  def _save_at_close(self, trainer: Any) -> None:
    engine = self.rl_engine  # the step is counted: the rerun starts at `global_steps`
    metadata = compat.metadata_after_the_step(engine, trainer)
    nan_guard.save_state(trainer, {**metadata, **self._learner_state(engine.global_steps)})

  def _learner_state(self, resume_step: int | None = None) -> dict[str, Any]:
    """The checkpoint's learner state (`rollout_phase.PhaseState.to_metadata`: the KL
    controller's, the critic warm-up's) for a rerun that starts at global step
    `resume_step` (None: the step after tunix's current one, as its metadata counts): the
    state as the first group of that step was scored, when tunix's producer got to it
    before the save (`off_policy_steps > 0`), else the current one."""
    step = self.rl_engine.global_steps + 1 if resume_step is None else resume_step
    return self._states.get(step, self.state).to_metadata()

  def _keep_state_at(self, step: int) -> None:
    """Keeps the state as training step `step`'s first group is scored (`_learner_state`);
    the states of steps tunix has counted are dropped."""
    done = self.rl_engine.global_steps
    for old in [kept for kept in self._states if kept < done]:
      del self._states[old]
    self._states.setdefault(step, self.state)

  def packed_example(self, example: Any) -> Any:
    """tunix's hook on a chunk of its packed rows: the chunk's episodes as the padded rows
    this learner made, placed in tunix's packed rows (`agentic_packing`)."""
    return example if self._packed is None else self._packed.restore(example)

  def _set_up(self, engine: rl_cluster_lib.RLCluster) -> None:
    """The rollout phase's state and KL estimator, the passes, and the two trainers."""
    config = self.ppo_config
    if self.has_critic and not config.uses_critic:
      warnings.warn(
        f"advantage_estimator={config.advantage_estimator!r} uses no critic, yet the engine "
        "has one: it is trained for nothing (build the engine with critic=None)",
        stacklevel=3,
      )
    # the rollout phase's state: the checkpoint's on a resumed run (tunix set the global step
    # from the checkpoint it restored), else the configured one
    resumed = compat.restored_metadata(engine.actor_trainer) if engine.global_steps else {}
    self.state = rollout_phase.initial_state(config, resumed)
    self._states: dict[int, rollout_phase.PhaseState] = {}  # by training step, `_learner_state`
    # this engine's own objects only, as PpoExtLearner: its sampler, the checkpoints' learner
    # state, and each sampling call with a key of its own (else a group's episodes are copies)
    compat.prepare(engine, checkpoint_metadata=self._learner_state, sample_anew=True)
    self._kl_method = names.resolve_kl_method(config.kl_method)
    logps_rows = engine.cluster_config.training_config.compute_logps_micro_batch_size
    rows = None if logps_rows is None else logps_rows * config.num_generations
    self._passes = RolePasses(engine, rows, chunk_size=config.logits_chunk_size)
    # the temperature is read as an input is made: tunix's rollout config may come later
    self._inputs = trainer_setup.TrainerInputs(engine, config, lambda: self.temperature)
    trainer_setup.set_up_actor(engine.actor_trainer, self._inputs)
    if self.has_critic:  # tunix's loop updates it (`update_critic`) after the actor
      trainer_setup.set_up_critic(engine.critic_trainer, self._inputs)

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
    return trainer_setup.critic_trainer(self.rl_engine) is not None

  def turn_budget(self, left: int | None) -> int | None:
    """The most tokens one model call may generate: `max_tokens_per_turn`, or what is left
    of the episode's budget (`left`, tunix's) when that is less or there is no cap.

    Args:
      left: the tokens tunix's loop allows this call (None: no episode budget).

    Returns:
      The call's token budget (None: the rollout config's `max_tokens_to_generate`).
    """
    cap = self.algo_config.max_tokens_per_turn
    if cap is None:
      return left
    return cap if left is None else min(cap, left)

  def _ids(self) -> dict[str, int]:
    return {"pad_id": self.rl_engine.rollout.pad_id(), "eos_id": self.rl_engine.rollout.eos_id()}

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
    self._buffer(agentic_rows.trajectory_times(trajectories), mode, expected_step)
    self._buffer_user_metrics(prompts, batch, example.advantages, mode, expected_step)
    example = example.replace(policy_version=jnp.asarray(rows.policy_versions))
    if self._packed is not None and mode == Mode.TRAIN:  # tunix packs it, `packed_example`
      example = self._packed.add(example)
    return [example]

  def advantage_example(
    self,
    batch: TrajectoryBatch,
    behaviour_logps: np.ndarray | None,
    mode: Any = Mode.TRAIN,
    step: int | None = None,
  ) -> AgenticTrainExample:
    """The rollout phase of scored rows: the `TrainExample` tunix's trainers consume
    (`rollout_phase`'s KL shaping, advantages, metrics and fields, then rollout
    correction, as `PpoExtLearner`).

    `behaviour_logps` `[B, T]`: the log-probs the rows were sampled with (the old ones with
    `use_rollout_logps`, else the rollout policy's pass gives those and rollout correction
    weighs them against these; None: the sampler returned none).
    """
    config = self.ppo_config
    batch.validate()
    inputs = self._model_inputs(batch)
    model_passes = self._passes_of(inputs, behaviour_logps)
    where = rollout_phase.Step(
      self.rl_engine.global_steps if step is None else step,
      train=mode == Mode.TRAIN,
      has_critic=self.has_critic,
      fallback=tunix_losses.tunix_estimator(config.advantage_estimator),
    )  # `step`: the step tunix scores the group for (a warm-up step: actor_scale 0)
    if where.train:
      self._keep_state_at(where.step)
    result = rollout_phase.rollout_phase(config, self.state, where, batch, inputs, model_passes)
    self.state = result.state
    self._buffer(agentic_metrics(result.metrics), mode, step)
    if behaviour_logps is not None and not self._sampler_logps_are_old(behaviour_logps):
      agreement = batch_stats.sampler_trainer_agreement(
        behaviour_logps, model_passes.old_logps, batch.loss_mask
      )
      self._buffer(agreement, mode, step)
    example = AgenticTrainExample(**result.fields)
    sampled = dataclasses.replace(batch, sampler_logps=behaviour_logps)
    example, corrected = rollout_correction_step.correct(config, sampled, example)
    self._buffer({k: (v, np.mean) for k, v in corrected.items()}, mode, step)
    return example

  def _model_inputs(self, batch: TrajectoryBatch) -> ModelInputs:
    return ModelInputs(
      prompt=jnp.asarray(batch.prompt_ids),
      completion=jnp.asarray(batch.completion_ids),
      attention_mask=jnp.asarray(batch.attention_mask, jnp.int32),
      loss_mask=jnp.asarray(batch.loss_mask, jnp.float32),
      temperature=self.temperature,
      **self._ids(),
    )

  def _sampler_logps_are_old(self, behaviour_logps: np.ndarray | None) -> bool:
    """Whether the sampler's log-probs are the old ones (`use_rollout_logps`; no trainer
    pass then, and no `sampler_trainer/*` to compare it with)."""
    return bool(self.algo_config.use_rollout_logps) and behaviour_logps is not None

  def _passes_of(
    self, inputs: ModelInputs, behaviour_logps: np.ndarray | None
  ) -> rollout_phase.Passes:
    """The behaviour log-probs `[B, T]` (the sampler's with `use_rollout_logps`, else the
    rollout policy's pass), the critic's values (0 off agent tokens; all 0 without one)
    and, when the step takes a KL, the reference's log-probs and the KL to them."""
    if self._sampler_logps_are_old(behaviour_logps):
      old_logps = jnp.asarray(behaviour_logps, jnp.float32) * inputs.loss_mask
    else:
      old_logps = self._passes.old_logps(inputs)
    values = jnp.zeros_like(inputs.loss_mask)
    if self.has_critic:
      width = inputs.completion.shape[1]
      values = passes.predicting_positions(self._passes.values(inputs), width) * inputs.loss_mask
    if not rollout_phase.needs_reference(self.ppo_config, self.state):
      return rollout_phase.Passes(old_logps, values)
    ref_logps = self._passes.ref_logps(inputs)
    kl = self._kl_method.divergence(old_logps, ref_logps, self.ppo_config.kl_clamp_value)
    return rollout_phase.Passes(old_logps, values, ref_logps, kl)

  def _buffer(self, metrics: dict[str, Any], mode: Any, step: int | None) -> None:
    step = self.rl_engine.global_steps if step is None else step
    if metrics:
      self.rl_engine.buffer_metrics_async(metrics, mode=mode, step=step)

  def _buffer_user_metrics(self, prompts, batch: TrajectoryBatch, advantages, mode, step) -> None:
    """tunix's `metric_fns(prompts, completions, advantages, rewards)` on this batch; a
    name without `/` lands in `custom/` (as `PpoExtLearner`)."""
    for metrics in rollout_phase.user_metrics(self.metric_fns, prompts, batch, advantages):
      self._buffer(metrics, mode, step)
