"""Adapters that register this package's losses and estimators in tunix's `function_registry`.

tunix's learners look functions up by name with fixed signatures; these wrappers
give them ours. Names are prefixed `ppo_ext` so tunix's own entries stay untouched.

- policy loss `ppo_ext`: `(model, train_example, algo_config, pad_id, eos_id, **kw)`
- value loss `ppo_ext`: `(model, train_example, clip_range_value, pad_id, eos_id, **kw)`
- PPO-style estimators `ppo_ext_gae`, `ppo_ext_reinforce_plus_plus`:
  `(rewards, values, completion_mask, gamma, gae_lambda) -> (advantages, returns)`
- GRPO-style estimators `ppo_ext_grpo`, `ppo_ext_drgrpo`, `ppo_ext_rloo`:
  `(rewards [B], num_generations) -> advantages [B]` over contiguous groups.

`register_in_tunix` puts what `tunix_ppo_ext.registry` resolves (plugins included) into
tunix's registry under the configured name: losses as they are (their signature is
tunix's), advantage estimators behind the adapter of the matching tunix signature.

A `train_example` may carry `attention_mask` (all real completion tokens), `loss_mask`
(agent tokens) and `kl_coef` (the controller's live value); without them tunix's
`completion_mask` serves as the loss mask and the attention mask is derived from padding,
exactly as in tunix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from tunix.rl import function_registry

from tunix_ppo_ext import advantages as adv_lib
from tunix_ppo_ext import common, losses, registry
from tunix_ppo_ext.logits import full_kl_divergence, logps_and_entropy

POLICY_LOSS_NAME = "ppo_ext"
VALUE_LOSS_NAME = "ppo_ext"


def _masks(train_example: Any) -> tuple[jax.Array | None, jax.Array]:
  """`(attention_mask or None, loss_mask)` of a tunix or tunix-ppo-ext train example."""
  attention_mask = getattr(train_example, "attention_mask", None)
  loss_mask = getattr(train_example, "loss_mask", None)
  return attention_mask, train_example.completion_mask if loss_mask is None else loss_mask


@function_registry.register_policy_loss_fn(POLICY_LOSS_NAME)
def ppo_ext_policy_loss_fn(
  model: nnx.Module,
  train_example: Any,
  algo_config: Any,
  pad_id: int,
  eos_id: int,
  temperature: float = 1.0,
  ref_model: tuple[Any, Any] | None = None,
  **kwargs: Any,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """PPO policy loss of `tunix_ppo_ext.losses.policy_loss` over one model pass.

  `ref_model`, `(graphdef, pure state dict)` of the reference, enables the exact
  full-vocabulary KL (`kl_method="full"`): the reference runs here with no gradient.
  An `actor_scale` of 0 on the example (critic warm-up) zeroes the loss and its gradient.
  """
  del kwargs
  attention_mask, loss_mask = _masks(train_example)
  chunk_size = getattr(algo_config, "logits_chunk_size", 0)
  passes = dict(pad_id=pad_id, eos_id=eos_id, completion_mask=attention_mask)
  prompt, completion = train_example.prompt_ids, train_example.completion_ids
  logits = common.compute_completion_logits(
    model, prompt, completion, stop_gradient=False, **passes
  )
  logps, entropy = logps_and_entropy(
    logits, completion, temperature=temperature, chunk_size=chunk_size
  )
  kl_in_loss = getattr(algo_config, "kl_penalty", "reward") == "loss"
  per_token_kl = None
  if kl_in_loss and ref_model is not None:
    ref_logits = common.compute_completion_logits(
      nnx.merge(*ref_model), prompt, completion, **passes
    )
    per_token_kl = full_kl_divergence(logits, ref_logits, temperature, chunk_size)
  kl_coef = _per_step_scalar(train_example, "kl_coef", getattr(algo_config, "kl_loss_coef", 0.0))
  loss, metrics = losses.policy_loss(
    logps,
    train_example.old_per_token_logps,
    train_example.advantages,
    loss_mask,
    epsilon_low=algo_config.epsilon_low,
    epsilon_high=algo_config.epsilon_high,
    epsilon_c=algo_config.epsilon_c,
    loss_agg_mode=getattr(algo_config, "loss_agg_mode", "token-mean"),
    entropy=entropy,
    entropy_coef=algo_config.entropy_coef or 0.0,
    ref_per_token_logps=train_example.ref_per_token_logps if kl_in_loss else None,
    kl_loss_coef=kl_coef,
    kl_method=algo_config.kl_method,
    kl_clamp_value=algo_config.kl_clamp_value,
    per_token_kl=per_token_kl,
  )
  return loss * _per_step_scalar(train_example, "actor_scale", 1.0), metrics


def _per_step_scalar(train_example: Any, name: str, default: float) -> jax.Array | float:
  """A per-step scalar the learner broadcasts to `[B]` on the example (so batches slice)."""
  value = getattr(train_example, name, None)
  return default if value is None else jnp.mean(value)


@function_registry.register_value_loss_fn(VALUE_LOSS_NAME)
def ppo_ext_value_loss_fn(
  model: nnx.Module,
  train_example: Any,
  clip_range_value: float | None,
  pad_id: int,
  eos_id: int,
  loss_agg_mode: str = "token-mean",
  **kwargs: Any,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped value loss of `tunix_ppo_ext.losses.value_loss` over one critic pass."""
  del kwargs
  attention_mask, loss_mask = _masks(train_example)
  scores = common.compute_score(
    model,
    train_example.prompt_ids,
    train_example.completion_ids,
    pad_id=pad_id,
    eos_id=eos_id,
    completion_mask=attention_mask,
    stop_gradient=False,
  )
  vpreds = scores[:, -train_example.completion_ids.shape[1] - 1 : -1]
  return losses.value_loss(
    vpreds,
    train_example.old_values,
    train_example.returns,
    loss_mask,
    clip_range_value=clip_range_value,
    loss_agg_mode=loss_agg_mode,
  )


