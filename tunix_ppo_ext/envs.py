"""Text environments for multi-turn agent training: a Gymnasium-style protocol and `MemoryEnv`.

An environment speaks text both ways: `reset(seed)` gives the first observation and
`step(action)` takes the agent's reply (decoded, without the end-of-turn EOS) and gives
`(observation, reward, terminated, truncated, info)` as in Gymnasium. Outputs are
checked with `validate_reset_output` / `validate_step_output`, whose errors name the
environment and the turn.
"""

from __future__ import annotations

import math
import numbers
import string
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tunix_ppo_ext import registry

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


def validate_reset_output(env_name: str, output: Any) -> tuple[str, dict[str, Any]]:
  """Checks `reset`'s `(observation: str, info: dict)`; errors name the env and turn 0."""
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


class MemoryEnv:
  """Remember a symbol across turns: acknowledge it, then recall it when asked.

  Episode (`num_turns=2`, the symbol drawn from the first `num_symbols` lowercase letters):
    reset -> "see b!"   agent "k" (acknowledge; `ack_reward`)
    step  -> "what?"    agent "b" (recall the symbol; `recall_reward`), terminated.
  With `num_turns=n`, the first `n - 1` turns are acknowledgements (observations between
  them are "wait.") and the last asks for the symbol, which by then is only in the
  history. Each observation ends in its own character, so even a model that mostly reads
  the last token can tell the turns apart.

  Replies are compared exactly (one character, so the agent must stop with EOS); a wrong
  one scores 0 and the episode goes on. `partial_credit` pays that fraction of a turn's
  reward for a reply that starts right but goes on (an easier curriculum).
  `max_return = (n - 1) * ack_reward + recall_reward`; a uniformly random one-character
  reply from a 96-character alphabet scores about 1% of it.
  """

  name = "memory"
  ACK = "k"
  SYMBOLS = string.ascii_lowercase.replace(ACK, "")

  def __init__(
    self,
    num_symbols: int = 3,
    num_turns: int = 2,
    ack_reward: float = 0.25,
    recall_reward: float = 1.0,
    partial_credit: float = 0.0,
  ):
    if not 2 <= num_symbols <= len(self.SYMBOLS):
      raise ValueError(f"num_symbols must be in [2, {len(self.SYMBOLS)}], got {num_symbols}")
    if num_turns < 2:
      raise ValueError(f"num_turns must be >= 2 (acknowledge, then recall), got {num_turns}")
    if not 0.0 <= partial_credit <= 1.0:
      raise ValueError(f"partial_credit must be in [0, 1], got {partial_credit}")
    self.symbols = self.SYMBOLS[:num_symbols]
    self.num_turns = num_turns
    self.ack_reward = float(ack_reward)
    self.recall_reward = float(recall_reward)
    self.partial_credit = float(partial_credit)
    self.max_return = (num_turns - 1) * self.ack_reward + self.recall_reward
    self._symbol: str | None = None
    self._turn = 0

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Draws the symbol from `seed`; observation `"see <symbol>!"`."""
    rng = np.random.default_rng(seed)
    self._symbol = self.symbols[int(rng.integers(len(self.symbols)))]
    self._turn = 0
    return f"see {self._symbol}!", {}

  def step(self, action: str) -> StepOutput:
    """Scores `action` for the current turn; terminates after the recall turn."""
    if self._symbol is None:
      raise RuntimeError("call reset() before step()")
    self._turn += 1
    recall = self._turn == self.num_turns
    expected = self._symbol if recall else self.ACK
    correct = action == expected
    full = self.recall_reward if recall else self.ack_reward
    reward = full if correct else full * self.partial_credit * action.startswith(expected)
    info = {"correct": correct, "expected": expected}
    if recall:
      self._symbol = None
      return "", reward, True, False, info
    observation = "what?" if self._turn == self.num_turns - 1 else "wait."
    return observation, reward, False, False, info

  def optimal_action(self) -> str:
    """The reply that earns the current turn's reward (for scripted baselines and tests)."""
    if self._symbol is None:
      raise RuntimeError("no episode in progress")
    return self._symbol if self._turn + 1 == self.num_turns else self.ACK


# Names -> factories: the `tunix_ppo_ext.environments` entry points (the built-ins
# `memory`, `countdown`, `countdown_multiturn` are this package's own, in pyproject.toml).
ENVIRONMENTS = registry.RegistryView(registry.ENVIRONMENTS)


def make_env(env: str | Callable[..., Environment], **kwargs: Any) -> Environment:
  """An environment from a registered name (`ENVIRONMENTS`, `name@distribution` to pick one
  of two) or a factory, built with `kwargs`; a named one must satisfy `Environment`."""
  if isinstance(env, str):
    return registry.build(registry.ENVIRONMENTS, env, **kwargs)
  return env(**kwargs)


def env_name(env: Any) -> str:
  """`env.name`, else its class name (for error messages and metrics)."""
  return str(getattr(env, "name", type(env).__name__))
