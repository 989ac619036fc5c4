"""The rollout phase's arithmetic, from a batch of episodes and the models' passes over it
to a `TrainExample`'s fields, the step's metrics and the learner's next state (no tunix).

A learner (`PpoExtLearner`, `AgenticPpoLearner`) runs the models; everything between
"trajectories arrived" and "a `TrainExample` and its metrics" is here, as functions of an
explicit `PhaseState`:

- the reward's KL shaping, `r_t - beta * KL_t` with `kl_penalty="reward"` (verl), and the KL
  controller's update from the batch's mean sequence KL (Ziegler et al. 2019);
- values and advantages of the configured estimator (`advantage_step`), with the value
  targets' lambda of a critic warm-up step;
- the critic warm-up's rule after a training rollout (`config.critic_warmup.CriticWarmup`);
- the rollout statistics, the advantage noise and the warm-up's metrics;
- the micro-batch layout plans (`packing`, shared prompts) of the rows tunix will slice.

`config` is a `PpoExtConfig`, read by attribute; `inputs` a `role_passes.ModelInputs` (or
anything with its `prompt`, `completion`, `attention_mask`, `loss_mask`, `pad_id`).
Metrics are `{name: (value, reducer)}`, as tunix's `buffer_metrics` takes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tunix_ppo_ext._src.config.critic_warmup import CriticWarmup
from tunix_ppo_ext._src.data.trajectory import sampler_logprob_gap
from tunix_ppo_ext._src.metrics import keys as metric_keys
from tunix_ppo_ext._src.metrics import stats as batch_stats
from tunix_ppo_ext._src.ops import kl as kl_lib
from tunix_ppo_ext._src.ops.masked import masked_mean
from tunix_ppo_ext._src.ops.packing import plan_rows
from tunix_ppo_ext._src.ops.shared_prompts import plan_shared_prompts
from tunix_ppo_ext._src.ppo import advantage_step, rollout_correction_step

Metrics = dict[str, tuple[Any, Callable[..., Any]]]


@dataclasses.dataclass(frozen=True)
class PhaseState:
  """What the rollout phase carries from one step to the next, as the checkpoint's
  metadata holds it: the KL controller's state (`kl_ctrl`) and the critic warm-up's."""

  kl_ctrl: Mapping[str, float]
  critic_warmup: Mapping[str, Any]

  def to_metadata(self) -> dict[str, Any]:
    """`{"kl_ctrl": ..., "critic_warmup": ...}`: the checkpoint's learner state."""
    return {"kl_ctrl": dict(self.kl_ctrl), "critic_warmup": dict(self.critic_warmup)}


@dataclasses.dataclass(frozen=True)
class Passes:
  """The models' outputs over a batch's rows (`[B, T]` each)."""

  old_logps: Any | None  # the rollout policy's; None: the update's own pass gives them
  values: Any  # the critic's on agent tokens (zeros without a critic)
  ref_logps: Any | None = None  # the reference's, when a KL estimator took them
  per_token_kl: Any | None = None  # the KL to the reference; None: no KL this step


@dataclasses.dataclass(frozen=True)
class PhaseResult:
  """One rollout phase: the example's fields, the terms metrics read, the next state."""

  fields: dict[str, Any]  # the `TrainExample`'s (tunix's and ours)
  rewards: Any  # [B, T] after the KL shaping
  advantages: Any  # [B, T]
  returns: Any  # [B, T]
  metrics: Metrics
  state: PhaseState


class _NoTimer:
  """A phase timer that times nothing (`cluster.timing.PhaseTimer`'s interface)."""

  seconds: Mapping[str, float] = {}

  def __call__(self, name: str) -> contextlib.nullcontext:
    return contextlib.nullcontext()

  @staticmethod
  def ready(tree: Any) -> Any:
    return tree


NO_TIMER = _NoTimer()


def kl_controller(config: Any, state: PhaseState | None = None) -> Any:
  """The configured KL controller (`math.kl`), at `state` when given."""
  controller = kl_lib.make_kl_controller(
    config.kl_ctrl, config.kl_coef, config.kl_target, config.kl_horizon
  )
  if state is not None:
    controller.load_state_dict(dict(state.kl_ctrl))
  return controller


def critic_warmup(config: Any, state: PhaseState | None = None) -> CriticWarmup:
  """The configured critic warm-up, at `state` when given."""
  warmup = CriticWarmup(
    config.critic_warmup_steps, config.critic_warmup_until_ev, config.critic_warmup_patience
  )
  if state is not None:
    warmup.load_state_dict(dict(state.critic_warmup))
  return warmup


def initial_state(config: Any, metadata: Mapping[str, Any] | None = None) -> PhaseState:
  """The state a run starts from: the configured one, or a checkpoint's (`to_metadata`)."""
  metadata = metadata or {}
  controller, warmup = kl_controller(config), critic_warmup(config)
  if "kl_ctrl" in metadata:
    controller.load_state_dict(metadata["kl_ctrl"])
  if "critic_warmup" in metadata:
    warmup.load_state_dict(metadata["critic_warmup"])
  return PhaseState(controller.state_dict(), warmup.state_dict())


