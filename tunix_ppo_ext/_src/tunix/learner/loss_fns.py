"""This package's losses and estimators in tunix's signatures, for tunix's `function_registry`.

tunix's learners look functions up by name with fixed signatures; these wrappers give
them ours. Nothing is registered at import, nor by this package's learners (they take
their losses from `configured_loss`): `register_in_tunix(kind, name, obj)` puts a
plugin-registry object into tunix's registry under `name` through `compat.install`
(losses as they are, their signature is tunix's; advantage estimators behind the adapter
of the matching tunix signature), for tunix's own learners.

- policy loss `ppo_ext`: `(model, train_example, algo_config, pad_id, eos_id, **kw)`
- value loss `ppo_ext`: `(model, train_example, clip_range_value, pad_id, eos_id, **kw)`
- `tunix_advantage_estimator(fn)`: a plugin estimator behind tunix's PPO signature
  `(rewards, values, completion_mask, gamma, gae_lambda) -> (advantages, returns)` or its
  GRPO signature `(rewards [B], num_generations) -> advantages [B]` (contiguous groups).

A `train_example` may carry `attention_mask` (all real completion tokens), `loss_mask`
(agent tokens) and `kl_coef` (the controller's live value); without them tunix's
`completion_mask` serves as the loss mask and the attention mask is derived from padding,
exactly as in tunix. With `pack_slots` and `pack_rows` (`example_packing`), or `pack_slots`
and tunix's packed `segment_ids`, the pass runs on packed rows; with `prompt_groups`, each
distinct prompt once (`passes.SharedPrompts`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tunix_ppo_ext._src.data.trajectory import contiguous_group_ids
from tunix_ppo_ext._src.ops import advantages
from tunix_ppo_ext._src.ops import kl_methods as names
from tunix_ppo_ext._src.ops import ppo_losses as losses
from tunix_ppo_ext._src.ops.logits import fused_logps_and_entropy, logps_and_entropy
from tunix_ppo_ext._src.ops.packing import Packing
from tunix_ppo_ext._src.plugins import protocols, registry
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.learner import passes

POLICY_LOSS_NAME = "ppo_ext"
VALUE_LOSS_NAME = "ppo_ext"


def _masks(train_example: Any) -> tuple[jax.Array | None, jax.Array]:
  """`(attention_mask or None, loss_mask)` of a tunix or tunix-ppo-ext train example."""
  attention_mask = getattr(train_example, "attention_mask", None)
  loss_mask = getattr(train_example, "loss_mask", None)
  return attention_mask, train_example.completion_mask if loss_mask is None else loss_mask


def example_packing(train_example: Any) -> Packing | passes.SharedPrompts | None:
  """The example's row layout for its passes: its `Packing` (its `pack_slots` `[B, P+T]`;
  its `pack_rows` `[B, R, k]` gives the packed shape, `R` rows of `k` batch widths,
  static; without them, tunix's packed rows `segment_ids` `[R, L]`: `agentic_packing`),
  its `SharedPrompts` (its `prompt_groups` `[B, U]`), or None for padded rows."""
  groups = getattr(train_example, "prompt_groups", None)
  if groups is not None:
    return passes.SharedPrompts(groups)
  slots = getattr(train_example, "pack_slots", None)
  if slots is None:
    return None
  if getattr(train_example, "pack_rows", None) is None:  # tunix's packed rows: their shape
    return Packing(slots, *train_example.segment_ids.shape)
  _, rows, k = train_example.pack_rows.shape
  return Packing(slots, rows, k * slots.shape[1])


def policy_pass(
  model: nnx.Module,
  train_example: Any,
  algo_config: Any,
  pad_id: int,
  eos_id: int,
  temperature: float,
  ref_model: tuple[Any, Any] | None,
) -> dict[str, Any]:
  """One policy pass, shared by every policy loss: `logps`, `old_logps` (the example's, or
  when it has none `stop_gradient(logps)`: the rollout policy is the one being updated),
  `entropy` `[B, T]`, `loss_mask`,
  `per_token_kl` (KL in the loss: the exact full-vocabulary KL when `ref_model` is given with
  `kl_method="full"`, else the configured estimator on the example's reference log-probs;
  None without KL in the loss), `kl_coef` and
  `is_weights` (the rollout-correction weights on the example, or None).

  `ref_model`, `(graphdef, pure state dict)` of the reference, runs here with no gradient.
  The arguments are the policy loss's, as called (`tunix_policy_loss`: its signature holds
  the defaults).
  """
  attention_mask, loss_mask = _masks(train_example)
  chunk_size = getattr(algo_config, "logits_chunk_size", 0)
  fused = getattr(algo_config, "fused_head", False)  # no [B, T, V] logits
  pass_kw = dict(pad_id=pad_id, eos_id=eos_id, attention_mask=attention_mask)
  pass_kw["packing"] = example_packing(train_example)
  ids = (train_example.prompt_ids, train_example.completion_ids)
  kw = dict(temperature=temperature, chunk_size=chunk_size)

  def head_of(policy: nnx.Module) -> Any:
    return passes.completion_head(policy, *ids, fused_head=fused, stop_gradient=False, **pass_kw)

  def logps_of(head: Any) -> tuple[jax.Array, jax.Array]:
    if fused:  # head: (hidden [B, T, D], weight [D, V])
      return fused_logps_and_entropy(*head, ids[1], **kw)
    return logps_and_entropy(head, ids[1], **kw)  # head: logits [B, T, V]

  kl_in_loss = getattr(algo_config, "kl_penalty", "reward") == "loss"
  scale = getattr(train_example, "actor_scale", None)
  if scale is not None and not (kl_in_loss and ref_model is not None):  # the KL needs `head`
    logps, entropy = backward_unless_zero(lambda m: logps_of(head_of(m)), model, jnp.mean(scale))
  else:
    head = head_of(model)
    logps, entropy = logps_of(head)
  per_token_kl = None
  if kl_in_loss and ref_model is not None:
    ref_head = passes.completion_head(nnx.merge(*ref_model), *ids, fused_head=fused, **pass_kw)
    per_token_kl = passes.exact_kl(head, ref_head, **kw)
  elif kl_in_loss and train_example.ref_per_token_logps is not None:
    per_token_kl = _estimated_kl(algo_config, logps, train_example.ref_per_token_logps)
  old_logps = train_example.old_per_token_logps
  if old_logps is None:  # the learner left them to this pass (`old_logps_in_update`)
    old_logps = jax.lax.stop_gradient(logps)
  return {
    "logps": logps,
    "old_logps": old_logps,
    "entropy": entropy,
    "loss_mask": loss_mask,
    "per_token_kl": per_token_kl,
    "kl_coef": per_step_scalar(train_example, "kl_coef", getattr(algo_config, "kl_loss_coef", 0.0)),
    "is_weights": getattr(train_example, "rollout_is_weights", None),
  }


def backward_unless_zero(
  fn: Callable[[nnx.Module], Any], model: nnx.Module, scale: jax.Array
) -> Any:
  """`fn(model)`, whose backward pass to the trained parameters runs only where `scale` (a
  scalar) is not 0.

  A critic warm-up step multiplies the actor's loss by 0 (`actor_scale`): its gradient is
  0 whatever the policy's backward pass computes, so the pass is skipped there (a
  `lax.cond` in a custom VJP; both branches are compiled once). The forward pass, and so
  the loss's metrics, are the same; elsewhere the gradient is `fn`'s own. The trained
  parameters are the ones tunix's trainer differentiates: the LoRA adapters when the model
  has any, else every `nnx.Param`.
  """
  graphdef, trained, rest = nnx.split(model, passes.trained_filter(model), ...)

  @jax.custom_vjp
  def gated(trained: Any, rest: Any, scale: jax.Array) -> Any:
    return fn(nnx.merge(graphdef, trained, rest))

  def forward(trained: Any, rest: Any, scale: jax.Array) -> tuple[Any, Any]:
    out, pullback = jax.vjp(lambda t: fn(nnx.merge(graphdef, t, rest)), trained)
    return out, (pullback, trained, rest, scale)

  def backward(residuals: Any, cotangent: Any) -> tuple[Any, Any, jax.Array]:
    pullback, trained, rest, scale = residuals
    grads = jax.lax.cond(
      scale == 0, lambda: jax.tree.map(jnp.zeros_like, trained), lambda: pullback(cotangent)[0]
    )
    return grads, jax.tree.map(jnp.zeros_like, rest), jnp.zeros_like(scale)

  gated.defvjp(forward, backward)
  return gated(trained, rest, scale)


PolicyLoss = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
# `(policy_pass's terms, train_example, algo_config) -> (loss, metrics)`
LossOfPass = Callable[[dict[str, Any], Any, Any], tuple[jax.Array, dict[str, jax.Array]]]

# the docstring of a `tunix_policy_loss` after its summary line
_POLICY_LOSS_DOC = """

  `ref_model`, `(graphdef, pure state dict)` of the reference, enables the exact
  full-vocabulary KL (`kl_method="full"`): the reference runs here with no gradient.
  An `actor_scale` of 0 on the example (critic warm-up) zeroes the loss and its gradient,
  without running the policy's backward pass (`backward_unless_zero`).

  Args:
    model: the policy being trained (an `nnx.Module`).
    train_example: tunix's `TrainExample` of the micro-batch (prompt and completion ids,
      masks, advantages, old and reference log-probs; this package's extra fields).
    algo_config: the learner's `PpoExtConfig` (clip ranges, loss options, KL settings).
    pad_id: the padding token's id.
    eos_id: the end-of-sequence token's id.
    temperature: the sampling temperature the logits are divided by.
    ref_model: `(graphdef, pure state dict)` of the reference model, for the exact
      full-vocabulary KL; None otherwise.
    **kwargs: further arguments tunix passes; ignored.

  Returns:
    `(loss, metrics)`: float32 scalar loss and the loss's metrics (`pg_loss`,
    `pg_clipfrac`, `pg_clipfrac_lower`, `ppo_kl`, `entropy` / `kl_loss` when present).
  """


def tunix_policy_loss(name: str, summary: str, loss_of_pass: LossOfPass) -> PolicyLoss:
  """The policy loss `name` in tunix's policy-loss signature: one `policy_pass`, then
  `loss_of_pass(terms, train_example, algo_config)` on its terms, the loss times the
  example's `actor_scale`. `summary` (one line) heads its docstring. `ppo_ext` and verl's
  losses (`verl_loss_fns`) are made so."""

  def policy_loss_fn(
    model: nnx.Module,
    train_example: Any,
    algo_config: Any,
    pad_id: int,
    eos_id: int,
    temperature: float = 1.0,
    ref_model: tuple[Any, Any] | None = None,
    **kwargs: Any,
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    del kwargs
    terms = policy_pass(model, train_example, algo_config, pad_id, eos_id, temperature, ref_model)
    loss, metrics = loss_of_pass(terms, train_example, algo_config)
    return loss * per_step_scalar(train_example, "actor_scale", 1.0), metrics

  policy_loss_fn.__name__ = policy_loss_fn.__qualname__ = name
  policy_loss_fn.__doc__ = summary + _POLICY_LOSS_DOC
  return policy_loss_fn


def _ppo_ext_loss(
  terms: dict[str, Any], train_example: Any, algo_config: Any
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`ops.ppo_losses.policy_loss` with the config's knobs on one policy pass's terms."""
  return losses.policy_loss(
    terms["logps"],
    terms["old_logps"],
    train_example.advantages,
    terms["loss_mask"],
    epsilon_low=algo_config.epsilon_low,
    epsilon_high=algo_config.epsilon_high,
    epsilon_c=algo_config.epsilon_c,
    loss_agg_mode=getattr(algo_config, "loss_agg_mode", "token-mean"),
    entropy=terms["entropy"],
    entropy_coef=algo_config.entropy_coef or 0.0,
    kl_loss_coef=terms["kl_coef"],
    per_token_kl=terms["per_token_kl"],
    is_weights=terms["is_weights"],
  )


