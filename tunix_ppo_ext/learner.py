"""`PpoExtLearner`: tunix's `PPOLearner` with real masks, float rewards and every knob live.

It overrides tunix's hooks (`_generate_and_compute_advantage`, `_num_generations`, the
trainers' loss and input functions, the checkpoint metadata) and keeps tunix's training
loop, cluster, rollout engine, trainers and orbax checkpointing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import flax
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import utils as generate_utils
from tunix.rl import function_registry
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.ppo import ppo_learner
from tunix.sft import hooks

from tunix_ppo_ext import advantages as adv_lib
from tunix_ppo_ext import batch_stats, common, metric_keys, registry, robustness
from tunix_ppo_ext import kl as kl_lib
from tunix_ppo_ext._masked import masked_mean
from tunix_ppo_ext.config import PpoExtConfig

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


@dataclasses.dataclass
class TrajectoryBatch:
  """Pre-built trajectories for the learner (all NumPy, `B` rows).

  Attributes:
    prompt_ids: `[B, P]` left-padded prompt tokens.
    completion_ids: `[B, T]` completion tokens: agent turns and environment observations.
    attention_mask: `[B, T]` 1 on every real completion token, 0 on padding.
    loss_mask: `[B, T]` 1 on the agent's own tokens (a subset of `attention_mask`).
    token_rewards: `[B, T]` float rewards (turn rewards on the last agent token of a turn).
    sampler_logps: optional `[B, T]` log-probs the sampler reported for agent tokens.
    group_ids: optional `[B]` ints grouping samples of one prompt (group estimators).
    texts: optional completion texts (for user metric functions).
    episode_returns, num_turns, truncated, turn_limited: optional `[B]` episode outcomes
      (sum of environment rewards, agent turns, cut at the width, out of turns) for metrics.
  """

  prompt_ids: np.ndarray
  completion_ids: np.ndarray
  attention_mask: np.ndarray
  loss_mask: np.ndarray
  token_rewards: np.ndarray
  sampler_logps: np.ndarray | None = None
  group_ids: np.ndarray | None = None
  texts: list[str] | None = None
  episode_returns: np.ndarray | None = None
  num_turns: np.ndarray | None = None
  truncated: np.ndarray | None = None
  turn_limited: np.ndarray | None = None

  def validate(self, allow_nonfinite_rewards: bool = False) -> None:
    """Raises ValueError naming the field when shapes, masks or rewards are wrong.

    Masks must hold only 0 and 1. Token rewards must be finite unless
    `allow_nonfinite_rewards` (the learner then applies `PpoExtConfig.nonfinite_rewards`).
    """
    if np.ndim(self.completion_ids) != 2:
      raise ValueError(f"completion_ids shape {np.shape(self.completion_ids)} must be [B, T]")
    b, t = self.completion_ids.shape
    if self.prompt_ids.ndim != 2 or self.prompt_ids.shape[0] != b:
      raise ValueError(f"prompt_ids shape {self.prompt_ids.shape} must be [B={b}, P]")
    for name in ("attention_mask", "loss_mask", "token_rewards", "sampler_logps"):
      value = getattr(self, name)
      if value is not None and np.shape(value) != (b, t):
        raise ValueError(f"{name} shape {np.shape(value)} must equal completion_ids' {(b, t)}")
    for name in ("attention_mask", "loss_mask"):
      values = np.asarray(getattr(self, name))
      wrong = ~np.isin(values, (0, 1))
      if wrong.any():
        row = int(np.argwhere(wrong)[0][0])
        raise ValueError(
          f"{name} must hold only 0 and 1; row {row} holds {np.unique(values[wrong])[:5]}"
        )
    if np.any((self.loss_mask > 0) & (self.attention_mask == 0)):
      raise ValueError("loss_mask marks tokens that attention_mask marks as padding")
    rows = robustness.nonfinite_rows(self.token_rewards)
    if rows.size and not allow_nonfinite_rewards:
      raise ValueError(f"token_rewards contains NaN or inf in episode row(s) {rows.tolist()}")
    for name in ("group_ids", "episode_returns", "num_turns", "truncated", "turn_limited"):
      value = getattr(self, name)
      if value is not None and np.shape(value) != (b,):
        raise ValueError(f"{name} shape {np.shape(value)} must be [B={b}]")


class TrajectorySource(Protocol):
  """Builds a `TrajectoryBatch` for one batch of training input (e.g. a multi-turn rollout)."""

  def __call__(
    self, learner: PpoExtLearner, training_input: dict[str, Any], mode: Mode
  ) -> TrajectoryBatch: ...


class PpoExtLearner(ppo_learner.PPOLearner):
  """PPO over tunix with attention/loss masks kept apart and every `PpoExtConfig` knob live.

  Without a `trajectory_source` it trains single-turn prompts like tunix's PPO; with one,
  it trains the source's pre-built (e.g. multi-turn) trajectories.
  """

  def __init__(
    self,
    rl_cluster: rl_cluster_lib.RLCluster,
    ppo_config: PpoExtConfig,
    reward_fns: Callable[..., Any] | list[Callable[..., Any]] | None = None,
    metric_fns: Sequence[Callable[..., Any]] | None = None,
    data_shuffle_seed: int | None = None,
    trajectory_source: TrajectorySource | None = None,
  ):
    if not isinstance(ppo_config, PpoExtConfig):
      raise TypeError(f"ppo_config must be a PpoExtConfig, got {type(ppo_config).__name__}")
    if trajectory_source is not None and reward_fns is None:
      reward_fns = _rewards_come_from_the_source
    self._nonfinite_rewards = robustness.NonFiniteRewards(ppo_config.nonfinite_rewards)
    if trajectory_source is None and reward_fns is not None:  # catch NaN before tunix's nansum
      fns = list(reward_fns) if isinstance(reward_fns, Sequence) else [reward_fns]
      reward_fns = [self._nonfinite_rewards.check(fn) for fn in fns]
    super().__init__(
      rl_cluster=rl_cluster,
      ppo_config=ppo_config,
      reward_fns=reward_fns,
      metric_fns=metric_fns,
      data_shuffle_seed=data_shuffle_seed,
    )
    self.trajectory_source = trajectory_source
    config = ppo_config
    self.kl_controller = kl_lib.make_kl_controller(
      config.kl_ctrl, config.kl_coef, config.kl_target, config.kl_horizon
    )
    self._restore_learner_state()
    actor = rl_cluster.actor_trainer
    actor.custom_checkpoint_metadata_fn = _with_learner_state(
      actor.custom_checkpoint_metadata_fn, self._learner_state
    )
    actor.with_gen_model_input_fn(self._actor_inputs)
    rl_cluster.critic_trainer.with_gen_model_input_fn(self._critic_inputs)
    actor.with_training_hooks(_UpdateTimer(rl_cluster, "timing_s/update_actor"))
    rl_cluster.critic_trainer.with_training_hooks(
      _UpdateTimer(rl_cluster, "timing_s/update_critic")
    )
    actor.with_rl_metrics_to_log(
      {
        name: np.mean
        for name in ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy")
      }
      | ({"kl_loss": np.mean} if config.kl_penalty == "loss" else {})
    )
    rl_cluster.critic_trainer.with_rl_metrics_to_log(
      {"vf_loss": np.mean, "vpred_mean": np.mean, "vf_clipfrac": np.mean}
    )
    self._ref_state = None
    if config.kl_method == kl_lib.FULL_KL:
      # Plain arrays (no Variable objects) so the state can cross tunix's nnx.value_and_grad.
      graphdef, state = flax.nnx.split(self._reference_model())
      self._ref_state = (graphdef, flax.nnx.to_pure_dict(state))
    self._nan_guard = robustness.NanGuard(rl_cluster, config.max_nonfinite_steps)

  def _run_global_step(self, *args: Any, **kwargs: Any) -> None:
    """tunix's global step, timed (`timing_s/step`: rollout, updates and evaluation).

    Then the NaN guard counts the updates skipped for a non-finite gradient and stops the
    run after `max_nonfinite_steps` in a row (`robustness.NonFiniteTrainingError`).
    """
    start = time.perf_counter()
    super()._run_global_step(*args, **kwargs)
    self.rl_cluster.buffer_metrics(
      {"timing_s/step": (time.perf_counter() - start, np.mean)}, mode=Mode.TRAIN
    )
    self.rl_cluster.buffer_metrics(self._nan_guard.after_global_step(), mode=Mode.TRAIN)
    cluster = self.rl_cluster
    if cluster.actor_trainer.train_steps >= cluster.cluster_config.training_config.max_steps:
      # tunix 0.1.7 closes the shared metrics logger with the actor trainer, before the
      # critic trainer writes its last step's metrics: write them while it is open.
      cluster.critic_trainer._write_train_metrics()  # noqa: SLF001

  # ----- trainer inputs -----

  def _temperature(self, mode: Mode = Mode.TRAIN) -> float:
    temperature = self.rl_cluster.get_rollout_config(mode).temperature
    return float(temperature) if temperature and temperature > 0 else 1.0

  def _actor_inputs(self, example: TrainExample) -> dict[str, Any]:
    inputs = {
      "train_example": example,
      "algo_config": self.algo_config,
      "pad_id": self.rl_cluster.rollout.pad_id(),
      "eos_id": self.rl_cluster.rollout.eos_id(),
      "temperature": self._temperature(),
    }
    if self._ref_state is not None:
      inputs["ref_model"] = self._ref_state
    return inputs

  def _critic_inputs(self, example: TrainExample) -> dict[str, Any]:
    return {
      "train_example": example,
      "clip_range_value": self.algo_config.clip_range_value,
      "pad_id": self.rl_cluster.rollout.pad_id(),
      "eos_id": self.rl_cluster.rollout.eos_id(),
      "loss_agg_mode": self.algo_config.value_loss_agg_mode,
    }

  def _num_generations(self) -> int:
    return self.algo_config.num_generations

  # ----- learner state in checkpoints -----

  def _learner_state(self) -> dict[str, Any]:
    state = {"kl_ctrl": self.kl_controller.state_dict()}
    if hasattr(self.trajectory_source, "state_dict"):  # e.g. the rollout's sampling seeds
      state["trajectory_source"] = self.trajectory_source.state_dict()
    return state

  def _restore_learner_state(self) -> None:
    restored = getattr(self.rl_cluster.actor_trainer, "_restored_custom_metadata", None) or {}
    if "kl_ctrl" in restored:
      self.kl_controller.load_state_dict(restored["kl_ctrl"])
    if "trajectory_source" in restored and hasattr(self.trajectory_source, "load_state_dict"):
      self.trajectory_source.load_state_dict(restored["trajectory_source"])

  # ----- models -----

  def _reference_model(self):
    return self.rl_cluster.inference_worker.get_model("reference")

  def _critic_model(self):
    return self.rl_cluster.critic_trainer.model

  # ----- the rollout phase -----

  def _single_turn_batch(self, training_input: dict[str, Any], mode: Mode) -> TrajectoryBatch:
    """tunix's single-turn rollout: one completion per prompt, its score on the last token."""
    rollout_config = self.rl_cluster.get_rollout_config(mode)
    pad_id = self.rl_cluster.rollout.pad_id()
    self._check_prompt_lengths(training_input["prompts"], rollout_config.max_prompt_length)
    output = self.rl_cluster.generate(
      prompts=training_input["prompts"], mode=mode, micro_batch_size=self._rollout_micro_batch_size
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
    """ValueError naming the first prompt longer than the sampler's `max_prompt_length`.

    Counts tokens as tunix's sampler does (BOS + text); tunix would otherwise fail with a
    cache-size error that names neither the prompt nor the setting.
    """
    tokenizer = self.rl_cluster.tokenizer
    bos = [tokenizer.bos_id()] if tokenizer.bos_id() else []
    for row, prompt in enumerate(prompts):
      length = len(tokenizer.dedup_bos_ids(bos + list(tokenizer.encode(str(prompt)))))
      if length > max_prompt_length:
        raise ValueError(
          f"prompt of episode row {row} is {length} tokens (with BOS), longer than the rollout "
          f"max_prompt_length={max_prompt_length}: {str(prompt)[:80]!r}; shorten the prompt "
          "or raise max_prompt_length"
        )

  def _single_turn_scores(self, training_input, texts, prompt_ids, completion_ids, mode):
    """Float32 scores `[B]` from the reward functions or the reward model."""
    if not self._use_reward_model:
      extra = {k: v for k, v in training_input.items() if k != "prompts"}
      scores = self._compute_rewards(
        prompts=training_input["prompts"], completions=texts, mode=mode, **extra
      )
      scores = np.asarray(scores, np.float32)  # NaN rows: error, or NaN again to be dropped
      return self._nonfinite_rewards.mark_reported(scores, training_input["prompts"], texts)
    pad_id, eos_id = self.rl_cluster.rollout.pad_id(), self.rl_cluster.rollout.eos_id()
    scores = common.compute_score(
      self.rl_cluster.inference_worker.get_model("reward"),
      jnp.asarray(prompt_ids),
      jnp.asarray(completion_ids),
      pad_id=pad_id,
      eos_id=eos_id,
    )[:, -completion_ids.shape[1] :]
    last = np.maximum((completion_ids != pad_id).sum(-1) - 1, 0)
    return np.asarray(scores, np.float32)[np.arange(len(last)), last]

  def _generate_and_compute_advantage(
    self, training_input: dict[str, Any], mode: Mode = Mode.TRAIN
  ) -> TrainExample:
    config = self.algo_config
    timer = _Timer()
    with timer("rollout"):
      if self.trajectory_source is None:
        batch = self._single_turn_batch(training_input, mode)
      else:
        batch = self.trajectory_source(self, training_input, mode)
    batch.validate(allow_nonfinite_rewards=True)
    batch, dropped = self._nonfinite_rewards.apply(batch)  # error, or drop and count
    self.rl_cluster.buffer_metrics({robustness.DROPPED_METRIC: (dropped, np.sum)}, mode=mode)
    pad_id, eos_id = self.rl_cluster.rollout.pad_id(), self.rl_cluster.rollout.eos_id()
    prompt = jnp.asarray(batch.prompt_ids)
    completion = jnp.asarray(batch.completion_ids)
    attention = jnp.asarray(batch.attention_mask, jnp.int32)
    loss_mask = jnp.asarray(batch.loss_mask, jnp.float32)
    width = completion.shape[1]
    temperature = self._temperature(mode)
    passes = dict(pad_id=pad_id, eos_id=eos_id, completion_mask=attention)

    with timer("old_logp"):
      old_logps = timer.ready(
        common.compute_per_token_logps(
          self.rl_cluster.rollout.model(), prompt, completion, temperature=temperature, **passes
        )
      )
    self._buffer_logprob_gap(batch, old_logps, mode)
    with timer("values"):
      values = common.compute_score(self._critic_model(), prompt, completion, **passes)
      values = timer.ready(values[:, -width - 1 : -1] * loss_mask)

    kl_coef = self.kl_controller.value
    rewards = jnp.asarray(batch.token_rewards, jnp.float32)
    ref_logps, per_token_kl = None, None
    if config.kl_penalty != "none" and kl_coef > 0:
      with timer("ref_logp"):
        ref_logps, per_token_kl = timer.ready(
          self._reference_kl(prompt, completion, old_logps, temperature, passes)
        )
      per_token_kl = per_token_kl * loss_mask
      if config.kl_penalty == "reward":
        rewards = rewards - kl_coef * per_token_kl
      if mode == Mode.TRAIN:
        seq_kl = masked_mean(per_token_kl, loss_mask, axis=-1)
        self.kl_controller.update(float(jnp.mean(seq_kl)), n_steps=completion.shape[0])

    with timer("advantages"):
      advantages, returns = timer.ready(self._advantages(rewards, values, loss_mask, batch))
    self._buffer_rollout_metrics(
      batch, rewards, values, advantages, returns, per_token_kl, timer, mode
    )
    self._buffer_user_metrics(training_input["prompts"], batch, advantages, mode)
    self.rl_cluster.buffer_metrics(timer.metrics(), mode=mode)
    b = completion.shape[0]
    warming_up = self.rl_cluster.global_steps < config.critic_warmup_steps
    return TrainExample(
      prompt_ids=prompt,
      prompt_mask=(prompt != pad_id).astype(jnp.int32),
      completion_ids=completion,
      completion_mask=loss_mask,
      ref_per_token_logps=ref_logps if config.kl_penalty == "loss" else None,
      advantages=advantages,
      returns=returns,
      old_per_token_logps=old_logps,
      old_values=values,
      attention_mask=attention,
      loss_mask=loss_mask,
      kl_coef=jnp.full((b,), kl_coef if config.kl_penalty == "loss" else 0.0, jnp.float32),
      actor_scale=jnp.full((b,), 0.0 if warming_up else 1.0, jnp.float32),
    )

  def _buffer_logprob_gap(self, batch: TrajectoryBatch, old_logps, mode: Mode) -> None:
    """`rollout/logprob_diff`: mean |sampler - trainer| log-prob on agent tokens, when known."""
    if batch.sampler_logps is None:
      return
    from tunix_ppo_ext.rollout import sampler_logprob_gap  # noqa: PLC0415 (import cycle)

    gap = sampler_logprob_gap(batch, old_logps, batch.loss_mask)
    if np.isfinite(gap):
      self.rl_cluster.buffer_metrics({"rollout/logprob_diff": (gap, np.mean)}, mode=mode)

  def _reference_kl(self, prompt, completion, old_logps, temperature, passes):
    """`(ref_logps or None, per-token KL [B, T])` of the rollout policy to the reference."""
    config = self.algo_config
    reference = self._reference_model()
    if config.kl_method == kl_lib.FULL_KL:
      logits = common.compute_completion_logits(
        self.rl_cluster.rollout.model(), prompt, completion, **passes
      )
      ref_logits = common.compute_completion_logits(reference, prompt, completion, **passes)
      kl = kl_lib.full_kl_divergence(
        logits, ref_logits, temperature=temperature, chunk_size=config.logits_chunk_size
      )
      return None, kl
    ref_logps = common.compute_per_token_logps(
      reference, prompt, completion, temperature=temperature, **passes
    )
    kl = kl_lib.compute_kl_divergence(old_logps, ref_logps, config.kl_method, config.kl_clamp_value)
    return ref_logps, kl

  def _advantages(self, rewards, values, loss_mask, batch: TrajectoryBatch):
    """`(advantages [B, T], returns [B, T])` with the configured estimator.

    Names resolve in the plugin registry (built-ins included; its keyword protocol), else
    in tunix's `function_registry` (tunix's PPO signature).
    """
    config = self.algo_config
    name = config.advantage_estimator
    if registry.has(registry.ADVANTAGE_ESTIMATORS, name):
      scores = jnp.sum(rewards * loss_mask, axis=-1)
      group_ids = batch.group_ids
      if group_ids is None:
        group_ids = np.arange(scores.shape[0]) // config.num_generations
      return adv_lib.call_estimator(
        registry.get(registry.ADVANTAGE_ESTIMATORS, name),
        rewards=rewards,
        values=values,
        mask=loss_mask,
        scores=scores,
        group_ids=jnp.asarray(group_ids),
        gamma=config.gamma,
        gae_lambda=config.gae_lambda,
        whiten=config.whiten_advantages,
        norm_by_std=config.norm_adv_by_std,
      )
    estimator = function_registry.get_advantage_estimator(name)
    return estimator(
      rewards=rewards,
      values=values,
      completion_mask=loss_mask,
      gamma=config.gamma,
      gae_lambda=config.gae_lambda,
    )

  def _buffer_rollout_metrics(self, batch, rewards, values, advantages, returns, kl, timer, mode):
    """The batch statistics (`batch_stats`), reference KL, controller and critic fit."""
    mask = np.asarray(batch.loss_mask)
    values, returns = np.asarray(values), np.asarray(returns)
    stats = batch_stats.batch_statistics(
      loss_mask=mask,
      token_rewards=batch.token_rewards,
      rewards=rewards,
      values=values,
      advantages=advantages,
      returns=returns,
      episode_returns=batch.episode_returns,
      num_turns=batch.num_turns,
      truncated=batch.truncated,
      turn_limited=batch.turn_limited,
    )
    stats["learner/kl_coef"] = float(self.kl_controller.value)
    stats["learner/entropy_coef"] = float(self.algo_config.entropy_coef or 0.0)
    if kl is not None and mask.sum() > 0:
      stats["learner/kl"] = float(np.asarray(kl)[mask > 0].mean())
    variance = batch_stats.explained_variance(values, returns, mask)
    if variance is not None:
      stats["learner/explained_variance"] = variance
    rollout_s = timer.seconds.get("rollout", 0.0)
    if rollout_s > 0:
      stats["rollout/tokens_per_s"] = float(mask.sum()) / rollout_s
    self.rl_cluster.buffer_metrics({k: (v, np.mean) for k, v in stats.items()}, mode=mode)

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


class _Timer:
  """Wall seconds per named phase of the rollout step (`timing_s/<name>` metrics)."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str):
    start = time.perf_counter()
    yield
    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

  @staticmethod
  def ready(tree: Any) -> Any:
    """Waits for JAX's asynchronous dispatch so the phase is timed, not just launched."""
    return jax.block_until_ready(tree)

  def metrics(self) -> dict[str, tuple[float, Callable[..., Any]]]:
    return {f"timing_s/{name}": (value, np.mean) for name, value in self.seconds.items()}


class _UpdateTimer(hooks.TrainingHooks):
  """tunix training hooks that time one trainer's update phase (`train()` call) per step."""

  def __init__(self, cluster: rl_cluster_lib.RLCluster, name: str):
    self._cluster, self._name, self._start = cluster, name, 0.0

  def on_train_start(self, train_ctx: Any) -> None:
    self._start = time.perf_counter()

  def on_train_end(self, train_ctx: Any) -> None:  # tunix waits for the device first
    seconds = time.perf_counter() - self._start
    self._cluster.buffer_metrics({self._name: (seconds, np.sum)}, mode=Mode.TRAIN)

  def on_train_step_start(self, train_ctx: Any) -> None:
    pass

  def on_train_step_end(self, train_ctx: Any, train_step: int, train_loss: Any) -> None:
    pass

  def on_eval_step_start(self, train_ctx: Any) -> None:
    pass

  def on_eval_step_end(self, train_ctx: Any, eval_loss: Any) -> None:
    pass


def _rewards_come_from_the_source(prompts, completions, **kwargs) -> list[float]:
  """Placeholder reward fn that satisfies tunix's check; a trajectory source gives rewards."""
  raise RuntimeError("rewards come from the trajectory source; this function is never called")


def _with_learner_state(metadata_fn: Callable[[], dict], state_fn: Callable[[], dict]):
  """Checkpoint metadata of tunix's trainer plus the learner's own state."""

  def metadata() -> dict[str, Any]:
    return {**metadata_fn(), **state_fn()}

  return metadata
