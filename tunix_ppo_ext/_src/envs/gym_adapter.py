"""Gymnasium environments as text environments: `env.name=gym:<id>` (e.g. `gym:FrozenLake-v1`).

Your own environment: `gymnasium.register(...)` it in a module and name it `gym:<module>:<id>`
(Gymnasium's own form: the module is imported first), or register it in the module your
`render` or `parse_action` comes from (those are imported before the id is looked up).

`GymEnv` wraps `gymnasium.make(<id>, **make_kwargs)`. Each observation is text from a
renderer, each agent reply becomes an action through an action parser; both can be
replaced (a callable, or a `"module:function"` string from the run config):

  render(env, observation) -> str
      default: the environment's `ansi` rendering (escape codes stripped) when it has one,
      else `str(observation)`.
  parse_action(text, env) -> action | None
      default (`Discrete` action spaces): an integer in the space (`"2"`), or one of
      `action_names` (`["left", "down", "right", "up"]`: name -> index). None = invalid.

An invalid reply is not a crash: the environment stays where it was, the agent gets
`invalid_feedback` and the current rendering as the next observation, reward
`invalid_reward`, and `info["invalid_action"] = True` (logged as `train/env/invalid_action`).
Rewards are Gymnasium's, as turn rewards. `max_steps` is a step budget (invalid replies
count): the episode is truncated when it is spent. Success (`info["success"]`,
`metrics.episodes`) is the environment's own `info["is_success"]` when it reports one
(Gymnasium-Robotics' convention), else, with `success_reward` set, "terminated with a
reward >= success_reward" (FrozenLake: reached the goal).

Chance: `reset(seed)` seeds Gymnasium's random generator, so the episodes of a group (which
share their seed) meet the same chance for the same moves: common random numbers, and the
group's returns differ only by its choices. With `independent_chance`, the generator is
seeded again after the reset from the seed and how many resets of that seed this process
has made before: the group's episodes start alike (the reset's draws are the seed's) but
meet their own chance, as in an environment whose luck cannot be replayed. Deterministic for
a given order of resets.

`gymnasium` is optional: `pip install 'tunix-ppo-ext[gym]'`; without it the adapter
raises one line saying so.
"""

from __future__ import annotations

import collections
import importlib
import inspect
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import check_integer
from tunix_ppo_ext._src.plugins.protocols import StepOutput

PREFIX = "gym:"
INSTALL = "pip install 'tunix-ppo-ext[gym]' (or: pip install gymnasium)"
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")

Renderer = Callable[[Any, Any], str]
ActionParser = Callable[[str, Any], Any]


def import_gymnasium() -> Any:
  """The `gymnasium` module; ValueError saying how to install it when missing."""
  try:
    return importlib.import_module("gymnasium")
  except ImportError:
    raise ValueError(f"Gymnasium environments need the gymnasium package: {INSTALL}") from None


def resolve_callable(
  value: str | Callable[..., Any] | None, what: str
) -> Callable[..., Any] | None:
  """A callable as given, or loaded from `"module:function"`; ValueError naming `what`."""
  if value is None:
    return value
  if callable(value):
    check_two_arguments(value, what, value)
    return value
  module, _, name = str(value).partition(":")
  try:
    loaded = getattr(importlib.import_module(module), name) if name else None
  except (ImportError, AttributeError) as err:
    raise ValueError(f"{what} {value!r} cannot be loaded: {err}") from None
  if not callable(loaded):
    raise ValueError(f"{what} must be a callable or 'module:function', got {value!r}")
  check_two_arguments(loaded, what, value)
  return loaded


SIGNATURES = {"render": "(env, observation) -> str", "parse_action": "(text, env) -> action"}


def check_two_arguments(function: Callable[..., Any], what: str, value: object) -> None:
  """ValueError naming `what` when `function` cannot be called with two positional
  arguments (a renderer's or parser's signature); unknown signatures pass."""
  try:
    signature = inspect.signature(function)
  except (TypeError, ValueError):  # a builtin without one
    return
  try:
    signature.bind(None, None)
  except TypeError as err:
    expected = SIGNATURES.get(what, "two arguments")
    raise ValueError(f"{what} {value!r} must take {expected}: {err}") from None


