"""Text environments: the Gymnasium-style protocol, its checks and factory, the built-ins.

`Environment` is the protocol: `reset(seed) -> (observation, info)`, `step(action) ->
(observation, reward, terminated, truncated, info)`, plus `name` and `max_return`.
`make_env(name, **kwargs)` builds any registered environment (built-ins, plugins,
`gym:<id>` for Gymnasium ids). Built-ins: `MemoryEnv` (`memory`, the embedded default),
`StashEnv`, `CountdownEnv` and `CountdownMultiTurnEnv`, `GuessEnv` (`guess`: a number
guessing game with higher/lower feedback, for instruct models), `FrozenLakeEnv`, `SokobanEnv`,
and `GymEnv` (any Gymnasium text-renderable environment). tunix's own agentic
environments are in `tunix_ppo_ext.rollout.TunixEnv`.
"""

from tunix_ppo_ext._src.envs.base import (
  MALFORMED_KEY,
  EnvSpec,
  env_name,
  is_malformed,
  make_env,
  validate_reset_output,
  validate_step_output,
)
from tunix_ppo_ext._src.envs.countdown import (
  COUNTDOWN_ALPHABET,
  CountdownEnv,
  CountdownMultiTurnEnv,
)
from tunix_ppo_ext._src.envs.frozenlake import FrozenLakeEnv, render_board
from tunix_ppo_ext._src.envs.guess import GuessEnv
from tunix_ppo_ext._src.envs.gym_adapter import GymEnv
from tunix_ppo_ext._src.envs.memory import MemoryEnv
from tunix_ppo_ext._src.envs.sokoban import SokobanEnv
from tunix_ppo_ext._src.envs.stash import StashEnv
from tunix_ppo_ext._src.plugins.protocols import Environment, StepOutput

__all__ = [
  "COUNTDOWN_ALPHABET",
  "MALFORMED_KEY",
  "CountdownEnv",
  "CountdownMultiTurnEnv",
  "EnvSpec",
  "Environment",
  "FrozenLakeEnv",
  "GuessEnv",
  "GymEnv",
  "MemoryEnv",
  "SokobanEnv",
  "StashEnv",
  "StepOutput",
  "env_name",
  "is_malformed",
  "make_env",
  "render_board",
  "validate_reset_output",
  "validate_step_output",
]