ppo_ext_policy_loss_fn = tunix_policy_loss(
  "ppo_ext_policy_loss_fn",
  "PPO policy loss of `tunix_ppo_ext._src.ops.ppo_losses.policy_loss` over one model pass.",
  _ppo_ext_loss,
)


def _estimated_kl(algo_config: Any, logps: jax.Array, ref_logps: jax.Array) -> jax.Array:
  """Per-token KL `[B, T]` by the configured method (`kl_method`, `kl_clamp_value`)."""
  method = names.resolve_kl_method(algo_config.kl_method)
  return method.divergence(logps, ref_logps, getattr(algo_config, "kl_clamp_value", None))


def per_step_scalar(train_example: Any, name: str, default: float) -> jax.Array | float:
  """A per-step scalar the learner broadcasts to `[B]` on the example (so batches slice)."""
  value = getattr(train_example, name, None)
  return default if value is None else jnp.mean(value)


def ppo_ext_value_loss_fn(
  model: nnx.Module,
  train_example: Any,
  clip_range_value: float | None,
  pad_id: int,
  eos_id: int,
  loss_agg_mode: str = "token-mean",
  **kwargs: Any,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped value loss of `tunix_ppo_ext._src.ops.ppo_losses.value_loss` over one critic pass.

  Args:
    model: the critic (an `nnx.Module` whose output is `[B, P+T, 1]`).
    train_example: tunix's `TrainExample` of the micro-batch (ids, masks, old values,
      returns).
    clip_range_value: the value clip range `c` > 0; None disables the clipped term.
    pad_id: the padding token's id.
    eos_id: the end-of-sequence token's id.
    loss_agg_mode: how the `[B, T]` loss becomes a scalar (`ops.aggregate_loss`).
    **kwargs: further arguments tunix passes; ignored.

  Returns:
    `(loss, metrics)`: float32 scalar loss and `value_loss`'s metrics.
  """
  del kwargs
  attention_mask, loss_mask = _masks(train_example)
  scores = passes.compute_score(
    model,
    train_example.prompt_ids,
    train_example.completion_ids,
    pad_id=pad_id,
    eos_id=eos_id,
    attention_mask=attention_mask,
    stop_gradient=False,
    packing=example_packing(train_example),
  )
  vpreds = passes.predicting_positions(scores, train_example.completion_ids.shape[1])
  return losses.value_loss(
    vpreds,
    train_example.old_values,
    train_example.returns,
    loss_mask,
    clip_range_value=clip_range_value,
    loss_agg_mode=loss_agg_mode,
  )


def _contiguous_groups(rewards: jax.Array, num_generations: int) -> tuple[jax.Array, jax.Array]:
  scores = jnp.asarray(rewards, jnp.float32)
  return scores, jnp.asarray(contiguous_group_ids(scores.shape[0], num_generations))


def register_configured(config: Any) -> None:
  """Puts the configured plugin losses and estimator of a `PpoExtConfig` into tunix's
  `function_registry` (names only tunix holds are left to tunix), through
  `compat.install`, for tunix's own learners; this package's learners need none."""
  for kind, name in (
    (registry.POLICY_LOSSES, config.policy_loss_fn),
    (registry.VALUE_LOSSES, config.value_loss_fn),
    (registry.ADVANTAGE_ESTIMATORS, config.advantage_estimator),
  ):
    if registry.has(kind, name):
      register_in_tunix(kind, name, registry.get(kind, name))


def tunix_own(kind: str, name: str) -> bool:
  """Whether `name` is tunix's own loss (only tunix's registry holds it, e.g. `ppo`): it
  gets the inputs tunix's `PPOLearner` gives (no temperature, no aggregation mode) and logs
  tunix's metric names."""
  return not registry.has(kind, name)


