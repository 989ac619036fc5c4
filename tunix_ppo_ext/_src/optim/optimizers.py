"""Optimizers from a run config's `optim` section: Adam or AdamW, global-norm clipping and a
learning-rate schedule (constant, linear or cosine, each with linear warm-up), all optax.

The schedule counts optimizer updates, the unit of tunix's `max_steps` and of the run
config's `train.steps` (one per rollout batch unless mini-batches or PPO epochs make
several; gradient-accumulation micro-steps are not updates). Update `s` (0-based) uses:

  warm(s)   = min((s + 1) / warmup_steps, 1)            (1 without warm-up)
  p(s)      = clip((s - warmup_steps) / (total_steps - warmup_steps), 0, 1)
  constant: lr * warm(s)
  linear:   lr * warm(s) * (1 - (1 - min_lr_ratio) * p(s))
  cosine:   lr * warm(s) * (min_lr_ratio + (1 - min_lr_ratio) * (1 + cos(pi p(s))) / 2)

(cosine: Loshchilov & Hutter, "SGDR", 2017; decoupled weight decay: Loshchilov & Hutter,
"Decoupled Weight Decay Regularization", 2019; global-norm clipping: Pascanu et al., 2013.)
Every optimizer is wrapped by the NaN guard (`guards.guarded`, this layer), and `inject_hyperparams`
stays outermost so tunix logs the learning rate of each update (`actor/lr`, `critic/lr`).
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from tunix_ppo_ext._src.config.recipe_sections import OptimizerSpec
from tunix_ppo_ext._src.optim.guards import guarded


def lr_schedule(spec: OptimizerSpec, lr: float, total_steps: int) -> optax.Schedule:
  """The learning rate of optimizer update `s` (module docstring) at peak `lr`, decaying
  over `total_steps` updates; a scalar jnp function of the update count."""
  warmup = spec.warmup_steps
  decay_steps = max(total_steps - warmup, 1)
  if spec.schedule == "cosine":
    decay = optax.cosine_decay_schedule(lr, decay_steps, alpha=spec.min_lr_ratio)
  elif spec.schedule == "linear":
    decay = optax.linear_schedule(lr, lr * spec.min_lr_ratio, decay_steps)
  else:
    decay = optax.constant_schedule(lr)

  def schedule(count: jnp.ndarray) -> jnp.ndarray:
    step = jnp.asarray(count)
    warm = jnp.minimum((step + 1) / warmup, 1.0) if warmup else 1.0
    return warm * decay(jnp.maximum(step - warmup, 0))

  return schedule


def build_optimizer(
  spec: OptimizerSpec, lr: float, total_steps: int
) -> optax.GradientTransformation:
  """`spec`'s optimizer at peak `lr` over `total_steps` updates, behind the NaN guard:
  clip (optional) then Adam/AdamW, skipped as a whole on a non-finite gradient or result.

  Args:
    spec: the optimizer's settings (the run config's `optim.<role>`).
    lr: the peak learning rate.
    total_steps: the number of optimizer updates (the schedule's length).

  Returns:
    The guarded optax transformation.
  """

  def make(learning_rate: float) -> optax.GradientTransformation:
    if spec.name == "adamw":
      inner = optax.adamw(learning_rate, spec.b1, spec.b2, spec.eps, weight_decay=spec.weight_decay)
    else:
      inner = optax.adam(learning_rate, spec.b1, spec.b2, spec.eps)
    if spec.clip_grad_norm is None:
      return inner
    return optax.chain(optax.clip_by_global_norm(spec.clip_grad_norm), inner)

  schedule = lr_schedule(spec, lr, total_steps)
  return guarded(make, schedule)
