"""KL divergence estimators, the exact full-vocabulary KL and KL coefficient controllers.

Per-token estimators follow Schulman's "Approximating KL Divergence" (k1, k2, k3)
and verl's `kl_penalty`; the `"+"` forms are the straight-through variants that
give the value of the base estimator with the (unbiased) gradient of k2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from tunix_ppo_ext._src.checks import check_number
from tunix_ppo_ext._src.ops.logits import full_kl_divergence

__all__ = [
  "LOG_RATIO_LIMIT",
  "AdaptiveKLController",
  "FixedKLController",
  "KlEstimator",
  "kl_divergence",
  "full_kl_divergence",
  "kl_abs",
  "kl_k1",
  "kl_k2",
  "kl_k3",
  "make_kl_controller",
]

LOG_RATIO_LIMIT = 20.0  # |log-ratio| clip before exp(): in k3 and in the PPO ratio

KlEstimator = Callable[[jax.Array, jax.Array], jax.Array]


def kl_k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k1: `logp - ref_logp` (unbiased, high variance).

  Args:
    logp: log pi(a_t) of the trained policy, any shape (e.g. `[B, T]`), float.
    ref_logp: log pi_ref(a_t) of the reference policy, the same shape.

  Returns:
    `logp - ref_logp`, the shape of `logp`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> ops.kl_k1(jnp.array([-1.0, -2.0]), jnp.array([-1.5, -1.0])).tolist()
    [0.5, -1.0]
  """
  return logp - ref_logp