def configured_loss(kind: str, name: str) -> Callable[..., Any]:
  """The loss tunix's trainers run for `name`: this package's or a plugin's (the plugin
  registry first), else tunix's own (e.g. `ppo`, from its `function_registry`). Registers
  nothing."""
  if registry.has(kind, name):
    return registry.get(kind, name)
  return compat.tunix_entry(kind, name)


def tunix_estimator(name: str) -> Callable[..., Any] | None:
  """tunix's advantage estimator `name` (its PPO signature) when the plugin registry has
  none of that name (`ppo.advantage_step`'s `fallback`), else None."""
  if registry.has(registry.ADVANTAGE_ESTIMATORS, name):
    return None
  return compat.tunix_entry(registry.ADVANTAGE_ESTIMATORS, name)


def register_in_tunix(kind: str, name: str, obj: Any) -> None:
  """Registers a registry object in tunix's `function_registry` as `name`, if not there
  yet (`compat.install`; estimators behind tunix's signature, `tunix_advantage_estimator`).

  A name tunix already holds for another loss is refused (tunix's trainers would use that
  one); for advantage estimators tunix keeps its own and `PpoExtLearner` uses ours.

  Raises:
    ValueError: the loss name is taken in tunix's registry by another function.
  """
  value = tunix_advantage_estimator(obj) if kind == registry.ADVANTAGE_ESTIMATORS else obj
  compat.install(entries=[compat.RegistryEntry(kind, name, obj, value)])


