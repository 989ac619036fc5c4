"""`PpoExtLearner`: tunix's `PPOLearner` with real masks, float rewards and every knob live.

An adapter between tunix's learner hooks (`compat.LearnerHooks`) and the pure rollout
phase (`_src/ppo/rollout_phase.py`): it runs the models' passes (`RolePasses`) and hands
everything between "trajectories arrived" and "a `TrainExample` and its metrics" to the
rollout phase, whose state (`PhaseState`: the KL controller's, the critic warm-up's) it
holds and checkpoints. It keeps tunix's training loop, cluster, rollout engine, trainers
and orbax checkpointing, and changes nothing outside its own objects and the cluster it is
given (`compat.prepare`: that cluster's sampler and its actor trainer's checkpoint metadata;
`compat.install` changes qwix and tunix's registry).
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.ppo import ppo_learner

from tunix_ppo_ext._src.data.rewards import DROPPED_METRIC, NonFiniteRewards
from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.ops import kl_methods
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.ppo import (
  advantage_step,
  rollout_correction_step,
  rollout_phase,
  shadow_step,
)
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.cluster import disk_space, nan_guard, timing
from tunix_ppo_ext._src.tunix.learner import loss_fns, passes, shadow_gradients, trainer_setup
from tunix_ppo_ext._src.tunix.learner.ppo_config import PpoExtConfig
from tunix_ppo_ext._src.tunix.learner.role_passes import ModelInputs, RolePasses
from tunix_ppo_ext._src.tunix.learner.single_turn import SingleTurn
from tunix_ppo_ext._src.tunix.rollout.context import RolloutContext, TrajectorySource

Mode = rl_cluster_lib.Mode
Role = rl_cluster_lib.Role


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


_NO_BATCH = object()  # `train`'s marker of a `train_ds` that ends at once


class AlreadyAtMaxSteps(UserWarning):
  """`PpoExtLearner.train` on a learner whose actor is at `max_steps`: nothing trained."""


class PpoExtLearner(compat.LearnerHooks):
  """PPO over tunix with attention/loss masks kept apart and every `PpoExtConfig` knob live.

  Without a `trajectory_source` it trains single-turn prompts like tunix's PPO; with one,
  it trains the source's pre-built (e.g. multi-turn) trajectories. `state` is the rollout
  phase's (`rollout_phase.PhaseState`), restored from the actor's checkpoint.
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
    shadow_estimators: Sequence[str] = (),
  ):
    """tunix's `PPOLearner` arguments, in either spelling: tunix 0.1.7 names them
    `rl_cluster` and `ppo_config`, tunix main `rl_engine` (`rl_cluster` still accepted
    there) and `algo_config`; both spellings work on both versions, one of each pair.
    `shadow_estimators`: advantage estimators measured beside the run's own on every
    training batch (`shadow/<name>/*`: their noise on one scale and the two halves'
    policy-gradient agreement; `ppo.shadow_step`), none by default."""
    rl_cluster = compat.one_of("rl_engine", rl_engine, "rl_cluster", rl_cluster)
    config = compat.one_of("algo_config", algo_config, "ppo_config", ppo_config)
    if not isinstance(config, PpoExtConfig):
      raise TypeError(f"ppo_config must be a PpoExtConfig, got {type(config).__name__}")
    nonfinite = NonFiniteRewards(config.nonfinite_rewards)
    reward_fns = checked_reward_fns(reward_fns, trajectory_source, nonfinite)
    critic = trainer_setup.critic_trainer(rl_cluster)
    trainer_setup.check_critic(config, critic)
    compat.init_learner(self, rl_cluster, config, reward_fns, metric_fns, data_shuffle_seed)
    self.trajectory_source, self.has_critic = trajectory_source, critic is not None
    key = "PpoExtLearner(shadow_estimators=...)"
    self._shadow = shadow_step.check_shadow_estimators(shadow_estimators, self.has_critic, key)
    restored = compat.restored_metadata(rl_cluster.actor_trainer)
    self.state = rollout_phase.initial_state(config, restored)
    if "trajectory_source" in restored and hasattr(trajectory_source, "load_state_dict"):
      trajectory_source.load_state_dict(restored["trajectory_source"])
    prompts = compat.logps_micro_batch_size(self)  # tunix counts prompts; a pass sees rows
    rows = None if prompts is None else prompts * config.num_generations  # as tunix's GRPO
    self._passes = RolePasses(
      rl_cluster, rows, config.fused_head, config.logits_chunk_size, config.packing
    )
    self._single_turn = SingleTurn(self, self._passes, nonfinite)
    self._nonfinite_rewards = nonfinite
    self._set_up(rl_cluster, config, critic)
    self._nan_guard = nan_guard.NanGuard(rl_cluster, config.max_nonfinite_steps)
    self._disk_guard = disk_space.guard_for(rl_cluster)
    self._check_disk()  # before the first step

  def _set_up(self, rl_cluster: rl_cluster_lib.RLCluster, config: PpoExtConfig, critic) -> None:
    """The reference's KL (an estimator of its log-probs, or the reference model's state for
    `kl_method: full`: plain arrays, which can cross tunix's `nnx.value_and_grad`), the
    trainers' losses, inputs, checkpoint metadata and update timers."""
    self._kl_method, ref_state = None, None
    if config.kl_method != kl_methods.FULL_KL:
      self._kl_method = kl_methods.resolve_kl_method(config.kl_method)
    else:
      graphdef, state = flax.nnx.split(rl_cluster.inference_worker.get_model("reference"))
      ref_state = (graphdef, flax.nnx.to_pure_dict(state))
    self._inputs = trainer_setup.TrainerInputs(
      rl_cluster, config, config.logps_temperature or 1.0, ref_state
    )
    timer = functools.partial(timing.UpdateTimer, rl_cluster)
    trainer_setup.set_up_actor(rl_cluster.actor_trainer, self._inputs)
    # this cluster's own objects only (a hand-built one too): its sampler, the checkpoints'
    # learner state
    compat.prepare(rl_cluster, checkpoint_metadata=self._learner_state)
    rl_cluster.actor_trainer.with_training_hooks(timer("timing_s/update_actor"))
    if critic is not None:
      trainer_setup.set_up_critic(critic, self._inputs, [timer("timing_s/update_critic")])
    # the old log-probs come from the update's own pass when the policy cannot have moved
    self._old_logps_in_update = rollout_phase.old_logps_in_update(
      config,
      rl_cluster.cluster_config.training_config,
      self._inputs.tunix_own[registry.POLICY_LOSSES],
    )
    mesh = rl_cluster.cluster_config.role_to_mesh[Role.ACTOR]
    self._actor_devices = 1 if mesh.empty else mesh.size

  def train(
    self, train_ds: Iterable[Any], eval_ds: Iterable[Any] | None = None, skip_jit: bool = False
  ) -> None:
    """tunix's training loop (same signature). The checkpoint tunix's trainers save as they
    close, when the newest one is older (a dataset that ends before `max_steps`), carries the
    global step and the learner's state as the scheduled ones do, so a rerun resumes it
    exactly (`compat.save_at_close`).

    A learner already at `max_steps` (a second call, or a restored finished run) trains
    nothing and warns: tunix's loop would run one step past it. A `train_ds` without a
    batch is a ValueError naming it (tunix's loop raised a bare `StopIteration`)."""
    done = self.rl_cluster.actor_trainer.train_steps
    max_steps = self.rl_cluster.cluster_config.training_config.max_steps
    if max_steps is not None and done >= max_steps:
      warnings.warn(
        f"PpoExtLearner.train: already at max_steps={max_steps} (the actor trainer's step "
        f"{done}): nothing to train; raise RLTrainingConfig.max_steps to train further",
        AlreadyAtMaxSteps,
        stacklevel=2,
      )
      compat.close_without_a_last_save(self.rl_cluster)  # as tunix's loop ends
      return
    batches = iter(train_ds)
    first = next(batches, _NO_BATCH)
    if first is _NO_BATCH:
      raise ValueError(
        f"PpoExtLearner.train: train_ds holds no batch ({type(train_ds).__name__} is "
        "empty); give an iterable of batches, each a dict with 'prompts'"
      )
    with compat.save_at_close(self.rl_cluster, self._save_at_close):
      super().train(itertools.chain([first], batches), eval_ds, skip_jit)

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
    cluster = self.rl_cluster
    self._buffer({"timing_s/step": (seconds, np.mean)}, Mode.TRAIN)
    self._buffer(self._nan_guard.after_global_step(), Mode.TRAIN)
    if cluster.actor_trainer.train_steps >= cluster.cluster_config.training_config.max_steps:
      # the last step's checkpoint, when the schedule did not make one, is the one tunix's
      # trainers save as they close, with the resume metadata (`train`'s `save_at_close`)
      self._nan_guard.at_last_step()  # a run that ends skipping does not end as a success
      # tunix 0.1.7 closes the shared metrics logger with the actor trainer, before the
      # critic trainer writes its last step's metrics: write them while it is open.
      if self.has_critic:
        compat.write_pending_metrics(cluster.critic_trainer)
    if one_rollout_per_step(cluster):
      compat.log_step_metrics_now(cluster)
    self._check_disk()

  def _check_disk(self) -> None:
    """The disk guard; before it raises, the cluster is closed (metrics flushed, the
    checkpoint in flight finished, no unscheduled last save), so the checkpoints written so
    far stay intact and the newest resumes exactly."""
    if self._disk_guard is not None:
      stop = functools.partial(compat.close_without_a_last_save, self.rl_cluster)
      self._disk_guard.check(self.rl_cluster.global_steps + 1, stop=stop)

  def num_generations(self) -> int:
    return self.algo_config.num_generations

  def _learner_state(self) -> dict[str, Any]:
    """The checkpoint's learner state: the rollout phase's, the trajectory source's."""
    state = self.state.to_metadata()
    if hasattr(self.trajectory_source, "state_dict"):  # e.g. the rollout's sampling seeds
      state["trajectory_source"] = self.trajectory_source.state_dict()
    return state

  def _buffer(self, metrics: dict[str, Any], mode: Mode) -> None:
    if metrics:
      self.rl_cluster.buffer_metrics(metrics, mode=mode)

  # ----- the rollout phase -----

  def generate_and_compute_advantage(
    self, training_input: dict[str, Any], mode: Mode = Mode.TRAIN, chunk_sizes=()
  ) -> TrainExample:
    """The rollout phase of one step: trajectories, the models' passes, then
    `rollout_phase` to a `TrainExample` with advantages, laid out for the micro-batches of
    `chunk_sizes` rows tunix slices it into (`_layout`)."""
    config, timer = self.algo_config, timing.PhaseTimer()
    batch = self._trajectories(training_input, mode, timer)
    inputs = model_inputs(batch, self.rl_cluster.rollout, config.logps_temperature)
    model_passes = self._model_passes(batch, inputs, timer, mode)
    fallback = loss_fns.tunix_estimator(config.advantage_estimator)
    where = rollout_phase.Step(
      self.rl_cluster.global_steps, mode == Mode.TRAIN, self.has_critic, fallback
    )
    result = rollout_phase.rollout_phase(
      config, self.state, where, batch, inputs, model_passes, timer
    )
    self.state = result.state
    self._buffer(result.metrics, mode)
    if self._shadow and mode == Mode.TRAIN:
      with timer("shadow"):
        self._buffer(self._shadow_metrics(batch, inputs, model_passes, result), mode)
    prompts = training_input["prompts"]
    for metrics in rollout_phase.user_metrics(self.metric_fns, prompts, batch, result.advantages):
      self._buffer(metrics, mode)
    example = self._layout(TrainExample(**result.fields), chunk_sizes)
    example, corrected = rollout_correction_step.correct(config, batch, example)
    self._buffer({k: (v, np.mean) for k, v in corrected.items()}, mode)
    self._buffer(timer.metrics(), mode)
    if mode == Mode.TRAIN and one_rollout_per_step(self.rl_cluster):
      compat.log_step_metrics_now(self.rl_cluster)  # on disk before the step's checkpoint
    return example

  def _shadow_metrics(self, batch, inputs: ModelInputs, model_passes, result) -> dict[str, Any]:
    """`shadow/<name>/*` of every shadow estimator (`shadow_step`), the run's own
    estimator's gradient agreement beside them (`shadow/<own>/grad_cosine`)."""
    config = self.algo_config
    groups = advantage_step.group_ids(batch, config.num_generations)
    terms = (result.rewards, model_passes.values, inputs.loss_mask, groups)
    anchors = batch.anchor_ids
    found, metrics = shadow_step.shadow_advantages(config, self._shadow, terms, anchors)
    found.setdefault(config.advantage_estimator, np.asarray(result.advantages, np.float32))
    model = self.rl_cluster.actor_trainer.model
    halves = shadow_step.halves(groups)
    cosines = shadow_gradients.gradient_agreement(
      model, inputs, np.stack(list(found.values())), halves
    )
    for name, cosine in zip(found, cosines, strict=True):
      metrics[f"{shadow_step.PREFIX}/{name}/grad_cosine"] = float(cosine)
    return {k: (v, np.mean) for k, v in metrics.items()}

  def _trajectories(self, training_input, mode: Mode, timer) -> TrajectoryBatch:
    """The batch of episodes (single-turn or the trajectory source's), rewards checked."""
    with timer("rollout"):
      if self.trajectory_source is None:
        batch = self._single_turn(training_input, mode)
      else:
        context = RolloutContext(self.rl_cluster, self.algo_config)
        batch = self.trajectory_source(context, training_input, mode)
        if not isinstance(batch, TrajectoryBatch):
          source = type(self.trajectory_source).__name__
          raise TypeError(
            f"trajectory source {source} returned {type(batch).__name__}, not a TrajectoryBatch"
          )
    batch.validate(allow_nonfinite_rewards=True)
    self._buffer(batch.metrics or {}, mode)  # the source's own (`TrajectoryBatch.metrics`)
    batch, dropped = self._nonfinite_rewards.apply(batch)  # error, or drop and count
    self.rl_cluster.buffer_metrics({DROPPED_METRIC: (dropped, np.sum)}, mode=mode)
    return batch

  def _model_passes(self, batch, inputs: ModelInputs, timer, mode: Mode) -> rollout_phase.Passes:
    """The rollout policy's log-probs (None when the update's own pass gives them:
    `old_logps_in_update`), the critic's values (zeros, never read, without a critic) and,
    when the step takes a KL, the reference's log-probs and the per-token KL."""
    old_logps = None
    if not self._old_logps_in_update:
      with timer("old_logp"):
        old_logps = timer.ready(self._passes.old_logps(inputs))
      self._buffer(rollout_phase.logprob_gap(batch, old_logps), mode)
    values = jnp.zeros_like(inputs.loss_mask)
    if self.has_critic:
      with timer("values"):
        width = inputs.completion.shape[1]
        values = passes.predicting_positions(self._passes.values(inputs), width)
        values = timer.ready(values * inputs.loss_mask)
    if not rollout_phase.needs_reference(self.algo_config, self.state):
      return rollout_phase.Passes(old_logps, values)
    with timer("ref_logp"):
      ref_logps, per_token_kl = timer.ready(self._reference_kl(inputs, old_logps))
    return rollout_phase.Passes(old_logps, values, ref_logps, per_token_kl)

  def _reference_kl(self, inputs: ModelInputs, old_logps):
    """`(ref_logps or None, per-token KL [B, T])` of the rollout policy to the reference."""
    if self._kl_method is None:  # the exact KL over the vocabulary
      kl = passes.exact_kl(
        self._passes.kl_inputs(inputs, Role.ROLLOUT),
        self._passes.kl_inputs(inputs, Role.REFERENCE),
        temperature=self._inputs.temperature,
        chunk_size=self.algo_config.logits_chunk_size,
      )
      return None, kl
    ref_logps = self._passes.ref_logps(inputs)
    kl = self._kl_method.divergence(old_logps, ref_logps, self.algo_config.kl_clamp_value)
    return ref_logps, kl

  def _layout(self, example: TrainExample, chunk_sizes: Sequence[int]) -> TrainExample:
    """`example` laid out for tunix's micro-batches (`rollout_phase.micro_batch_layout`:
    packed, or each distinct prompt once); padded when their sizes are unknown."""
    pad_id = self.rl_cluster.rollout.pad_id()
    layout = rollout_phase.micro_batch_layout(
      example.prompt_ids,
      example.attention_mask,
      chunk_sizes,
      pad_id,
      packing=self.algo_config.packing,
      devices=self._actor_devices,
    )
    return example.replace(**layout) if layout else example