def kl_abs(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`|logp - ref_logp|`.

  Args:
    logp: the trained policy's per-token log-probs, any shape and float dtype.
    ref_logp: the reference policy's, shaped as `logp`.

  Returns:
    `|logp - ref_logp|`, >= 0, the shape of `logp`.

  Examples:
    >>> from jax import numpy as jnp
    >>> from tunix_ppo_ext.ops import kl_abs
    >>> kl_abs(jnp.array([-1.0, -2.0]), jnp.array([-1.5, -1.0])).tolist()
    [0.5, 1.0]
  """
  return jnp.abs(logp - ref_logp)


def kl_k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k2: `0.5 * (logp - ref_logp)^2`; its gradient is the unbiased KL gradient.

  Args:
    logp: `[...]` log-probs of the sampled tokens under the trained policy.
    ref_logp: `[...]` their log-probs under the reference policy.

  Returns:
    `[...]`, >= 0.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> logp = jnp.array([[-1.0, -2.0]])
    >>> ops.kl_k2(logp, ref_logp=jnp.array([[-1.5, -1.0]])).tolist()
    [[0.125, 0.5]]
  """
  return 0.5 * jnp.square(logp - ref_logp)


def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k3 (low-variance): `exp(x) - x - 1`, `x = clip(ref_logp - logp, -20, 20)`; always finite.

  Args:
    logp: per-token log pi(a_t), any shape, float (computed in its dtype).
    ref_logp: per-token log pi_ref(a_t), the same shape.

  Returns:
    The estimate, >= 0 and finite, shaped as `logp`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> logp, ref_logp = jnp.array([-1.0, -2.0, -0.5]), jnp.array([-1.5, -1.0, -0.5])
    >>> print(np.round(ops.kl_k3(logp, ref_logp), 4))
    [0.1065 0.7183 0.    ]
  """
  x = jnp.clip(ref_logp - logp, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
  return jnp.expm1(x) - x


def kl_divergence(
  per_token_logps: jax.Array,
  ref_per_token_logps: jax.Array,
  estimator: KlEstimator = kl_k3,
  straight_through: bool = False,
  clamp_value: float | None = None,
) -> jax.Array:
  """Per-token KL estimate `[...]` in float32 between the policy and the reference.

  Args:
    per_token_logps: log pi(a_t) of the trained policy, any shape and float dtype.
    ref_per_token_logps: log pi_ref(a_t), same shape.
    estimator: `fn(logp, ref_logp) -> [...]` per token, e.g. `kl_k1`, `kl_k2`, `kl_k3`
      (Schulman 2020) or a plugin's (`tunix_ppo_ext.config.resolve_kl_method` turns a
      configured name into this callable and the `straight_through` flag).
    straight_through: forward value of `estimator`, gradient of k2:
      `k2 - stop_gradient(k2) + stop_gradient(value)`.
    clamp_value: when set, the value is clipped to `[-clamp_value, clamp_value]`; the
      straight-through form keeps its k2 gradient under the clamp.

  Returns:
    float32 array of `per_token_logps`' shape: the per-token estimate (its value; with
    `straight_through`, the gradient of k2).

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> logp, ref_logp = jnp.array([[-1.0, -2.0]]), jnp.array([[-1.5, -1.0]])
    >>> print(np.round(ops.kl_divergence(logp, ref_logp), 4))
    [[0.1065 0.7183]]
    >>> print(np.round(ops.kl_divergence(logp, ref_logp, ops.kl_k1, clamp_value=0.75), 4))
    [[ 0.5  -0.75]]
  """
  if clamp_value is not None:
    check_number("clamp_value", clamp_value, low=0.0, low_open=True)
  logp = jnp.asarray(per_token_logps).astype(jnp.float32)
  ref_logp = jnp.asarray(ref_per_token_logps).astype(jnp.float32)
  if logp.shape != ref_logp.shape:
    raise ValueError(
      f"per_token_logps shape {logp.shape} != ref_per_token_logps shape {ref_logp.shape}"
    )
  value = jnp.asarray(estimator(logp, ref_logp))
  if value.shape != logp.shape:
    raise ValueError(
      f"KL estimator {getattr(estimator, '__qualname__', estimator)!r} returned shape "
      f"{value.shape} for log-probs of shape {logp.shape}: it must be per-token"
    )
  value = value.astype(jnp.float32)
  if clamp_value is not None:
    value = jnp.clip(value, -clamp_value, clamp_value)
  if not straight_through:
    return value
  surrogate = kl_k2(logp, ref_logp)
  return surrogate - jax.lax.stop_gradient(surrogate) + jax.lax.stop_gradient(value)


@dataclasses.dataclass
class FixedKLController:
  """A constant KL coefficient; `update` is a no-op."""

  kl_coef: float

  def __post_init__(self):
    check_number("kl_coef", self.kl_coef, low=0.0)
    self.kl_coef = float(self.kl_coef)

  @property
  def value(self) -> float:
    return self.kl_coef

  def update(self, current_kl: float, n_steps: int) -> None:
    del current_kl, n_steps

  def state_dict(self) -> dict[str, float]:
    return {"value": self.kl_coef}

  def load_state_dict(self, state: dict[str, float]) -> None:
    self.kl_coef = float(state["value"])


@dataclasses.dataclass
class AdaptiveKLController:
  """Adaptive KL coefficient of Ziegler et al. 2019 (arXiv:1909.08593), section 2.2.

  `err = clip(current_kl / target_kl - 1, -0.2, 0.2)`; `value *= 1 + err * n_steps / horizon`.
  """

  init_kl_coef: float
  target_kl: float
  horizon: float
  value: float = dataclasses.field(init=False)

  def __post_init__(self):
    check_number("init_kl_coef", self.init_kl_coef, low=0.0)
    check_number("target_kl", self.target_kl, low=0.0, low_open=True)
    check_number("horizon", self.horizon, low=0.0, low_open=True)
    self.value = float(self.init_kl_coef)

  def update(self, current_kl: float, n_steps: int) -> None:
    error = min(max(float(current_kl) / self.target_kl - 1.0, -0.2), 0.2)
    self.value *= 1.0 + error * n_steps / self.horizon

  def state_dict(self) -> dict[str, float]:
    return {"value": self.value}

  def load_state_dict(self, state: dict[str, float]) -> None:
    self.value = float(state["value"])


def make_kl_controller(
  kind: str, kl_coef: float, target_kl: float | None = None, horizon: float | None = None
) -> FixedKLController | AdaptiveKLController:
  """`"fixed"` -> `FixedKLController(kl_coef)`; `"adaptive"` -> `AdaptiveKLController`.

  Args:
    kind: `"fixed"` or `"adaptive"` (ValueError otherwise).
    kl_coef: the (initial) KL coefficient, >= 0.
    target_kl: the adaptive controller's target KL per step, > 0 (unused by `"fixed"`).
    horizon: the adaptive controller's horizon in samples, > 0 (unused by `"fixed"`).

  Returns:
    The controller: `value` is the current coefficient, `update(current_kl, n_steps)`
    adapts it.

  Examples:
    >>> from tunix_ppo_ext import ops
    >>> ctrl = ops.make_kl_controller("adaptive", 0.1, target_kl=0.05, horizon=100)
    >>> ctrl.update(current_kl=0.1, n_steps=10)  # KL above target: err clipped to 0.2
    >>> round(ctrl.value, 6)
    0.102
    >>> ops.make_kl_controller("fixed", 0.05).value
    0.05
  """
  if kind == "fixed":
    return FixedKLController(kl_coef)
  if kind == "adaptive":
    return AdaptiveKLController(kl_coef, target_kl, horizon)
  raise ValueError(f"kl_ctrl must be 'fixed' or 'adaptive'; got {kind!r}")