def _needs_anchors(name: str, *args: Any, **kwargs: Any) -> Any:
  del args, kwargs
  raise ValueError(
    f"advantage estimator {name!r} needs each agent turn's anchor state, which tunix's "
    "estimator signature does not pass: select it in AgenticPpoConfig (tunix's agentic "
    "stack) or PpoExtConfig (advantage_estimator), whose learners give it"
  )


def tunix_advantage_estimator(estimator: Callable[..., Any]) -> Callable[..., Any]:
  """A registry estimator behind tunix's signature: GRPO's if it takes `scores` (not
  `rewards`), `(rewards [B], num_generations) -> [B]`; else PPO's, `(rewards, values,
  completion_mask, gamma, gae_lambda) -> (advantages, returns)`, each sequence its own
  group, `gamma` also the discount between turns (`turn_gae`'s `gamma_turn`). One that
  takes anchor states (GiGPO's step groups), which neither signature passes, raises
  ValueError naming the configs whose learners give them.
  """
  wanted = protocols.wanted_inputs(estimator)
  if wanted is not None and "anchor_ids" in wanted:
    return functools.partial(_needs_anchors, getattr(estimator, "__name__", str(estimator)))
  if wanted is not None and "scores" in wanted and "rewards" not in wanted:

    def grpo_signature(rewards, num_generations):
      scores, group_ids = _contiguous_groups(rewards, num_generations)
      ones = jnp.ones((scores.shape[0], 1), jnp.float32)
      advantages, _ = protocols.call_estimator(
        estimator, scores=scores, group_ids=group_ids, mask=ones
      )
      return advantages[:, 0]

    return grpo_signature

  def ppo_signature(rewards, values, completion_mask, gamma, gae_lambda):
    rewards = jnp.asarray(rewards, jnp.float32)
    return protocols.call_estimator(
      estimator,
      rewards=rewards,
      values=values,
      mask=completion_mask,
      scores=jnp.sum(rewards * completion_mask, axis=-1),
      group_ids=jnp.arange(rewards.shape[0]),
      gamma=gamma,
      gamma_turn=gamma,  # tunix's one discount: `turn_gae`'s between turns
      gae_lambda=gae_lambda,
    )

  return ppo_signature