def kl_coef(config: Any, state: PhaseState) -> float:
  """The KL coefficient `beta` of this step."""
  return float(kl_controller(config, state).value)


def needs_reference(config: Any, state: PhaseState) -> bool:
  """Whether this step takes the KL to the reference (a penalty with `beta > 0`)."""
  return config.kl_penalty != "none" and kl_coef(config, state) > 0


def warming_up(config: Any, state: PhaseState, step: int) -> bool:
  """Whether global step `step` trains only the critic."""
  return critic_warmup(config, state).active(step)


def kl_penalty(
  config: Any, state: PhaseState, token_rewards: Any, passes: Passes, loss_mask: Any, train: bool
) -> tuple[Any, Any | None, PhaseState]:
  """`(rewards [B, T], masked per-token KL or None, state)`: the KL shaping and, on a
  training step, the controller's update.

  `rewards = token_rewards - beta * KL` with `kl_penalty="reward"` (else `token_rewards`);
  the controller sees `mean_b masked_mean_t KL` over `B` rows (`n_steps=B`).
  """
  rewards = jnp.asarray(token_rewards, jnp.float32)
  if passes.per_token_kl is None:
    return rewards, None, state
  per_token_kl = passes.per_token_kl * loss_mask
  if config.kl_penalty == "reward":
    rewards = rewards - kl_coef(config, state) * per_token_kl
  if train:
    controller = kl_controller(config, state)
    seq_kl = masked_mean(per_token_kl, loss_mask, axis=-1)
    controller.update(float(jnp.mean(seq_kl)), n_steps=per_token_kl.shape[0])
    state = dataclasses.replace(state, kl_ctrl=controller.state_dict())
  return rewards, per_token_kl, state


def after_rollout(
  config: Any, state: PhaseState, step: int, explained_variance: float | None
) -> tuple[PhaseState, Metrics]:
  """After a training rollout: the warm-up's early end (`CriticWarmup.after_rollout`) and
  its metrics."""
  warmup = critic_warmup(config, state)
  warmup.after_rollout(step, explained_variance)
  metrics = {k: (v, np.mean) for k, v in warmup.metrics(step).items()}
  return dataclasses.replace(state, critic_warmup=warmup.state_dict()), metrics


def rollout_metrics(
  config: Any,
  batch: Any,
  terms: tuple[Any, Any, Any, Any, Any],
  groups: np.ndarray,
  *,
  kl_coef_now: float,
  has_critic: bool,
  rollout_s: float = 0.0,
) -> tuple[Metrics, float | None]:
  """`(metrics, explained variance)`: `metrics.stats.rollout_statistics` of `terms`
  (`rewards, values, advantages, returns, kl`) with the step's coefficients, tunix's own
  statistics among them."""
  coefficients = {
    "learner/kl_coef": float(kl_coef_now),
    "learner/entropy_coef": float(config.entropy_coef),
  }
  stats, tunix_stats, variance = batch_stats.rollout_statistics(
    batch,
    *terms,
    groups=groups,
    has_critic=has_critic,
    coefficients=coefficients,
    rollout_s=rollout_s,
  )
  return {k: (v, np.mean) for k, v in stats.items()} | tunix_stats, variance


def user_metrics(
  metric_fns: Sequence[Callable[..., Any]], prompts: Sequence[Any], batch: Any, advantages: Any
) -> list[Metrics]:
  """tunix's `metric_fns(prompts, completions, advantages, rewards)` on this batch, one
  dict each (`{name: (value, reducer)}`); a name without `/` lands in `custom/`."""
  found = []
  for metric_fn in metric_fns:
    values = metric_fn(
      prompts=list(prompts),
      completions=batch.texts,
      advantages=advantages,
      rewards=np.asarray(batch.token_rewards).sum(-1),
    )
    found.append({metric_keys.custom_name(name): value for name, value in values.items()})
  return found


def logprob_gap(batch: Any, old_logps: Any) -> Metrics:
  """`rollout/logprob_diff`: mean |sampler - trainer| log-prob on agent tokens, when the
  sampler's are known (`{}` otherwise)."""
  if batch.sampler_logps is None:
    return {}
  gap = sampler_logprob_gap(batch, old_logps, batch.loss_mask)
  return {"rollout/logprob_diff": (gap, np.mean)} if np.isfinite(gap) else {}


def example_fields(
  config: Any, inputs: Any, passes: Passes, advantages: Any, returns: Any, *, beta: float
) -> dict[str, Any]:
  """The `TrainExample`'s fields but `actor_scale`: tunix's (the loss mask as its
  `completion_mask`) and ours, `kl_coef` `[B]` `beta` when the KL is in the loss (else 0)."""
  kl_in_loss = config.kl_penalty == "loss"
  return {
    "prompt_ids": inputs.prompt,
    "prompt_mask": (inputs.prompt != inputs.pad_id).astype(jnp.int32),
    "completion_ids": inputs.completion,
    "completion_mask": inputs.loss_mask,  # where our data enters tunix: the loss mask
    "ref_per_token_logps": passes.ref_logps if kl_in_loss else None,
    "advantages": advantages,
    "returns": returns,
    "old_per_token_logps": passes.old_logps,
    "old_values": passes.values,
    "attention_mask": inputs.attention_mask,
    "loss_mask": inputs.loss_mask,
    "kl_coef": jnp.full((inputs.completion.shape[0],), beta if kl_in_loss else 0.0, jnp.float32),
  }


