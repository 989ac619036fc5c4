"""`PpoExtLearner`: tunix's `PPOLearner` with real masks, float rewards and every knob live.

It implements tunix's learner hooks (the rollout phase, samples per prompt, after each
global step; `compat.LearnerHooks` forwards tunix's private hook names to them) and the
trainers' loss and input functions and checkpoint metadata, and keeps tunix's training
loop, cluster, rollout engine, trainers and orbax checkpointing.

The rollout phase, one function each: trajectories (`_trajectories`), old log-probs and
values (`_old_logps_and_values`), the KL to the reference (`_kl_penalty`), advantages
(`advantage_step`), metrics (`_buffer_rollout_metrics`, `_buffer_user_metrics`), and the
`TrainExample` tunix's trainers consume (`_train_example`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import utils as generate_utils
from tunix.rl import function_registry
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.ppo import ppo_learner

from tunix_ppo_ext._src.config.critic_warmup import CriticWarmup
from tunix_ppo_ext._src.data import rollout_weights as rollout_correction
from tunix_ppo_ext._src.data.rewards import DROPPED_METRIC, NonFiniteRewards
from tunix_ppo_ext._src.data.trajectory import (
  TrajectoryBatch,
  sampler_logprob_gap,
)
from tunix_ppo_ext._src.math import kl as kl_lib
from tunix_ppo_ext._src.math import kl_methods as names
from tunix_ppo_ext._src.math.masked import masked_mean
from tunix_ppo_ext._src.math.shared_prompts import plan_shared_prompts
from tunix_ppo_ext._src.metrics import keys as metric_keys
from tunix_ppo_ext._src.metrics import stats as batch_stats
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.cluster import cluster_setup, disk_space, nan_guard, timing
from tunix_ppo_ext._src.tunix.learner import advantage_step, passes
from tunix_ppo_ext._src.tunix.learner import loss_fns as tunix_losses
from tunix_ppo_ext._src.tunix.learner.ppo_config import PpoExtConfig
from tunix_ppo_ext._src.tunix.learner.role_passes import ModelInputs, RolePasses
from tunix_ppo_ext._src.tunix.rollout.context import RolloutContext, TrajectorySource

Mode = rl_cluster_lib.Mode


@flax.struct.dataclass(frozen=True)
class TrainExample(ppo_learner.TrainExample):
  """tunix's PPO example plus the two masks and per-step scalars (broadcast to `[B]`).

  `completion_mask` holds the loss mask too, so tunix code that reads it trains on agent
  tokens only; `attention_mask` is every real completion token.
  """

  attention_mask: jax.Array | None = None  # [B, T]
  loss_mask: jax.Array | None = None  # [B, T]
  kl_coef: jax.Array | None = None  # [B], the KL-in-loss coefficient of this step
  actor_scale: jax.Array | None = None  # [B], 0 during critic warm-up
  rollout_is_weights: jax.Array | None = None  # [B, T], rollout correction (rollout_is)
  pack_slots: jax.Array | None = None  # [B, P+T], each token's packed slot (`packing`)
  pack_rows: jax.Array | None = None  # [B, R, k] one-hot: the packed row and batch-width
  # segment where each episode starts; R rows of k batch widths (static: the shape)
  prompt_groups: jax.Array | None = None  # [B, U] one-hot: the distinct prompt each row
  # holds within its micro-batch (`math.shared_prompts`; U static: the shape)


class PpoExtLearner(compat.LearnerHooks):
  """PPO over tunix with attention/loss masks kept apart and every `PpoExtConfig` knob live.

  Without a `trajectory_source` it trains single-turn prompts like tunix's PPO; with one,
  it trains the source's pre-built (e.g. multi-turn) trajectories.
  """

  def __init__(
    self,
    rl_cluster: rl_cluster_lib.RLCluster | None = None,
    ppo_config: PpoExtConfig | None = None,
    reward_fns: Callable[..., Any] | list[Callable[..., Any]] | None = None,
    metric_fns: Sequence[Callable[..., Any]] | None = None,
    data_shuffle_seed: int | None = None,
    trajectory_source: TrajectorySource | None = None,
    *,
    rl_engine: rl_cluster_lib.RLCluster | None = None,
    algo_config: PpoExtConfig | None = None,
  ):
    """tunix's `PPOLearner` arguments, in either spelling: tunix 0.1.7 names them
    `rl_cluster` and `ppo_config`, tunix main `rl_engine` (`rl_cluster` still accepted
    there) and `algo_config`; both spellings work on both versions, one of each pair."""
    rl_cluster = one_of("rl_engine", rl_engine, "rl_cluster", rl_cluster)
    ppo_config = one_of("algo_config", algo_config, "ppo_config", ppo_config)
    if not isinstance(ppo_config, PpoExtConfig):
      raise TypeError(f"ppo_config must be a PpoExtConfig, got {type(ppo_config).__name__}")
    self._nonfinite_rewards = NonFiniteRewards(ppo_config.nonfinite_rewards)
    reward_fns = self._checked_reward_fns(reward_fns, trajectory_source)
    tunix_losses.register_configured(ppo_config)  # tunix's constructor looks them up
    compat.install_lora_product()  # LoRA adapters made elsewhere: their products' lean VJP
    cluster_setup.quiet_cpu_notices()  # tunix's TPU notices, on a CPU-only process
    engine = compat.vanilla_sampler(rl_cluster.rollout)
    if engine is not None:  # `model.remat` and splash are for the trainers' passes
      compat.sample_without_training_options(engine)
      compat.keep_prompt_width_static(engine)  # tunix's array in pytree metadata
    critic = critic_trainer(rl_cluster)
    check_critic(ppo_config, critic)
    kwargs = {"reward_fns": reward_fns, "metric_fns": metric_fns}
    kwargs["data_shuffle_seed"] = data_shuffle_seed
    if critic is None:  # group estimators: no critic (verl); tunix's PPOLearner insists on one
      compat.init_without_critic(self, rl_cluster, ppo_config, **kwargs)
    else:  # positional: tunix's keywords differ between versions (see `__init__`)
      super().__init__(rl_cluster, ppo_config, **kwargs)
    self.trajectory_source = trajectory_source
    self.kl_controller = kl_lib.make_kl_controller(
      ppo_config.kl_ctrl, ppo_config.kl_coef, ppo_config.kl_target, ppo_config.kl_horizon
    )
    self.critic_warmup = CriticWarmup(
      ppo_config.critic_warmup_steps,
      ppo_config.critic_warmup_until_ev,
      ppo_config.critic_warmup_patience,
    )
    self._restore_learner_state()
    self._tunix_own = {  # tunix's own losses get tunix's inputs and log tunix's metrics
      kind: tunix_losses.tunix_own(kind, name)
      for kind, name in (
        (registry.POLICY_LOSSES, ppo_config.policy_loss_fn),
        (registry.VALUE_LOSSES, ppo_config.value_loss_fn),
      )
    }
    # the old log-probs come from the update's own pass when the policy cannot have moved
    self._old_logps_in_update = old_logps_in_update(
      ppo_config,
      rl_cluster.cluster_config.training_config,
      self._tunix_own[registry.POLICY_LOSSES],
    )
    self._set_up_actor(rl_cluster.actor_trainer, ppo_config)
    if critic is not None:
      self._set_up_critic(critic)
    self._set_up_reference(ppo_config)
    prompts = compat.logps_micro_batch_size(self)  # tunix counts prompts; a pass sees rows
    rows = None if prompts is None else prompts * ppo_config.num_generations  # as tunix's GRPO
    self._passes = RolePasses(
      rl_cluster, rows, ppo_config.fused_head, ppo_config.logits_chunk_size, ppo_config.packing
    )
    self._nan_guard = nan_guard.NanGuard(rl_cluster, ppo_config.max_nonfinite_steps)
    self._disk_guard = disk_space.guard_for(rl_cluster)
    self._check_disk()  # before the first step

  def _checked_reward_fns(self, reward_fns, trajectory_source) -> Any:
    """The reward functions tunix gets: each wrapped to catch NaN before tunix's nansum;
    with a trajectory source and none given, the source's own rewards."""
    if trajectory_source is not None:
      return _rewards_come_from_the_source if reward_fns is None else reward_fns
    if reward_fns is None:
      return None
    fns = list(reward_fns) if isinstance(reward_fns, Sequence) else [reward_fns]
    return [self._nonfinite_rewards.check(fn) for fn in fns]

  def _set_up_actor(self, actor, config: PpoExtConfig) -> None:
    """The actor trainer's loss, checkpoint metadata, inputs, update timer, logged terms."""
    # The actor's loss as tunix 0.1.7 installs it: tunix main wraps it in a closure that
    # takes only `train_example` and `algo_config` (adding pad/eos ids and its chunk size),
    # not the temperature and reference state `_actor_inputs` gives.
    actor.with_loss_fn(function_registry.get_policy_loss_fn(config.policy_loss_fn), has_aux=True)
    compat.add_checkpoint_metadata(actor, self._learner_state)
    actor.with_gen_model_input_fn(self._actor_inputs)
    actor.with_training_hooks(timing.UpdateTimer(self.rl_cluster, "timing_s/update_actor"))
    if self._tunix_own[registry.POLICY_LOSSES]:  # tunix's aux keys and reducer
      actor.with_rl_metrics_to_log(compat.tunix_loss_metrics(config)[0])
      return
    logged = ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy")
    kl_loss = ("kl_loss",) if config.kl_penalty == "loss" else ()
    actor.with_rl_metrics_to_log(dict.fromkeys((*logged, *kl_loss), np.mean))

  def _set_up_reference(self, config: PpoExtConfig) -> None:
    """The KL estimator of the reference log-probs, or the reference model's state for
    `kl_method: full` (plain arrays, which can cross tunix's `nnx.value_and_grad`)."""
    self._ref_state, self._kl_method = None, None
    if config.kl_method != names.FULL_KL:
      self._kl_method = names.resolve_kl_method(config.kl_method)
    else:
      graphdef, state = flax.nnx.split(self._reference_model())
      self._ref_state = (graphdef, flax.nnx.to_pure_dict(state))

  def _set_up_critic(self, critic) -> None:
    """The critic trainer's inputs, update timer and logged loss terms."""
    critic.with_gen_model_input_fn(self._critic_inputs)
    critic.with_training_hooks(timing.UpdateTimer(self.rl_cluster, "timing_s/update_critic"))
    if self._tunix_own[registry.VALUE_LOSSES]:
      critic.with_rl_metrics_to_log(compat.tunix_loss_metrics(self.algo_config)[1])
      return
    logged = ("vf_loss", "vpred_mean", "vf_clipfrac")
    critic.with_rl_metrics_to_log(dict.fromkeys(logged, np.mean))

  @property
  def has_critic(self) -> bool:
    """Whether the cluster has a critic (built for estimators that take values)."""
    return critic_trainer(self.rl_cluster) is not None

  def train(
    self, train_ds: Iterable[Any], eval_ds: Iterable[Any] | None = None, skip_jit: bool = False
  ) -> None:
    """tunix's training loop (same signature). The checkpoint tunix's trainers save as they
    close, when the newest one is older (a dataset that ends before `max_steps`), carries the
    global step and the learner's state as the scheduled ones do, so a rerun resumes it
    exactly (`compat.save_at_close`)."""
    with compat.save_at_close(self.rl_cluster, self._save_at_close):
      super().train(train_ds, eval_ds, skip_jit)

  def _save_at_close(self, trainer: Any) -> None:
    nan_guard.save_state(trainer, compat.metadata_after_the_step(self.rl_cluster, trainer))

  def after_global_step(self, seconds: float) -> None:
    """After each of tunix's global steps: `timing_s/step`, the NaN guard, the disk guard.

    The guard counts the updates skipped for a non-finite gradient and stops the run
    after `max_nonfinite_steps` in a row (`NonFiniteTrainingError`), or at the last
    step when the skips in a row at the end are at least half of the run's updates. The
    disk guard (`disk_space.DiskGuard`) stops it when the checkpoint directory's filesystem
    has no room for another checkpoint.
    """
    self.rl_cluster.buffer_metrics({"timing_s/step": (seconds, np.mean)}, mode=Mode.TRAIN)
    self.rl_cluster.buffer_metrics(self._nan_guard.after_global_step(), mode=Mode.TRAIN)
    cluster = self.rl_cluster
    if cluster.actor_trainer.train_steps >= cluster.cluster_config.training_config.max_steps:
      # the last step's checkpoint, when the schedule did not make one, is the one tunix's
      # trainers save as they close, with the resume metadata (`train`'s `save_at_close`)
      self._nan_guard.at_last_step()  # a run that ends skipping does not end as a success
      # tunix 0.1.7 closes the shared metrics logger with the actor trainer, before the
      # critic trainer writes its last step's metrics: write them while it is open.
      if self.has_critic:
        compat.write_pending_metrics(cluster.critic_trainer)
    if self._one_rollout_per_step():
      compat.log_step_metrics_now(cluster)
    self._check_disk()

  def _check_disk(self) -> None:
    """The disk guard; before it raises, the cluster is closed (metrics flushed, the
    checkpoint in flight finished, no unscheduled last save), so the checkpoints written so
    far stay intact and the newest resumes exactly."""
    if self._disk_guard is not None:
      stop = functools.partial(compat.close_without_a_last_save, self.rl_cluster)
      self._disk_guard.check(self.rl_cluster.global_steps + 1, stop=stop)

  def _one_rollout_per_step(self) -> bool:
    """Whether each global step makes one rollout (no mini-batches, no accumulation), so
    its metrics can be logged as soon as they are complete."""
    config = self.rl_cluster.cluster_config.training_config
    return config.mini_batch_size is None and config.gradient_accumulation_steps in (None, 1)

  # ----- trainer inputs -----

  def _temperature(self) -> float:
    """The temperature of the trainer's log-probs (`PpoExtConfig.logps_temperature`)."""
    return self.algo_config.logps_temperature or 1.0

  def _actor_inputs(self, example: TrainExample) -> dict[str, Any]:
    inputs = {
      "train_example": example,
      "algo_config": self.algo_config,
      "pad_id": self.rl_cluster.rollout.pad_id(),
      "eos_id": self.rl_cluster.rollout.eos_id(),
    }
    if self._tunix_own[registry.POLICY_LOSSES]:
      return inputs  # what tunix's PPOLearner gives its losses
    inputs["temperature"] = self._temperature()
    if self._ref_state is not None:
      inputs["ref_model"] = self._ref_state
    return inputs

  def _critic_inputs(self, example: TrainExample) -> dict[str, Any]:
    inputs = {
      "train_example": example,
      "clip_range_value": self.algo_config.clip_range_value,
      "pad_id": self.rl_cluster.rollout.pad_id(),
      "eos_id": self.rl_cluster.rollout.eos_id(),
    }
    if not self._tunix_own[registry.VALUE_LOSSES]:
      inputs["loss_agg_mode"] = self.algo_config.value_loss_agg_mode
    return inputs

  def num_generations(self) -> int:
    return self.algo_config.num_generations

  # ----- learner state in checkpoints -----

  def _learner_state(self) -> dict[str, Any]:
    state = {"kl_ctrl": self.kl_controller.state_dict()}
    state["critic_warmup"] = self.critic_warmup.state_dict()
    if hasattr(self.trajectory_source, "state_dict"):  # e.g. the rollout's sampling seeds
      state["trajectory_source"] = self.trajectory_source.state_dict()
    return state

  def _restore_learner_state(self) -> None:
    restored = compat.restored_metadata(self.rl_cluster.actor_trainer)
    if "kl_ctrl" in restored:
      self.kl_controller.load_state_dict(restored["kl_ctrl"])
    if "critic_warmup" in restored:
      self.critic_warmup.load_state_dict(restored["critic_warmup"])
    if "trajectory_source" in restored and hasattr(self.trajectory_source, "load_state_dict"):
      self.trajectory_source.load_state_dict(restored["trajectory_source"])

  # ----- models -----

  def _reference_model(self):
    return self.rl_cluster.inference_worker.get_model("reference")

  # ----- the rollout phase -----

  def _single_turn_batch(self, training_input: dict[str, Any], mode: Mode) -> TrajectoryBatch:
    """tunix's single-turn rollout: one completion per prompt, its score on the last token."""
    rollout_config = self.rl_cluster.get_rollout_config(mode)
    pad_id = self.rl_cluster.rollout.pad_id()
    self._check_prompt_lengths(training_input["prompts"], rollout_config.max_prompt_length)
    output = self.rl_cluster.generate(
      prompts=training_input["prompts"],
      mode=mode,
      micro_batch_size=compat.rollout_micro_batch_size(self),
    )
    completion_ids = np.array(
      [
        generate_utils.pad_to_length(
          tokens, rollout_config.max_tokens_to_generate, pad_id, left=False
        )
        for tokens in output.tokens
      ]
    )
    attention = (completion_ids != pad_id).astype(np.int32)
    prompt_ids = np.asarray(output.left_padded_prompt_tokens)
    scores = self._single_turn_scores(training_input, output.text, prompt_ids, completion_ids, mode)
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
      truncated=attention.sum(-1) >= rollout_config.max_tokens_to_generate,  # hit the limit
    )

  def _check_prompt_lengths(self, prompts: Sequence[str], max_prompt_length: int) -> None:
    """ValueError naming the first prompt that is not a string, or is longer than the
    sampler's `max_prompt_length`.

    Counts tokens as tunix's sampler does (BOS + text); tunix would otherwise fail with a
    cache-size error that names neither the prompt nor the setting.
    """
    tokenizer = self.rl_cluster.tokenizer
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

  def _single_turn_scores(self, training_input, texts, prompt_ids, completion_ids, mode):
    """Float32 scores `[B]` from the reward functions or the reward model."""
    if not compat.uses_reward_model(self):
      extra = {k: v for k, v in training_input.items() if k != "prompts"}
      scores = compat.compute_rewards(
        self, prompts=training_input["prompts"], completions=texts, mode=mode, **extra
      )
      scores = np.asarray(scores, np.float32)  # NaN rows: error, or NaN again to be dropped
      return self._nonfinite_rewards.mark_reported(scores, training_input["prompts"], texts)
    pad_id, eos_id = self.rl_cluster.rollout.pad_id(), self.rl_cluster.rollout.eos_id()
    attention = (completion_ids != pad_id).astype(np.int32)
    inputs = ModelInputs(
      jnp.asarray(prompt_ids),
      jnp.asarray(completion_ids),
      jnp.asarray(attention),
      jnp.asarray(attention, jnp.float32),
      pad_id,
      eos_id,
      self.algo_config.logps_temperature,
    )
    scores = self._passes.rewards(inputs)[:, -completion_ids.shape[1] :]
    last = np.maximum(attention.sum(-1) - 1, 0)
    return np.asarray(scores, np.float32)[np.arange(len(last)), last]

  def generate_and_compute_advantage(
    self, training_input: dict[str, Any], mode: Mode = Mode.TRAIN
  ) -> TrainExample:
    """The rollout phase of one step: trajectories to a `TrainExample` with advantages."""
    timer = timing.PhaseTimer()
    batch = self._trajectories(training_input, mode, timer)
    inputs = self._model_inputs(batch, mode)
    old_logps, values = self._old_logps_and_values(batch, inputs, timer, mode)
    rewards, ref_logps, per_token_kl = self._kl_penalty(batch, inputs, old_logps, timer, mode)
    warming_up = self.critic_warmup.active(self.rl_cluster.global_steps)
    groups = self._group_ids(batch)
    with timer("advantages"):
      advantages, returns = advantage_step.advantages_and_returns(
        self.algo_config,
        rewards,
        values,
        inputs.loss_mask,
        groups,
        warming_up=warming_up,
        has_critic=self.has_critic,
      )
      timer.ready((advantages, returns))
    noise = advantage_step.noise_metrics(
      self.algo_config, rewards, values, inputs.loss_mask, groups
    )
    self.rl_cluster.buffer_metrics({k: (v, np.mean) for k, v in noise.items()}, mode=mode)
    variance = self._buffer_rollout_metrics(
      batch, rewards, values, advantages, returns, per_token_kl, timer, mode
    )
    if mode == Mode.TRAIN:
      self._critic_warmup_rule(variance)
    self._buffer_user_metrics(training_input["prompts"], batch, advantages, mode)
    example = self._train_example(
      inputs, old_logps, ref_logps, values, advantages, returns, warming_up
    )
    example, corrected = rollout_correction.correct(self.algo_config, batch, example)
    self.rl_cluster.buffer_metrics({k: (v, np.mean) for k, v in corrected.items()}, mode=mode)
    self.rl_cluster.buffer_metrics(timer.metrics(), mode=mode)
    if mode == Mode.TRAIN and self._one_rollout_per_step():
      compat.log_step_metrics_now(self.rl_cluster)  # on disk before the step's checkpoint
    return example

  def _trajectories(self, training_input, mode: Mode, timer) -> TrajectoryBatch:
    """The batch of episodes (single-turn or the trajectory source's), rewards checked."""
    with timer("rollout"):
      if self.trajectory_source is None:
        batch = self._single_turn_batch(training_input, mode)
      else:
        context = RolloutContext(self.rl_cluster, self.algo_config)
        batch = self.trajectory_source(context, training_input, mode)
        if not isinstance(batch, TrajectoryBatch):
          source = type(self.trajectory_source).__name__
          raise TypeError(
            f"trajectory source {source} returned {type(batch).__name__}, not a TrajectoryBatch"
          )
    batch.validate(allow_nonfinite_rewards=True)
    batch, dropped = self._nonfinite_rewards.apply(batch)  # error, or drop and count
    self.rl_cluster.buffer_metrics({DROPPED_METRIC: (dropped, np.sum)}, mode=mode)
    return batch

  def _old_logps_and_values(self, batch, inputs: ModelInputs, timer, mode: Mode):
    """`(old_logps [B, T] or None, values [B, T])`: the rollout policy's log-probs, the
    critic's values. None when the update's own pass gives them (`old_logps_in_update`)."""
    old_logps = None
    if not self._old_logps_in_update:
      with timer("old_logp"):
        old_logps = timer.ready(self._passes.old_logps(inputs))
      self._buffer_logprob_gap(batch, old_logps, mode)
    if not self.has_critic:  # the estimator takes no values: zeros, never read
      return old_logps, jnp.zeros_like(inputs.loss_mask)
    with timer("values"):
      width = inputs.completion.shape[1]
      values = passes.predicting_positions(self._passes.values(inputs), width)
      values = timer.ready(values * inputs.loss_mask)
    return old_logps, values

  def _model_inputs(self, batch: TrajectoryBatch, mode: Mode) -> ModelInputs:
    rollout = self.rl_cluster.rollout
    return ModelInputs(
      prompt=jnp.asarray(batch.prompt_ids),
      completion=jnp.asarray(batch.completion_ids),
      attention_mask=jnp.asarray(batch.attention_mask, jnp.int32),
      loss_mask=jnp.asarray(batch.loss_mask, jnp.float32),
      pad_id=rollout.pad_id(),
      eos_id=rollout.eos_id(),
      temperature=self.algo_config.logps_temperature,
    )

  def _kl_penalty(self, batch, inputs: ModelInputs, old_logps, timer, mode: Mode):
    """`(rewards, ref_logps or None, per-token KL or None)`; updates the KL controller.

    With `kl_penalty="reward"` the rewards are `token_rewards - kl_coef * KL` (verl).
    """
    config, kl_coef = self.algo_config, self.kl_controller.value
    rewards = jnp.asarray(batch.token_rewards, jnp.float32)
    if config.kl_penalty == "none" or kl_coef <= 0:
      return rewards, None, None
    with timer("ref_logp"):
      ref_logps, per_token_kl = timer.ready(self._reference_kl(inputs, old_logps))
    per_token_kl = per_token_kl * inputs.loss_mask
    if config.kl_penalty == "reward":
      rewards = rewards - kl_coef * per_token_kl
    if mode == Mode.TRAIN:
      seq_kl = masked_mean(per_token_kl, inputs.loss_mask, axis=-1)
      self.kl_controller.update(float(jnp.mean(seq_kl)), n_steps=inputs.completion.shape[0])
    return rewards, ref_logps, per_token_kl

  def _train_example(
    self, inputs: ModelInputs, old_logps, ref_logps, values, advantages, returns, warming_up
  ):
    """tunix's `TrainExample` (loss mask as its `completion_mask`) plus ours; on a critic
    warm-up step the actor's loss is scaled by 0."""
    config = self.algo_config
    b = inputs.completion.shape[0]
    kl_in_loss = config.kl_penalty == "loss"
    example = TrainExample(
      prompt_ids=inputs.prompt,
      prompt_mask=(inputs.prompt != inputs.pad_id).astype(jnp.int32),
      completion_ids=inputs.completion,
      completion_mask=inputs.loss_mask,  # where our data enters tunix: the loss mask
      ref_per_token_logps=ref_logps if kl_in_loss else None,
      advantages=advantages,
      returns=returns,
      old_per_token_logps=old_logps,
      old_values=values,
      attention_mask=inputs.attention_mask,
      loss_mask=inputs.loss_mask,
      kl_coef=jnp.full((b,), self.kl_controller.value if kl_in_loss else 0.0, jnp.float32),
      actor_scale=jnp.full((b,), 0.0 if warming_up else 1.0, jnp.float32),
    )
    return self._packed(example) if config.packing else self._shared_prompts(example)

  def _packed(self, example: TrainExample) -> TrainExample:
    """`example` with its packing (`pack_slots`, `pack_rows`): each of the micro-batches
    tunix will slice it into (`train_chunk_sizes`) packed on its own. Rows tunix slices
    otherwise (sizes unknown or not adding up) train padded: still exact."""
    chunks = self.train_chunk_sizes
    if sum(chunks) != example.completion_ids.shape[0]:
      return example
    pad_id = self.rl_cluster.rollout.pad_id()
    slots, segment, k, rows = passes.plan_rows(
      example.prompt_ids, example.attention_mask, pad_id, list(chunks)
    )
    starts = jax.nn.one_hot(segment, rows * k, dtype=jnp.int8).reshape(-1, rows, k)
    return example.replace(pack_slots=jnp.asarray(slots), pack_rows=starts)

  def _shared_prompts(self, example: TrainExample) -> TrainExample:
    """`example` with `prompt_groups` (`math.shared_prompts`) when rows of a micro-batch
    share prompts (a group's): each update's pass then runs each distinct prompt once
    (`passes.SharedPrompts`), exactly as the padded rows. The distinct prompts are
    rounded up to a multiple of the actor's devices, which split them."""
    chunks = self.train_chunk_sizes
    if sum(chunks) != example.completion_ids.shape[0] or jax.process_count() > 1:
      return example  # several hosts: each holds part of the prompts
    mesh = self.rl_cluster.cluster_config.role_to_mesh[rl_cluster_lib.Role.ACTOR]
    devices = 1 if mesh.empty else mesh.size
    groups = plan_shared_prompts(np.asarray(example.prompt_ids), list(chunks), devices)
    return example if groups is None else example.replace(prompt_groups=jnp.asarray(groups))

  def _critic_warmup_rule(self, explained_variance: float | None) -> None:
    """After a training rollout: the warm-up's early end and its metrics."""
    step = self.rl_cluster.global_steps
    self.critic_warmup.after_rollout(step, explained_variance)
    metrics = self.critic_warmup.metrics(step)
    self.rl_cluster.buffer_metrics({k: (v, np.mean) for k, v in metrics.items()}, mode=Mode.TRAIN)

  def _buffer_logprob_gap(self, batch: TrajectoryBatch, old_logps, mode: Mode) -> None:
    """`rollout/logprob_diff`: mean |sampler - trainer| log-prob on agent tokens, when known."""
    if batch.sampler_logps is None:
      return
    gap = sampler_logprob_gap(batch, old_logps, batch.loss_mask)
    if np.isfinite(gap):
      self.rl_cluster.buffer_metrics({"rollout/logprob_diff": (gap, np.mean)}, mode=mode)

  def _reference_kl(self, inputs: ModelInputs, old_logps):
    """`(ref_logps or None, per-token KL [B, T])` of the rollout policy to the reference."""
    if self._kl_method is None:  # the exact KL over the vocabulary
      kl = passes.exact_kl(
        self._passes.kl_inputs(inputs, rl_cluster_lib.Role.ROLLOUT),
        self._passes.kl_inputs(inputs, rl_cluster_lib.Role.REFERENCE),
        temperature=self._temperature(),
        chunk_size=self.algo_config.logits_chunk_size,
      )
      return None, kl
    ref_logps = self._passes.ref_logps(inputs)
    kl = kl_lib.kl_divergence(
      old_logps,
      ref_logps,
      self._kl_method.estimator,
      self._kl_method.straight_through,
      self.algo_config.kl_clamp_value,
    )
    return ref_logps, kl

  def _group_ids(self, batch: TrajectoryBatch) -> np.ndarray:
    return advantage_step.group_ids(batch, self.algo_config.num_generations)

  def _buffer_rollout_metrics(self, batch, rewards, values, advantages, returns, kl, timer, mode):
    """`batch_stats.rollout_statistics` buffered; returns the critic's explained
    variance (None without a critic or agent tokens)."""
    coefficients = {
      "learner/kl_coef": float(self.kl_controller.value),
      "learner/entropy_coef": float(self.algo_config.entropy_coef),
    }
    stats, tunix_stats, variance = batch_stats.rollout_statistics(
      batch,
      rewards,
      values,
      advantages,
      returns,
      kl,
      groups=self._group_ids(batch),
      has_critic=self.has_critic,
      coefficients=coefficients,
      rollout_s=timer.seconds.get("rollout", 0.0),
    )
    self.rl_cluster.buffer_metrics({k: (v, np.mean) for k, v in stats.items()}, mode=mode)
    self.rl_cluster.buffer_metrics(tunix_stats, mode=mode)  # tunix's names, as stock PPO
    return variance

  def _buffer_user_metrics(self, prompts, batch: TrajectoryBatch, advantages, mode: Mode) -> None:
    """tunix's `metric_fns(prompts, completions, advantages, rewards)` on this batch.

    Each returns `{name: (value, aggregation)}`; a name without `/` lands in `custom/`.
    """
    for metric_fn in self.metric_fns:
      values = metric_fn(
        prompts=list(prompts),
        completions=batch.texts,
        advantages=advantages,
        rewards=np.asarray(batch.token_rewards).sum(-1),
      )
      self.rl_cluster.buffer_metrics(
        {metric_keys.custom_name(name): value for name, value in values.items()}, mode=mode
      )


