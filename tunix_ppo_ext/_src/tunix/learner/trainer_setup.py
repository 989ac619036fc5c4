"""How this package's learners set up tunix's trainers: the configured losses (taken from
the plugin registry, else tunix's own, never registered anywhere), the inputs each loss
gets, the loss terms logged, and the critic's presence."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.learner import loss_fns


def critic_trainer(rl_cluster: Any) -> Any:
  """The cluster's critic trainer, or None when it was built without a critic."""
  try:
    return rl_cluster.critic_trainer
  except AttributeError:  # RLCluster sets the trainer only for a critic
    return None


CRITIC_FREE = "grpo, rloo, reinforce_plus_plus or gigpo"  # estimators that take no values


def check_critic(config: Any, critic: Any, *, agentic: bool = False) -> None:
  """ValueError when the estimator needs critic values and the cluster has no critic, in
  the names its user typed (`agentic`: `AgenticPpoConfig` and tunix's pipeline YAML, else
  `PpoExtConfig` and `RLCluster`); a warning when a critic is there but unused (it is still
  trained, for nothing)."""
  if config.uses_critic and critic is None and agentic:
    raise ValueError(
      f"AgenticPpoConfig.advantage_estimator={config.advantage_estimator!r} (the pipeline "
      "YAML's agentic_ppo_config.advantage_estimator) takes critic values, but the rl_engine "
      "has no critic: build it with a critic model (the YAML's critic_model_config), or "
      f"choose {CRITIC_FREE}"
    )
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


def has_reference(rl_cluster: Any) -> bool:
  """Whether the cluster was built with a reference model."""
  try:
    rl_cluster.inference_worker.get_model("reference")
  except ValueError:  # tunix: "Model role reference is not available."
    return False
  return True


def check_reference(config: Any, rl_cluster: Any, owner: str) -> None:
  """ValueError (one line, naming `owner`'s key) when the config takes a KL to the reference
  (`kl_penalty` `reward` with `beta > 0`, or `loss` with `kl_loss_coef > 0`) and the
  cluster has no reference model: else the first rollout fails inside tunix."""
  if config.kl_penalty == "none" or config.kl_coef <= 0 or has_reference(rl_cluster):
    return
  if config.kl_penalty == "reward":
    key, fix = f"{owner}.beta={config.beta!r}", "beta=0"
  else:
    key = f"{owner}.kl_penalty='loss' with kl_loss_coef={config.kl_loss_coef!r}"
    fix = "kl_loss_coef=0"
  raise ValueError(
    f"{key} takes a KL to the reference model, but the engine has none: build it with a "
    f"reference, or set {fix} (or kl_penalty='none')"
  )


@dataclasses.dataclass(frozen=True)
class TrainerInputs:
  """The inputs of the actor's and the critic's loss for an example. tunix's own losses
  (only tunix's registry holds the name, e.g. `ppo`) get what tunix's `PPOLearner` gives
  them; ours also the temperature, the reference's state (`kl_method: full`) and the value
  loss's aggregation mode."""

  rl_cluster: Any
  config: Any  # the PpoExtConfig
  temperature: float | Callable[[], float]  # of the trainer's log-probs (or read per call)
  ref_state: Any = None  # (graphdef, pure dict) of the reference model, or None
  tunix_own: Mapping[str, bool] = dataclasses.field(init=False)  # per loss kind

  def __post_init__(self):
    kinds = {
      registry.POLICY_LOSSES: self.config.policy_loss_fn,
      registry.VALUE_LOSSES: self.config.value_loss_fn,
    }
    own = {kind: loss_fns.tunix_own(kind, name) for kind, name in kinds.items()}
    object.__setattr__(self, "tunix_own", own)

  def _ids(self) -> dict[str, int]:
    rollout = self.rl_cluster.rollout
    return {"pad_id": rollout.pad_id(), "eos_id": rollout.eos_id()}

  def actor(self, example: Any) -> dict[str, Any]:
    inputs = {"train_example": example, "algo_config": self.config, **self._ids()}
    if self.tunix_own[registry.POLICY_LOSSES]:
      return inputs  # what tunix's PPOLearner gives its losses
    temperature = self.temperature
    inputs["temperature"] = temperature() if callable(temperature) else temperature
    if self.ref_state is not None:
      inputs["ref_model"] = self.ref_state
    return inputs

  def critic(self, example: Any) -> dict[str, Any]:
    inputs = {"train_example": example, "clip_range_value": self.config.clip_range_value}
    inputs |= self._ids()
    if not self.tunix_own[registry.VALUE_LOSSES]:
      inputs["loss_agg_mode"] = self.config.value_loss_agg_mode
    return inputs


def _set_up(
  trainer: Any, kind: str, loss_name: str, input_fn: Any, hooks: Sequence[Any], logged: Any
) -> None:
  """One trainer's loss (`loss_name` of plugin `kind`), inputs, training hooks and logged
  terms (`logged`: name -> reducer)."""
  trainer.with_loss_fn(loss_fns.configured_loss(kind, loss_name), has_aux=True)
  trainer.with_gen_model_input_fn(input_fn)
  for hook in hooks:
    trainer.with_training_hooks(hook)
  trainer.with_rl_metrics_to_log(logged)


def set_up_actor(actor: Any, inputs: TrainerInputs, hooks: Sequence[Any] = ()) -> None:
  """The actor trainer's loss (the configured policy loss, as tunix 0.1.7 installs it:
  tunix main's closure takes only `train_example` and `algo_config`), inputs, training
  hooks and logged terms."""
  config = inputs.config
  if inputs.tunix_own[registry.POLICY_LOSSES]:  # tunix's aux keys and reducer
    logged = compat.tunix_loss_metrics(config)[0]
  else:
    names = ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy")
    kl_loss = ("kl_loss",) if config.kl_penalty == "loss" else ()
    logged = dict.fromkeys((*names, *kl_loss), np.mean)
  _set_up(actor, registry.POLICY_LOSSES, config.policy_loss_fn, inputs.actor, hooks, logged)


def set_up_critic(critic: Any, inputs: TrainerInputs, hooks: Sequence[Any] = ()) -> None:
  """The critic trainer's loss (the configured value loss), inputs, hooks, logged terms."""
  config = inputs.config
  if inputs.tunix_own[registry.VALUE_LOSSES]:
    logged = compat.tunix_loss_metrics(config)[1]
  else:
    logged = dict.fromkeys(("vf_loss", "vpred_mean", "vf_clipfrac"), np.mean)
  _set_up(critic, registry.VALUE_LOSSES, config.value_loss_fn, inputs.critic, hooks, logged)