def ansi_text(env: Any, observation: Any) -> str:
  """The default renderer: the `ansi` rendering without escape codes, else `str(obs)`."""
  if getattr(env, "render_mode", None) == "ansi":
    return _ANSI_ESCAPE.sub("", str(env.render())).strip("\n")
  return str(observation)


def discrete_action(text: str, env: Any, names: Sequence[str] = ()) -> int | None:
  """The default parser for `Discrete` spaces: a listed name or an integer in the space."""
  reply = text.strip().lower()
  if reply in names:
    return list(names).index(reply)
  space = env.action_space
  if not re.fullmatch(r"-?[0-9]{1,9}", reply):
    return None
  action = int(reply)
  start = int(getattr(space, "start", 0))
  return action if start <= action < start + int(space.n) else None


class GymEnv:
  """A Gymnasium environment behind the text `Environment` protocol (see the module doc).

  Args:
    env_id: the Gymnasium id (`FrozenLake-v1`).
    max_return: the best episode return (for the summary); default: the spec's
      `reward_threshold`, else a ValueError asking for it.
    max_steps: step budget per episode (None: only the environment's own limits).
    render, parse_action: replacements (callables or `"module:function"`).
    action_names: names the default parser accepts for actions 0, 1, ...
    invalid_feedback: the text that starts the observation after an invalid reply.
    invalid_reward: the reward of an invalid reply.
    success_reward: see the module doc.
    make_kwargs: keyword arguments of `gymnasium.make`.
    independent_chance: each reset of a seed meets its own chance (see the module doc).
  """

  def __init__(
    self,
    env_id: str,
    *,
    max_return: float | None = None,
    max_steps: int | None = None,
    render: str | Renderer | None = None,
    parse_action: str | ActionParser | None = None,
    action_names: Sequence[str] = (),
    invalid_feedback: str = "invalid action",
    invalid_reward: float = 0.0,
    success_reward: float | None = None,
    make_kwargs: dict[str, Any] | None = None,
    independent_chance: bool = False,
  ):
    if not isinstance(independent_chance, bool):
      raise ValueError(
        f"independent_chance={independent_chance!r} is invalid: must be true or false."
      )
    self.independent_chance = independent_chance
    gym = import_gymnasium()
    # the renderer's and parser's modules first: one of them may register the id
    self.render = resolve_callable(render, "render") or ansi_text
    names = [str(n).lower() for n in action_names]
    self.parse_action = resolve_callable(parse_action, "parse_action") or (
      lambda text, env: discrete_action(text, env, names)
    )
    self.env = _make(gym, registered_id(env_id), dict(make_kwargs or {}), render is None)
    self.name = f"{PREFIX}{env_id}"
    self.max_return = _max_return(self.env, env_id, max_return)
    self.max_steps = None if max_steps is None else check_integer("max_steps", max_steps, low=1)
    if parse_action is None and not hasattr(self.env.action_space, "n"):
      raise ValueError(
        f"{self.name}: the default action parser needs a Discrete action space, got "
        f"{self.env.action_space}; pass parse_action"
      )
    self.invalid_feedback = invalid_feedback
    self.invalid_reward = float(invalid_reward)
    self.success_reward = success_reward
    self._observation: Any = None
    self._steps = 0

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """`gymnasium` reset with `seed`; the rendered first observation."""
    self._observation, info = self.env.reset(seed=int(seed))
    if self.independent_chance:  # the start as the seed's; the rest of the luck the episode's
      draw = _resets_before(self.name, int(seed))
      entropy = [int(seed) % 2**63, draw]
      self.env.unwrapped.np_random = np.random.Generator(np.random.PCG64(entropy))
    self._steps = 0
    return self.render(self.env, self._observation), dict(info)

  def step(self, action: str) -> StepOutput:
    """Parses the reply; a valid action steps the environment, an invalid one gets feedback."""
    self._steps += 1
    parsed = self.parse_action(action, self.env)
    if parsed is None:
      text = f"{self.invalid_feedback}\n{self.render(self.env, self._observation)}"
      reward, terminated, truncated, info = self.invalid_reward, False, False, {}
    else:
      self._observation, reward, terminated, truncated, info = self.env.step(parsed)
      text, info = self.render(self.env, self._observation), dict(info)
    info["invalid_action"] = parsed is None
    info = self._with_success(info, float(reward), bool(terminated))
    over_budget = self.max_steps is not None and self._steps >= self.max_steps
    return text, float(reward), bool(terminated), bool(truncated) or over_budget, info

  def anchor(self) -> tuple[Any, int]:
    """The state the agent acts in (GiGPO's anchor): the last observation (arrays as nested
    tuples) and the steps taken."""
    return _hashable(self._observation), self._steps

  def _with_success(self, info: dict[str, Any], reward: float, terminated: bool) -> dict[str, Any]:
    if "is_success" in info:
      info["success"] = bool(info["is_success"])
    elif self.success_reward is not None:
      info["success"] = terminated and reward >= self.success_reward
    return info