@function_registry.register_advantage_estimator("ppo_ext_gae")
def ppo_ext_gae(rewards, values, completion_mask, gamma, gae_lambda):
  """Masked GAE (observation tokens skipped), whitened; tunix's PPO signature."""
  return adv_lib.compute_gae_advantages(rewards, values, completion_mask, gamma, gae_lambda)


@function_registry.register_advantage_estimator("ppo_ext_reinforce_plus_plus")
def ppo_ext_reinforce_plus_plus(rewards, values, completion_mask, gamma, gae_lambda):
  """REINFORCE++ returns, whitened; `values` and `gae_lambda` unused."""
  del values, gae_lambda
  return adv_lib.compute_reinforce_plus_plus_advantages(rewards, completion_mask, gamma)


def _contiguous_groups(rewards: jax.Array, num_generations: int) -> tuple[jax.Array, jax.Array]:
  scores = jnp.asarray(rewards, jnp.float32)
  group_ids = jnp.arange(scores.shape[0]) // num_generations
  return scores, group_ids


@function_registry.register_advantage_estimator("ppo_ext_grpo")
def ppo_ext_grpo(rewards, num_generations):
  """Group-normalised advantages per sequence (GRPO); tunix's GRPO signature."""
  scores, group_ids = _contiguous_groups(rewards, num_generations)
  ones = jnp.ones((scores.shape[0], 1), jnp.float32)
  return adv_lib.compute_grpo_advantages(scores, group_ids, ones)[:, 0]


@function_registry.register_advantage_estimator("ppo_ext_drgrpo")
def ppo_ext_drgrpo(rewards, num_generations):
  """Mean-centred group advantages (Dr. GRPO); tunix's GRPO signature."""
  scores, group_ids = _contiguous_groups(rewards, num_generations)
  ones = jnp.ones((scores.shape[0], 1), jnp.float32)
  return adv_lib.compute_grpo_advantages(scores, group_ids, ones, norm_by_std=False)[:, 0]