@dataclasses.dataclass(frozen=True)
class Step:
  """Where a rollout phase runs: the global step, whether it trains, the models it has."""

  step: int
  train: bool
  has_critic: bool
  fallback: Callable[..., Any] | None = None  # tunix's estimator of a name not ours


def rollout_phase(
  config: Any,
  state: PhaseState,
  where: Step,
  batch: Any,
  inputs: Any,
  passes: Passes,
  timer: Any = NO_TIMER,
) -> PhaseResult:
  """One rollout phase after the models' passes: KL shaping and the controller's update,
  advantages and returns (the warm-up's targets on a warm-up step, the actor's loss scaled
  by 0 there: `actor_scale`), the metrics, the warm-up's rule on a training step.

  `timer` (`cluster.timing.PhaseTimer`) times the advantages as `timing_s/advantages`."""
  warm = warming_up(config, state, where.step)
  rewards, kl, state = kl_penalty(
    config, state, batch.token_rewards, passes, inputs.loss_mask, where.train
  )
  groups = advantage_step.group_ids(batch, config.num_generations)
  terms = (config, rewards, passes.values, inputs.loss_mask, groups)
  anchors = getattr(batch, "anchor_ids", None)
  with timer("advantages"):
    advantages, returns = advantage_step.advantages_and_returns(
      *terms,
      warming_up=warm,
      has_critic=where.has_critic,
      fallback=where.fallback,
      anchors=anchors,
    )
    timer.ready((advantages, returns))
  raw = advantage_step.unnormalized_advantages(*terms, where.fallback, anchors)
  noise = batch_stats.advantage_noise(raw, inputs.loss_mask)
  noise |= advantage_step.common_scale_noise(
    config, rewards, inputs.loss_mask, groups, (raw, advantages, returns), anchors
  )
  if anchors is not None and config.advantage_estimator == "gigpo":
    noise |= batch_stats.step_group_statistics(anchors, groups, inputs.loss_mask)
  metrics = {k: (v, np.mean) for k, v in noise.items()}
  beta = kl_coef(config, state)
  stats, variance = rollout_metrics(
    config,
    batch,
    (rewards, passes.values, advantages, returns, kl),
    groups,
    kl_coef_now=beta,
    has_critic=where.has_critic,
    rollout_s=timer.seconds.get("rollout", 0.0),
  )
  metrics |= stats
  if where.train:
    state, warmup_metrics = after_rollout(config, state, where.step, variance)
    metrics |= warmup_metrics
  fields = example_fields(config, inputs, passes, advantages, returns, beta=beta)
  fields["actor_scale"] = jnp.full((len(groups),), 0.0 if warm else 1.0, jnp.float32)
  return PhaseResult(fields, rewards, advantages, returns, metrics, state)


def micro_batch_layout(
  prompt_ids: Any,
  attention_mask: Any,
  chunk_sizes: Sequence[int],
  pad_id: int,
  *,
  packing: bool,
  devices: int = 1,
) -> dict[str, Any]:
  """The example's layout fields for the micro-batches tunix slices its `[B, P]` prompt and
  `[B, T]` attention mask into (`chunk_sizes` rows each): with `packing`, `pack_slots`
  and `pack_rows` (each micro-batch packed on its own, `math.packing.plan_rows`); else
  `prompt_groups` (`math.shared_prompts`: each distinct prompt of a micro-batch once,
  rounded up to a multiple of the actor's `devices`) when rows share prompts. `{}`
  (trained padded: still exact) when the sizes are unknown or do not add up, and for
  shared prompts on several hosts (each holds part of the prompts)."""
  if sum(chunk_sizes) != prompt_ids.shape[0]:
    return {}
  if packing:
    slots, segment, k, rows = plan_rows(prompt_ids, attention_mask, pad_id, list(chunk_sizes))
    starts = jax.nn.one_hot(segment, rows * k, dtype=jnp.int8).reshape(-1, rows, k)
    return {"pack_slots": jnp.asarray(slots), "pack_rows": starts}
  if jax.process_count() > 1:
    return {}
  groups = plan_shared_prompts(np.asarray(prompt_ids), list(chunk_sizes), devices)
  return {} if groups is None else {"prompt_groups": jnp.asarray(groups)}


def old_logps_in_update(config: Any, training_config: Any, tunix_loss: bool) -> bool:
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
  reads_them = config.kl_penalty != "none" or rollout_correction_step.enabled(config) or tunix_loss
  return one_update and not reads_them and not config.recompute_old_logps
