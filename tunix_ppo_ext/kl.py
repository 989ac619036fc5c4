"""KL divergence estimators, the exact full-vocabulary KL and KL coefficient controllers.

Per-token estimators follow Schulman's "Approximating KL Divergence" (k1, k2, k3)
and verl's `kl_penalty`; the `"+"` forms are the straight-through variants that
give the value of the base estimator with the (unbiased) gradient of k2.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
from collections.abc import Callable

import jax
import jax.numpy as jnp

from tunix_ppo_ext import registry
from tunix_ppo_ext.logits import full_kl_divergence

__all__ = [
  "KL_ESTIMATORS",
  "KL_METHOD_ALIASES",
  "AdaptiveKLController",
  "FixedKLController",
  "canonical_kl_method",
  "compute_kl_divergence",
  "full_kl_divergence",
  "kl_method_names",
  "make_kl_controller",
]

_LOG_RATIO_LIMIT = 20.0

KlEstimator = Callable[[jax.Array, jax.Array], jax.Array]


def kl_k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k1: `logp - ref_logp` (unbiased, high variance)."""
  return logp - ref_logp


def kl_abs(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`|logp - ref_logp|`."""
  return jnp.abs(logp - ref_logp)


def kl_k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k2: `0.5 * (logp - ref_logp)^2`; its gradient is the unbiased KL gradient."""
  return 0.5 * jnp.square(logp - ref_logp)


def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k3 (low-variance): `exp(x) - x - 1`, `x = clip(ref_logp - logp, -20, 20)`; always finite."""
  x = jnp.clip(ref_logp - logp, -_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
  return jnp.expm1(x) - x


# The built-ins are entry points of this package (pyproject.toml), like any plugin's;
# this read-only view keeps the old table's name.
KL_ESTIMATORS = registry.RegistryView(registry.KL_ESTIMATORS)
KL_METHOD_ALIASES: dict[str, str] = {
  "k1": "kl",
  "mse": "mse_kl",
  "k2": "mse_kl",
  "k3": "low_var_kl",
}
_STRAIGHT_THROUGH = "+"
FULL_KL = "full"


def kl_method_names(include_full: bool = False) -> list[str]:
  """Every accepted per-token method name (registered, aliases, and their `"+"` forms)."""
  base = registry.names(registry.KL_ESTIMATORS) + sorted(KL_METHOD_ALIASES)
  names = base + [name + _STRAIGHT_THROUGH for name in base]
  return names + [FULL_KL] if include_full else names


def _split_method(method: str) -> tuple[str, bool]:
  """`"name@dist+"` or `"name+@dist"` -> `("name@dist", True)`, the alias resolved."""
  name, dist = registry.split_spec(method)
  straight_through = name.endswith(_STRAIGHT_THROUGH) or (dist or "").endswith(_STRAIGHT_THROUGH)
  name, dist = name.removesuffix(_STRAIGHT_THROUGH), (dist or "").removesuffix(_STRAIGHT_THROUGH)
  name = KL_METHOD_ALIASES.get(name, name)
  return (f"{name}@{dist}" if dist else name), straight_through


def canonical_kl_method(method: str, include_full: bool = False) -> str:
  """Maps an accepted name or alias to its canonical spelling (`"k3+"` -> `"low_var_kl+"`).

  Any estimator of the `tunix_ppo_ext.kl_estimators` entry-point group is accepted, pinned
  to a distribution as `name@distribution` where two offer it (`"x@dist+"` canonical).

  Raises:
    ValueError: naming the method, listing the accepted ones and the closest match; or a
      `registry.PluginError` when the estimator is offered twice or its plugin is broken.
  """
  if include_full and method == FULL_KL:
    return method
  if not isinstance(method, str):
    raise ValueError(f"kl_method must be a string; got {method!r}")
  spec, straight_through = _split_method(method)
  try:
    registry.get(registry.KL_ESTIMATORS, spec)
  except registry.UnknownNameError as err:
    accepted = kl_method_names(include_full)
    close = difflib.get_close_matches(method, accepted, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    pinned = f" ({err})" if "@" in spec else ""
    raise ValueError(f"Unknown KL method {method!r}{pinned}; accepted: {accepted}.{hint}") from None
  return spec + (_STRAIGHT_THROUGH if straight_through else "")


def compute_kl_divergence(
  per_token_logps: jax.Array,
  ref_per_token_logps: jax.Array,
  method: str = "low_var_kl",
  clamp_value: float | None = None,
) -> jax.Array:
  """Per-token KL estimate `[...]` in float32 between the policy and the reference.

  Args:
    per_token_logps: log pi(a_t) of the trained policy, any shape and float dtype.
    ref_per_token_logps: log pi_ref(a_t), same shape.
    method: `"kl"`/`"k1"`, `"abs"`, `"mse_kl"`/`"mse"`/`"k2"`, `"low_var_kl"`/`"k3"`, any
      plugin estimator's name (`"name@distribution"` to pick one of two), or any of them
      with a `"+"` suffix: forward value of the base estimator, gradient of k2
      (`g - stop_gradient(g) + stop_gradient(value)`).
    clamp_value: when set, the value is clipped to `[-clamp_value, clamp_value]`; a `"+"`
      form keeps its k2 gradient under the clamp.
  """
  method = canonical_kl_method(method)
  if clamp_value is not None and not clamp_value > 0:
    raise ValueError(f"clamp_value must be > 0 or None; got {clamp_value!r}")
  logp = jnp.asarray(per_token_logps).astype(jnp.float32)
  ref_logp = jnp.asarray(ref_per_token_logps).astype(jnp.float32)
  if logp.shape != ref_logp.shape:
    raise ValueError(
      f"per_token_logps shape {logp.shape} != ref_per_token_logps shape {ref_logp.shape}"
    )
  spec, straight_through = _split_method(method)
  value = jnp.asarray(registry.get(registry.KL_ESTIMATORS, spec)(logp, ref_logp))
  if value.shape != logp.shape:
    raise ValueError(
      f"KL estimator {spec!r} ({registry.resolve(registry.KL_ESTIMATORS, spec).describe()}) "
      f"returned shape {value.shape} for log-probs of shape {logp.shape}: it must be per-token"
    )
  value = value.astype(jnp.float32)
  if clamp_value is not None:
    value = jnp.clip(value, -clamp_value, clamp_value)
  if not straight_through:
    return value
  surrogate = kl_k2(logp, ref_logp)
  return surrogate - jax.lax.stop_gradient(surrogate) + jax.lax.stop_gradient(value)


def _check_number(name: str, value: object, minimum: float, strict: bool) -> None:
  """Raises ValueError unless `value` is a real number above (or at) `minimum`."""
  is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
  if not is_number or not (value > minimum if strict else value >= minimum):
    bound = f"> {minimum}" if strict else f">= {minimum}"
    raise ValueError(f"{name} must be a number {bound}; got {value!r}")


@dataclasses.dataclass
class FixedKLController:
  """A constant KL coefficient; `update` is a no-op."""

  kl_coef: float

  def __post_init__(self):
    _check_number("kl_coef", self.kl_coef, minimum=0.0, strict=False)
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
    _check_number("init_kl_coef", self.init_kl_coef, minimum=0.0, strict=False)
    _check_number("target_kl", self.target_kl, minimum=0.0, strict=True)
    _check_number("horizon", self.horizon, minimum=0.0, strict=True)
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
  """`"fixed"` -> `FixedKLController(kl_coef)`; `"adaptive"` -> `AdaptiveKLController`."""
  if kind == "fixed":
    return FixedKLController(kl_coef)
  if kind == "adaptive":
    return AdaptiveKLController(kl_coef, target_kl, horizon)
  raise ValueError(f"kl_ctrl must be 'fixed' or 'adaptive'; got {kind!r}")