def _hashable(value: Any) -> Any:
  """`value` as a hashable key: arrays and sequences as tuples, mappings as sorted items."""
  if isinstance(value, np.ndarray):
    return (value.shape, tuple(value.reshape(-1).tolist()))
  if isinstance(value, dict):
    return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
  if isinstance(value, list | tuple):
    return tuple(_hashable(v) for v in value)
  return value.item() if isinstance(value, np.generic) else value


_RESETS: collections.Counter[tuple[str, int]] = collections.Counter()
_RESETS_LOCK = threading.Lock()


def _resets_before(name: str, seed: int) -> int:
  """How many `independent_chance` resets of `seed` this process made before (then one more)."""
  with _RESETS_LOCK:
    count = _RESETS[(name, seed)]
    _RESETS[(name, seed)] += 1
  return count


def registered_id(env_id: str) -> str:
  """`module:Id` (Gymnasium's own form) imports `module` (which registers `Id`) and gives
  `Id`; a plain id is returned as it is. ValueError naming the module when it cannot load."""
  module, sep, name = env_id.rpartition(":")
  if not sep:
    return env_id
  try:
    importlib.import_module(module)
  except ImportError as err:
    raise ValueError(
      f"gym:{env_id}: module {module!r} (which should register {name!r}) cannot be imported: {err}"
    ) from None
  return name


def _make(gym: Any, env_id: str, make_kwargs: dict[str, Any], want_ansi: bool) -> Any:
  """`gymnasium.make`, in `ansi` render mode when the default renderer can use it."""
  try:
    spec = gym.spec(env_id)
    modes = _render_modes(gym, spec)
    if want_ansi and "ansi" in modes and "render_mode" not in make_kwargs:
      make_kwargs["render_mode"] = "ansi"
    return gym.make(env_id, **make_kwargs)
  except gym.error.Error as err:
    raise ValueError(f"gym:{env_id}: {err}") from None
  except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:  # the env's own
    raise ValueError(
      f"gym:{env_id} with make_kwargs {make_kwargs!r}: {type(err).__name__}: {err}"
    ) from None


def _render_modes(gym: Any, spec: Any) -> list[str]:
  """The render modes the environment class declares (without building it)."""
  entry = spec.entry_point
  creator = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
  return list(getattr(creator, "metadata", {}).get("render_modes", []))


def _max_return(env: Any, env_id: str, max_return: float | None) -> float:
  if max_return is not None:
    return float(max_return)
  threshold = getattr(env.spec, "reward_threshold", None)
  if threshold is None:
    raise ValueError(f"gym:{env_id} has no reward_threshold: set env.kwargs.max_return")
  return float(threshold)
