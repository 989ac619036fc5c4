"""Plugins (stdlib only, no side effects): the kinds, what each must be, and the registry.

This package's own names are registered in code (a table in the package); a plugin is a
name in one of the `tunix_ppo_ext.<kind>` entry-point groups of another distribution
(kinds: `kl_estimators`, `policy_losses`, `value_losses`, `advantage_estimators`,
`metric_sinks`, `environments`) or an in-code `register(kind, name)`. `get(kind, name)`
loads one (`name@distribution` picks one of two offers); `report()` lists what is
available and whether it loads (`tunix-ppo-ext plugins`); `needs_critic(name)` says
whether an advantage estimator takes a critic's values. An environment plugin is a
`tunix_ppo_ext.envs.Environment`.
"""

from tunix_ppo_ext._src.plugins.kinds import (
  ADVANTAGE_ESTIMATORS,
  ENVIRONMENTS,
  KINDS,
  KL_ESTIMATORS,
  METRIC_SINKS,
  POLICY_LOSSES,
  VALUE_LOSSES,
)
from tunix_ppo_ext._src.plugins.registry import (
  PluginError,
  UnknownNameError,
  format_report,
  get,
  names,
  needs_critic,
  register,
  report,
  unregister,
)

__all__ = [
  "ADVANTAGE_ESTIMATORS",
  "ENVIRONMENTS",
  "KINDS",
  "KL_ESTIMATORS",
  "METRIC_SINKS",
  "POLICY_LOSSES",
  "VALUE_LOSSES",
  "PluginError",
  "UnknownNameError",
  "format_report",
  "get",
  "names",
  "needs_critic",
  "register",
  "report",
  "unregister",
]
