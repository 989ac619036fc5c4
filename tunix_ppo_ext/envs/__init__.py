"""Text environments: the protocol's checks and factory, and the built-in tasks.

`Environment` (in `tunix_ppo_ext.plugins.protocols`) is the Gymnasium-style protocol:
`reset(seed) -> (observation, info)`, `step(action) -> (observation, reward, terminated,
truncated, info)`, plus `name` and `max_return`. Built-ins: `MemoryEnv` (`memory`, the
embedded default) and the Countdown tasks (`tunix_ppo_ext.envs.countdown`).
"""

from tunix_ppo_ext.envs.base import (
  MALFORMED_KEY,
  EnvSpec,
  env_name,
  is_malformed,
  make_env,
  validate_reset_output,
  validate_step_output,
)
from tunix_ppo_ext.envs.memory import MemoryEnv
from tunix_ppo_ext.plugins.protocols import Environment, StepOutput

__all__ = [
  "MALFORMED_KEY",
  "EnvSpec",
  "Environment",
  "MemoryEnv",
  "StepOutput",
  "env_name",
  "is_malformed",
  "make_env",
  "validate_reset_output",
  "validate_step_output",
]