def model_inputs(batch: TrajectoryBatch, rollout: Any, temperature: float | None) -> ModelInputs:
  """A batch as the passes' inputs, with the engine's pad and EOS ids."""
  return ModelInputs(
    prompt=jnp.asarray(batch.prompt_ids),
    completion=jnp.asarray(batch.completion_ids),
    attention_mask=jnp.asarray(batch.attention_mask, jnp.int32),
    loss_mask=jnp.asarray(batch.loss_mask, jnp.float32),
    pad_id=rollout.pad_id(),
    eos_id=rollout.eos_id(),
    temperature=temperature,
  )


def one_rollout_per_step(rl_cluster: rl_cluster_lib.RLCluster) -> bool:
  """Whether each global step makes one rollout (no mini-batches, no accumulation), so
  its metrics can be logged as soon as they are complete."""
  config = rl_cluster.cluster_config.training_config
  return config.mini_batch_size is None and config.gradient_accumulation_steps in (None, 1)


def checked_reward_fns(reward_fns: Any, trajectory_source: Any, nonfinite: NonFiniteRewards) -> Any:
  """The reward functions tunix gets: each wrapped to catch NaN before tunix's nansum;
  with a trajectory source and none given, the source's own rewards."""
  if trajectory_source is not None:
    return _rewards_come_from_the_source if reward_fns is None else reward_fns
  if reward_fns is None:
    return None
  fns = list(reward_fns) if isinstance(reward_fns, Sequence) else [reward_fns]
  return [nonfinite.check(fn) for fn in fns]


def _rewards_come_from_the_source(prompts, completions, **kwargs) -> list[float]:
  """Placeholder reward fn that satisfies tunix's check; a trajectory source gives rewards."""
  raise RuntimeError("rewards come from the trajectory source; this function is never called")
