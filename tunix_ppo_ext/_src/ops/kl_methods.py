"""Configured names resolved to callables, once: KL methods and plugin choices.

A KL method is a `tunix_ppo_ext.kl_estimators` name (`kl`, `abs`, `mse_kl`, `low_var_kl`
or a plugin's, `name@distribution` to pick one of two), an alias (`k1`, `k2`/`mse`, `k3`),
any of them with a `+` suffix (straight-through: the value of the estimator, the gradient
of k2), or `full` (the exact full-vocabulary KL, computed from logits).
`resolve_kl_method` turns one into a `KlMethod(estimator, straight_through)` for
`tunix_ppo_ext._src.ops.kl.kl_divergence` (the registry caches what it loaded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tunix_ppo_ext._src.checks import did_you_mean
from tunix_ppo_ext._src.ops import kl as kl_ops
from tunix_ppo_ext._src.plugins import registry

__all__ = [
  "FULL_KL",
  "KL_METHOD_ALIASES",
  "KlMethod",
  "canonical_kl_method",
  "compute_kl_divergence",
  "kl_method_names",
  "resolve_kl_method",
]

KL_METHOD_ALIASES: dict[str, str] = {
  "k1": "kl",
  "mse": "mse_kl",
  "k2": "mse_kl",
  "k3": "low_var_kl",
}
STRAIGHT_THROUGH = "+"
FULL_KL = "full"


@dataclasses.dataclass(frozen=True)
class KlMethod:
  """A resolved per-token KL method: the estimator and whether it is straight-through."""

  spec: str  # canonical name, e.g. "low_var_kl+" or "half_k1@my-kl"
  estimator: Callable
  straight_through: bool

  def divergence(self, logp: Any, ref_logp: Any, clamp_value: float | None = None) -> Any:
    """Per-token KL between the policy and the reference by this method
    (`tunix_ppo_ext.ops.kl_divergence` with its estimator and straight-through flag).

    Args:
      logp: log pi(a_t) of the trained policy, any shape and float dtype.
      ref_logp: log pi_ref(a_t), the same shape.
      clamp_value: when set, the value is clipped to `[-clamp_value, clamp_value]`.

    Returns:
      The float32 per-token estimate, the shape of `logp`.
    """
    return kl_ops.kl_divergence(logp, ref_logp, self.estimator, self.straight_through, clamp_value)


def kl_method_names(include_full: bool = False) -> list[str]:
  """Every accepted per-token method name (registered, aliases, and their `"+"` forms).

  Args:
    include_full: also list `"full"`, the exact full-vocabulary KL.

  Returns:
    The names: the registered estimators, then the aliases (sorted), then each with `"+"`.
  """
  base = registry.names(registry.KL_ESTIMATORS) + sorted(KL_METHOD_ALIASES)
  names = base + [name + STRAIGHT_THROUGH for name in base]
  return names + [FULL_KL] if include_full else names


def _split_method(method: str) -> tuple[str, bool]:
  """`"name@dist+"` or `"name+@dist"` -> `("name@dist", True)`, the alias resolved."""
  name, dist = registry.split_spec(method)
  straight_through = name.endswith(STRAIGHT_THROUGH) or (dist or "").endswith(STRAIGHT_THROUGH)
  name, dist = name.removesuffix(STRAIGHT_THROUGH), (dist or "").removesuffix(STRAIGHT_THROUGH)
  name = KL_METHOD_ALIASES.get(name, name)
  return (f"{name}@{dist}" if dist else name), straight_through


def canonical_kl_method(method: str, include_full: bool = False) -> str:
  """Maps an accepted name or alias to its canonical spelling (`"k3+"` -> `"low_var_kl+"`).

  Args:
    method: a KL method name, alias or `name@distribution`, with an optional `"+"`.
    include_full: also accept `"full"` (returned as is).

  Returns:
    The canonical name.

  Raises:
    ValueError: naming the method, listing the accepted ones and the closest match; or a
      `registry.PluginError` when the estimator is offered twice or its plugin is broken.
  """
  if include_full and method == FULL_KL:
    return method
  return resolve_kl_method(method).spec


def _resolve(method: str) -> KlMethod:
  spec, straight_through = _split_method(method)
  try:
    estimator = registry.get(registry.KL_ESTIMATORS, spec)
  except registry.UnknownNameError as err:
    accepted = kl_method_names()
    pinned = f" ({err})" if "@" in spec else ""
    raise ValueError(
      f"Unknown KL method {method!r}{pinned}; accepted: {accepted}{did_you_mean(method, accepted)}"
    ) from None
  return KlMethod(
    spec + (STRAIGHT_THROUGH if straight_through else ""), estimator, straight_through
  )


def resolve_kl_method(method: str) -> KlMethod:
  """The estimator and straight-through flag a per-token KL method name selects.

  Args:
    method: a KL method name, alias or `name@distribution`, with an optional `"+"`.

  Returns:
    A `KlMethod`: the canonical `spec`, the `estimator` and `straight_through`.

  Raises:
    ValueError: unknown name (with the accepted ones), or `FULL_KL`, which is no estimator.
  """
  if not isinstance(method, str):
    raise ValueError(f"kl_method must be a string; got {method!r}")
  if method == FULL_KL:
    raise ValueError("kl_method 'full' is the exact KL from logits, not a per-token estimator")
  return _resolve(method)


def compute_kl_divergence(
  per_token_logps: Any,
  ref_per_token_logps: Any,
  method: str = "low_var_kl",
  clamp_value: float | None = None,
) -> Any:
  """Per-token KL between the policy and the reference, with the estimator named `method`.

  tunix's `rl.common.compute_kl_divergence`, same signature and the same values for its
  three names (`kl`, `mse_kl`, `low_var_kl`), extended to every accepted name: the
  aliases `k1`, `k2`/`mse`, `k3`, `abs`, plugin estimators (`name@distribution` to pick
  one of two), and each of them with a `+` suffix (the estimator's value with k2's
  gradient, straight-through). The callable form is `tunix_ppo_ext.ops.kl_divergence`.

  Args:
    per_token_logps: log pi(a_t) of the trained policy, any shape and float dtype.
    ref_per_token_logps: log pi_ref(a_t), the same shape.
    method: an accepted per-token method name (see `kl_method_names()`).
    clamp_value: when set, the value is clipped to `[-clamp_value, clamp_value]`.

  Returns:
    The float32 per-token estimate, the shape of `per_token_logps`.

  Raises:
    ValueError: an unknown method (naming the accepted ones), `"full"` (the exact KL needs
      logits: `tunix_ppo_ext.ops.full_kl_divergence`), or a non-positive `clamp_value`.
  """
  return resolve_kl_method(method).divergence(per_token_logps, ref_per_token_logps, clamp_value)