def one_of(name: str, value: Any, old_name: str, old_value: Any) -> Any:
  """The one of two spellings of an argument given, as tunix's `alias_init_param` takes
  them: ValueError for both, TypeError for neither."""
  if value is not None and old_value is not None:
    raise ValueError(f"Cannot specify both '{name}' and '{old_name}'. Please use '{name}' only.")
  if value is None and old_value is None:
    raise TypeError(f"PpoExtLearner() missing required argument: '{name}' (or '{old_name}')")
  return old_value if value is None else value


def old_logps_in_update(config: PpoExtConfig, training_config: Any, tunix_loss: bool) -> bool:
  """Whether the actor's update computes the old log-probs itself, as tunix's GRPO does
  with one iteration: each batch trains one epoch (`num_iterations=1`) in one optimizer
  step (no `mini_batch_size`; gradient accumulation is one step), so the policy the update
  differentiates is the rollout policy and `old = stop_gradient(logps)` of the same pass,
  exactly (the ratio is 1, its gradient the policy gradient's). Not when anything reads the
  old log-probs before the update: the KL to the reference (its controller and metric),
  rollout correction, or tunix's own policy loss (which needs them on the example); nor
  with `recompute_old_logps`. Saves the old-log-prob pass, a forward pass over the batch
  (`timing_s/old_logp`); the sampler-trainer gap metric `rollout/logprob_diff` then has no
  trainer values to compare and is not logged."""
  one_update = config.num_iterations == 1 and training_config.mini_batch_size is None
  reads_them = config.kl_penalty != "none" or rollout_correction.enabled(config) or tunix_loss
  return one_update and not reads_them and not config.recompute_old_logps


def critic_trainer(rl_cluster: rl_cluster_lib.RLCluster):
  """The cluster's critic trainer, or None when it was built without a critic."""
  try:
    return rl_cluster.critic_trainer
  except AttributeError:  # RLCluster sets the trainer only for a critic
    return None


def check_critic(config: PpoExtConfig, critic) -> None:
  """ValueError when the estimator needs critic values and the cluster has no critic; a
  warning when a critic is there but unused (it is still trained, for nothing)."""
  if config.uses_critic and critic is None:
    raise ValueError(
      f"PpoExtConfig.advantage_estimator={config.advantage_estimator!r} takes critic values, "
      "but the RLCluster has no critic: build it with a critic model"
    )
  if critic is not None and not config.uses_critic:
    warnings.warn(
      f"advantage_estimator={config.advantage_estimator!r} uses no critic, yet the cluster "
      "has one: it is trained for nothing (build the cluster with critic=None)",
      stacklevel=3,
    )


def _rewards_come_from_the_source(prompts, completions, **kwargs) -> list[float]:
  """Placeholder reward fn that satisfies tunix's check; a trajectory source gives rewards."""
  raise RuntimeError("rewards come from the trajectory source; this function is never called")