# this package's estimators under their own names; tunix keeps its `gae`, `grpo`, `rloo`
BUILTIN_ESTIMATORS = {
  "gae": advantages.compute_gae_advantages,
  "turn_gae": advantages.compute_turn_gae_advantages,
  "grpo": advantages.compute_grpo_advantages,
  "rloo": advantages.compute_rloo_advantages,
  "reinforce_plus_plus": advantages.compute_reinforce_plus_plus_advantages,
  "gigpo": advantages.compute_gigpo_advantages,
}


def register_builtins() -> None:
  """Puts this package's losses and estimators into tunix's `function_registry`, for stock
  tunix learners: losses `ppo_ext`; estimators under their own names where tunix holds
  none (`turn_gae`, `reinforce_plus_plus`, `gigpo`: tunix keeps its `gae`, `grpo`, `rloo`)
  and as `ppo_ext_gae`, `ppo_ext_reinforce_plus_plus` (tunix's PPO signature),
  `ppo_ext_grpo`, `ppo_ext_drgrpo`, `ppo_ext_rloo` (its GRPO one), with `compat.install`.
  Importing the package or building a learner registers nothing.
  """
  policy, value = ppo_ext_policy_loss_fn, ppo_ext_value_loss_fn
  entries = [
    compat.RegistryEntry(registry.POLICY_LOSSES, POLICY_LOSS_NAME, policy, policy),
    compat.RegistryEntry(registry.VALUE_LOSSES, VALUE_LOSS_NAME, value, value),
  ]
  estimators = {
    **BUILTIN_ESTIMATORS,
    "ppo_ext_gae": advantages.compute_gae_advantages,
    "ppo_ext_reinforce_plus_plus": advantages.compute_reinforce_plus_plus_advantages,
    "ppo_ext_grpo": advantages.compute_grpo_advantages,
    "ppo_ext_drgrpo": functools.partial(advantages.compute_grpo_advantages, norm_by_std=False),
    "ppo_ext_rloo": advantages.compute_rloo_advantages,
  }
  for name, fn in estimators.items():
    wrapped = tunix_advantage_estimator(fn)
    entries.append(compat.RegistryEntry(registry.ADVANTAGE_ESTIMATORS, name, fn, wrapped))
  compat.install(entries=entries)
