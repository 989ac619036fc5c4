"""The environment protocol's checks and factory: `validate_*_output`, `make_env`.

An environment speaks text both ways: `reset(seed)` gives the first observation and
`step(action)` takes the agent's reply (decoded, without the end-of-turn EOS) and gives
`(observation, reward, terminated, truncated, info)` as in Gymnasium. Outputs are
checked with `validate_reset_output` / `validate_step_output`, whose errors name the
environment and the turn. An environment may also have `anchor()`: a hashable key of the
state the agent is about to act in (GiGPO's anchor state; `anchor_key`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.plugins.protocols import Environment, StepOutput


def _fail(env_name: str, turn: int, problem: str) -> ValueError:
  return ValueError(f"environment {env_name!r}, turn {turn}: {problem}")


def _check_bool(env_name: str, turn: int, field: str, value: Any) -> bool:
  if not isinstance(value, bool | np.bool_):
    raise _fail(env_name, turn, f"{field} must be a bool, got {type(value).__name__}")
  return bool(value)


def _check_reward(env_name: str, turn: int, reward: Any, allow_nonfinite: bool = False) -> float:
  if isinstance(reward, bool | np.bool_) or not isinstance(reward, numbers.Real):
    raise _fail(env_name, turn, f"reward must be a real number, got {type(reward).__name__}")
  if not allow_nonfinite and not math.isfinite(float(reward)):
    raise _fail(
      env_name,
      turn,
      f"reward must be finite, got {reward!r} (PpoExtConfig.nonfinite_rewards='drop' drops "
      "such episodes instead)",
    )
  return float(reward)


def _check_observation(env_name: str, turn: int, observation: Any) -> str:
  if not isinstance(observation, str):
    raise _fail(env_name, turn, f"observation must be a str, got {type(observation).__name__}")
  return observation


def _check_info(env_name: str, turn: int, info: Any) -> dict[str, Any]:
  if not isinstance(info, dict):
    raise _fail(env_name, turn, f"info must be a dict, got {type(info).__name__}")
  return info


def anchor_key(env: Any, turn: int, history: tuple[int, ...]) -> Any:
  """The anchor of the state the agent acts in at `turn` (GiGPO's step groups): the
  environment's `anchor()` when it has one, else `history` (the episode's exact tokens so
  far, always a valid anchor: equal histories are equal states). A key that cannot be
  hashed is a ValueError naming the environment and the turn."""
  method = getattr(env, "anchor", None)
  if not callable(method):
    return history
  try:
    key = method()
    hash(key)
  except Exception as err:
    raise _fail(
      env_name(env), turn, f"anchor() must return a hashable key: {type(err).__name__}: {err}"
    ) from err
  return ("anchor", key)


def validate_reset_output(env_name: str, output: Any) -> tuple[str, dict[str, Any]]:
  """Checks `reset`'s `(observation: str, info: dict)`; errors name the env and turn 0.

  Args:
    env_name: the environment's name, for the error message.
    output: what `reset` returned.

  Returns:
    `(observation, info)`, checked.

  Raises:
    ValueError: when `output` is not a `(str, dict)` pair.
  """
  if not isinstance(output, tuple | list) or len(output) != 2:
    raise _fail(env_name, 0, f"reset must return (observation, info), got {output!r}")
  observation, info = output
  return _check_observation(env_name, 0, observation), _check_info(env_name, 0, info)


def validate_step_output(
  env_name: str, turn: int, output: Any, allow_nonfinite_reward: bool = False
) -> StepOutput:
  """Checks one `step` output and returns it normalised (float reward, bool flags).

  Raises ValueError naming `env_name` and `turn` (1-based agent turn) on a wrong tuple
  length, a non-str observation, a non-number or non-finite reward (NaN/inf pass with
  `allow_nonfinite_reward`, for the learner to drop), non-bool flags or a non-dict info.

  Args:
    env_name: the environment's name, for the error message.
    turn: the 1-based agent turn, for the error message.
    output: what `step` returned: `(observation, reward, terminated, truncated, info)`.
    allow_nonfinite_reward: let NaN and inf rewards through.

  Returns:
    The `StepOutput`, reward as float and flags as bool.
  """
  if not isinstance(output, tuple | list) or len(output) != 5:
    length = len(output) if isinstance(output, tuple | list) else "not a tuple"
    raise _fail(
      env_name,
      turn,
      f"step must return (observation, reward, terminated, truncated, info), got {length}",
    )
  observation, reward, terminated, truncated, info = output
  return (
    _check_observation(env_name, turn, observation),
    _check_reward(env_name, turn, reward, allow_nonfinite_reward),
    _check_bool(env_name, turn, "terminated", terminated),
    _check_bool(env_name, turn, "truncated", truncated),
    _check_info(env_name, turn, info),
  )


def make_env(env: str | Callable[..., Environment], **kwargs: Any) -> Environment:
  """An environment from a registered name or a factory, built with `kwargs`.

  Names are the `tunix_ppo_ext.environments` entry points (`name@distribution` picks one
  of two); a named one must satisfy `Environment`. `gym:<id>` is Gymnasium's `<id>`
  through `tunix_ppo_ext._src.envs.gym_adapter.GymEnv` (needs the `gym` extra).

  Args:
    env: a registered name (`name`, `name@distribution`, `gym:<id>`) or a callable that
      builds the environment.
    **kwargs: passed to the factory.

  Returns:
    The environment.
  """
  if isinstance(env, str) and env.startswith("gym:"):
    from tunix_ppo_ext._src.envs.gym_adapter import GymEnv

    return GymEnv(env.removeprefix("gym:"), **kwargs)
  if isinstance(env, str):
    return registry.build(registry.ENVIRONMENTS, env, **kwargs)
  return env(**kwargs)


def env_name(env: Any) -> str:
  """`env.name`, else its class name (for error messages and metrics).

  Args:
    env: an environment (any object).

  Returns:
    The name.
  """
  return str(getattr(env, "name", type(env).__name__))


MALFORMED_KEY = "invalid_action"  # a step's `info` flag: the reply was not a valid action


def is_malformed(info: dict[str, Any]) -> bool:
  """Whether a step's `info` says the agent's reply was malformed (`info["invalid_action"]`
  true; the games report it, `gym.GymEnv` for every Gymnasium environment).

  Args:
    info: the `info` dict a step returned.

  Returns:
    True when the reply was malformed.
  """
  return bool(info.get(MALFORMED_KEY, False))


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """One environment of a rollout: `env` (a name for `make_env` or a factory), its
  `kwargs`, and `tag`, the name its per-environment metrics go under (`env/<tag>/...`)."""

  env: str | Callable[..., Environment]
  kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
  tag: str = ""

  def make(self) -> Environment:
    """A fresh environment."""
    return make_env(self.env, **self.kwargs)
