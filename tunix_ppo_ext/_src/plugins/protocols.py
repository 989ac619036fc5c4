"""What a plugin of each kind must be: the protocols the registry checks, stdlib only.

- `Environment`: a Gymnasium-style text environment (`reset(seed)`, `step(action)`,
  `name`, `max_return`); `StepOutput` is what `step` returns.
- `ADVANTAGE_INPUTS`: the keywords an advantage estimator may take; `call_estimator`
  calls one with the inputs its signature names.
- `PROTOCOLS[kind](obj)` / `PRODUCT_CHECKS[kind](product)`: `None` when the object (or
  the factory's product) conforms, else a one-line reason.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from tunix_ppo_ext._src.plugins import kinds

ADVANTAGE_INPUTS = (
  "rewards",
  "values",
  "mask",
  "scores",
  "group_ids",
  "gamma",
  "gae_lambda",
  "gamma_turn",
  "whiten",
  "norm_by_std",
  "anchor_ids",
  "step_weight",
)

StepOutput = tuple[str, float, bool, bool, dict[str, Any]]


@runtime_checkable
class Environment(Protocol):
  """A Gymnasium-style text environment with a known best episode return.

  Attributes:
    name: short name used in error messages and metrics.
    max_return: the largest return an episode can reach (for normalised metrics).
  """

  name: str
  max_return: float

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Starts an episode (deterministic given `seed`); returns `(observation, info)`."""
    ...

  def step(self, action: str) -> StepOutput:
    """Applies the agent's reply; returns `(observation, reward, terminated, truncated, info)`."""
    ...


def _signature(obj: Any) -> inspect.Signature | None:
  try:
    return inspect.signature(obj)
  except (TypeError, ValueError):  # builtins without signature metadata: trust the call
    return None


def _binds(obj: Any, *args: Any, **kwargs: Any) -> str | None:
  if not callable(obj):
    return f"{obj!r} is not callable"
  signature = _signature(obj)
  if signature is None:
    return None
  try:
    signature.bind(*args, **kwargs)
  except TypeError as err:
    shown = ", ".join(["_"] * len(args) + [f"{k}=_" for k in kwargs])
    return f"{signature} cannot be called as ({shown}): {err}"
  return None


def _check_kl_estimator(obj: Any) -> str | None:
  return _binds(obj, "logp", "ref_logp")


def _check_advantage_estimator(obj: Any) -> str | None:
  if not callable(obj):
    return f"{obj!r} is not callable"
  signature = _signature(obj)
  if signature is None:
    return None
  params = signature.parameters
  any_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
  for param in params.values():
    if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL) or param.default is not param.empty:
      continue
    if param.kind is param.POSITIONAL_ONLY or param.name not in ADVANTAGE_INPUTS:
      return f"parameter {param.name!r} of {signature} is not one of {list(ADVANTAGE_INPUTS)}"
  if not any_keyword and ("mask" not in params or not {"rewards", "scores"} & set(params)):
    return f"{signature} must take 'mask' and 'rewards' or 'scores'"
  return None


def _check_policy_loss(obj: Any) -> str | None:
  keywords = ("train_example", "algo_config", "pad_id", "eos_id", "temperature", "ref_model")
  return _binds(obj, "model", **dict.fromkeys(keywords))


def _check_value_loss(obj: Any) -> str | None:
  keywords = ("train_example", "clip_range_value", "pad_id", "eos_id", "loss_agg_mode")
  return _binds(obj, "model", **dict.fromkeys(keywords))


def _check_environment_factory(obj: Any) -> str | None:
  return None if callable(obj) else f"{obj!r} is not callable"


def _check_metric_sink_factory(obj: Any) -> str | None:
  return _binds(obj, "output_dir", {})


PROTOCOLS: dict[str, Callable[[Any], str | None]] = {
  kinds.KL_ESTIMATORS: _check_kl_estimator,
  kinds.POLICY_LOSSES: _check_policy_loss,
  kinds.VALUE_LOSSES: _check_value_loss,
  kinds.ADVANTAGE_ESTIMATORS: _check_advantage_estimator,
  kinds.METRIC_SINKS: _check_metric_sink_factory,
  kinds.ENVIRONMENTS: _check_environment_factory,
}


def _check_environment(env: Any) -> str | None:
  if isinstance(env, Environment):
    return None
  return "is not an Environment (needs `name`, `max_return`, `reset(seed)`, `step(action)`)"


def _check_backend(backend: Any) -> str | None:
  if callable(getattr(backend, "log_scalar", None)) and callable(getattr(backend, "close", None)):
    return None
  return "is not a logging backend (needs `log_scalar(event, value, *, step)` and `close()`)"


PRODUCT_CHECKS: dict[str, Callable[[Any], str | None]] = {
  kinds.ENVIRONMENTS: _check_environment,
  kinds.METRIC_SINKS: _check_backend,
}


@functools.lru_cache(maxsize=64)
def wanted_inputs(estimator: Callable[..., Any]) -> tuple[str, ...] | None:
  """The `ADVANTAGE_INPUTS` the estimator's signature names (None: it takes `**kwargs`)."""
  params = inspect.signature(estimator).parameters.values()
  if any(p.kind is p.VAR_KEYWORD for p in params):
    return None
  return tuple(p.name for p in params if p.name in ADVANTAGE_INPUTS)


def critic_mismatch(estimator: Callable[..., Any], needs_critic: bool) -> str | None:
  """Why an estimator registered with `needs_critic` cannot be called so (None: it can):
  one that needs a critic must take `values`, one that does not must not require them."""
  if _signature(estimator) is None:
    return None
  wanted = wanted_inputs(estimator)
  if wanted is None:  # `**kwargs`: takes values or leaves them
    return None
  required = {
    p.name for p in inspect.signature(estimator).parameters.values() if p.default is p.empty
  }
  if needs_critic and "values" not in wanted:
    return "it is registered with needs_critic=True but its signature takes no 'values'"
  if not needs_critic and "values" in required:
    return "it is registered with needs_critic=False but its signature requires 'values'"
  return None


def call_estimator(estimator: Callable[..., Any], **inputs: Any) -> tuple[Any, Any]:
  """Calls an advantage estimator with the inputs its signature names (its protocol).

  `inputs` are keywords of `ADVANTAGE_INPUTS` (`mask` required). Returns
  `(advantages [B, T], returns [B, T])`; an estimator that returns only advantages (the
  group estimators) gets `returns = advantages`.
  """
  wanted = wanted_inputs(estimator)
  out = estimator(**(inputs if wanted is None else {k: inputs[k] for k in wanted if k in inputs}))
  advantages, returns = out if isinstance(out, tuple) and len(out) == 2 else (out, out)
  shape, expected = getattr(advantages, "shape", None), getattr(inputs["mask"], "shape", None)
  if tuple(shape or ()) != tuple(expected or ()):
    raise ValueError(
      f"advantage estimator {getattr(estimator, '__name__', estimator)!r} returned advantages "
      f"of shape {shape}; expected the mask's {expected}"
    )
  return advantages, returns