@function_registry.register_advantage_estimator("ppo_ext_rloo")
def ppo_ext_rloo(rewards, num_generations):
  """Leave-one-out baseline advantages (RLOO); tunix's GRPO signature."""
  scores, group_ids = _contiguous_groups(rewards, num_generations)
  ones = jnp.ones((scores.shape[0], 1), jnp.float32)
  return adv_lib.compute_rloo_advantages(scores, group_ids, ones)[:, 0]


_TUNIX_CATEGORIES = {
  registry.POLICY_LOSSES: function_registry._POLICY_LOSS_FN_CATEGORY,
  registry.VALUE_LOSSES: function_registry._VALUE_LOSS_FN_CATEGORY,
  registry.ADVANTAGE_ESTIMATORS: function_registry._ADVANTAGE_ESTIMATOR_CATEGORY,
}
_PUT_BY_US: dict[tuple[str, str], Any] = {}  # (category, name) -> what we put in tunix's registry


def register_in_tunix(kind: str, name: str, obj: Any) -> None:
  """Registers a registry object in tunix's `function_registry` as `name`, if not there yet.

  A name tunix already holds for another loss is refused (tunix's trainers would use that
  one); for advantage estimators tunix keeps its own and `PpoExtLearner` uses ours.

  Raises:
    ValueError: the loss name is taken in tunix's registry by another function.
  """
  category = _TUNIX_CATEGORIES[kind]
  tunix_registry = function_registry.default_registry
  if name in tunix_registry.list_functions(category) and (category, name) not in _PUT_BY_US:
    held = tunix_registry.get(category, name)
    if kind != registry.ADVANTAGE_ESTIMATORS and held is not obj:
      raise ValueError(
        f"tunix's function_registry already holds {category} {name!r} "
        f"({getattr(held, '__module__', '?')}.{getattr(held, '__qualname__', held)}), which "
        "tunix's trainers would use instead: choose another name"
      )
    return
  if _PUT_BY_US.get((category, name)) is not obj:
    value = tunix_advantage_estimator(obj) if kind == registry.ADVANTAGE_ESTIMATORS else obj
    tunix_registry.register(category, name)(value)
    _PUT_BY_US[(category, name)] = obj


def tunix_advantage_estimator(estimator: Callable[..., Any]) -> Callable[..., Any]:
  """A registry estimator behind tunix's signature: GRPO's if it takes `scores` (not
  `rewards`), `(rewards [B], num_generations) -> [B]`; else PPO's, `(rewards, values,
  completion_mask, gamma, gae_lambda) -> (advantages, returns)`, each sequence its own group.
  """
  wanted = adv_lib._wanted_inputs(estimator)  # pylint: disable=protected-access
  if wanted is not None and "scores" in wanted and "rewards" not in wanted:

    def grpo_signature(rewards, num_generations):
      scores, group_ids = _contiguous_groups(rewards, num_generations)
      ones = jnp.ones((scores.shape[0], 1), jnp.float32)
      advantages, _ = adv_lib.call_estimator(
        estimator, scores=scores, group_ids=group_ids, mask=ones
      )
      return advantages[:, 0]

    return grpo_signature

  def ppo_signature(rewards, values, completion_mask, gamma, gae_lambda):
    rewards = jnp.asarray(rewards, jnp.float32)
    return adv_lib.call_estimator(
      estimator,
      rewards=rewards,
      values=values,
      mask=completion_mask,
      scores=jnp.sum(rewards * completion_mask, axis=-1),
      group_ids=jnp.arange(rewards.shape[0]),
      gamma=gamma,
      gae_lambda=gae_lambda,
    )

  return ppo_signature
