"""tunix's agentic environments (`tunix.rl.agentic`) as text environments for `PpoExtLearner`.

`TunixEnv(make_env)` puts a tunix `BaseEnv` / `BaseTaskEnv` (e.g. `ToolEnvironment` with
tunix's tools, `TaskEnvironment`) behind this package's `Environment` protocol, so
`MultiTurnRollout` trains it with PPO: `make_env(seed)` builds the episode's environment.

- Observations: the task's `question` (else the text of the observation), after the
  tool prompt of tunix's parser (`tool_prompt=True`, for environments with tools); a tool
  result becomes `<tool_response>OUTPUT</tool_response>` per call. Observations are
  attended, never trained (the rollout's loss mask).
- Replies: parsed by a tunix tool parser (`parser`: a name in tunix's registry, default
  `qwen`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; or your own subclass
  of tunix's `ToolParser`, class or instance, for another call format: tunix has no public
  way to add a name to its registry, and none is needed). With tool calls the
  environment runs them; without, the reply is a `finish` call with the reply as its
  response, as tunix's `ToolAgent` does (environments without tools get the reply text).
- Rewards: the environment's (a `RewardOutput`'s `reward`), as turn rewards. `done` ends the
  episode (tunix's `max_steps` truncation included). With `success_reward` set, an
  episode that ends with a reward >= it is a success (`info["success"]`);
  `info["tool_calls"]` counts the calls of the reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tunix.rl.agentic.environments import base_environment
from tunix.rl.agentic.parser.tool_parser import tool_parser_base, tool_parser_registry
from tunix.rl.agentic.rewards import reward_types

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.plugins.protocols import StepOutput

RESPONSE = "<tool_response>{}</tool_response>"


def observation_text(observation: Any) -> str:
  """Text of a tunix observation: tool outputs, a task's `question`, a string, or ''."""
  if isinstance(observation, dict) and "tool_outputs" in observation:
    return "".join(RESPONSE.format(out) for out in observation["tool_outputs"].values())
  if isinstance(observation, dict) and "question" in observation:
    return str(observation["question"])
  if isinstance(observation, dict) and not observation:
    return ""
  return str(observation)


def tool_parser(parser: Any) -> tool_parser_base.ToolParser:
  """A tunix `ToolParser` from a registry name, a `ToolParser` subclass or an instance."""
  if isinstance(parser, tool_parser_base.ToolParser):
    return parser
  if isinstance(parser, type) and issubclass(parser, tool_parser_base.ToolParser):
    return parser()
  if isinstance(parser, str):
    try:
      return tool_parser_registry.get_tool_parser(parser)()
    except ValueError:
      raise ConfigError(
        f"parser={parser!r} is not a tool parser in tunix's registry (e.g. 'qwen', "
        "'gemini'); for another format pass your own subclass of tunix's "
        "tool_parser_base.ToolParser"
      ) from None
  raise ConfigError(
    f"parser={parser!r}: must be a name in tunix's tool-parser registry or a tunix "
    "tool_parser_base.ToolParser (class or instance)"
  )


class TunixEnv:
  """A tunix agentic environment as a text `Environment` (see the module docstring).

  Args:
    make_env: `seed -> tunix BaseEnv`, one fresh environment per episode.
    name: the name in errors and metrics.
    max_return: the best episode return (for the summary).
    parser: tunix's tool-parser name (`tool_parser_registry`), or a subclass (or
      instance) of tunix's `tool_parser_base.ToolParser`.
    tool_prompt: put the parser's tool prompt before the first observation.
    success_reward: see the module docstring (None: no success reported).
  """

  def __init__(
    self,
    make_env: Callable[[int], base_environment.BaseEnv],
    *,
    name: str = "tunix",
    max_return: float = 1.0,
    parser: str | type[tool_parser_base.ToolParser] | tool_parser_base.ToolParser = "qwen",
    tool_prompt: bool = True,
    success_reward: float | None = None,
  ):
    self.make_env = make_env
    self.name, self.max_return = name, float(max_return)
    self.parser = tool_parser(parser)
    self.tool_prompt, self.success_reward = tool_prompt, success_reward
    self.env: base_environment.BaseEnv | None = None

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """A fresh environment for `seed`, reset; its first observation as text."""
    self.env = self.make_env(int(seed))
    observation, info = self.env.reset()
    text = observation_text(observation)
    tools = getattr(self.env, "tool_manager", None)
    if self.tool_prompt and tools is not None:
      text = f"{self.parser.get_tool_prompt(tools.get_tools())}\n{text}"
    return text, dict(info or {})

  def action(self, reply: str) -> tuple[Any, int]:
    """`(tunix action, number of tool calls)` of a reply (module docstring)."""
    if getattr(self.env, "tool_manager", None) is None:
      return reply, 0
    try:
      calls = self.parser.parse(reply)
    except (ValueError, KeyError, TypeError):  # malformed JSON inside the tags
      calls = []
    if not calls:
      finish = {"name": "finish", "arguments": {"response": reply}}
      return [{"id": "call_0", "type": "function", "function": finish}], 0
    return [
      {
        "id": f"call_{n}",
        "type": "function",
        "function": {"name": call.name, "arguments": _json_arguments(call.arguments)},
      }
      for n, call in enumerate(calls)
    ], len(calls)

  def step(self, reply: str) -> StepOutput:
    """Runs the reply's tool calls (or finishes); the result as text, the reward as float."""
    if self.env is None:
      raise RuntimeError("call reset() before step()")
    action, num_calls = self.action(reply)
    observation, reward, done, info = self.env.step(action)
    if isinstance(reward, reward_types.RewardOutput):
      reward = reward.reward
    info = {k: v for k, v in dict(info or {}).items() if k != "response"}
    info["tool_calls"] = num_calls
    if self.success_reward is not None:
      info["success"] = bool(done) and float(reward) >= self.success_reward
    return observation_text(observation), float(reward), bool(done), False, info


def _json_arguments(arguments: Any) -> str:
  """Arguments as the JSON text tunix's `ToolEnvironment` decodes."""
  return arguments if isinstance(arguments, str) else json.dumps(arguments)
