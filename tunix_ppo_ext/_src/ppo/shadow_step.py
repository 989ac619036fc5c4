"""Shadow estimators: on a training batch, the advantages every listed estimator would give
and their noise on one scale, beside the run's own (no tunix).

`shadow_advantages` runs each estimator of `metrics.shadow_estimators` on the batch the run
trains on (the critic's values where the run has a critic), as it would train on them, and
gives its common-scale noise (`advantage_step.common_scale_noise`) under
`shadow/<name>/...`. The policy gradients' agreement between the batch's two halves (the
learner's `shadow_gradients`) takes the same advantages. `halves` splits the batch by
groups, so no group estimator's baseline spans both halves' gradients unevenly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.ppo import advantage_step

PREFIX = "shadow"


def check_shadow_estimators(names: Sequence[str], has_critic: bool, key: str) -> tuple[str, ...]:
  """`names` as a tuple, each a registered estimator, one that takes a critic's values only
  where the run has a critic; a ConfigError naming `key` otherwise."""
  if isinstance(names, str) or not isinstance(names, Sequence):
    raise ConfigError(f"{key}={names!r} is invalid: must be a list of advantage estimators.")
  known = registry.names(registry.ADVANTAGE_ESTIMATORS)
  for name in names:
    if not isinstance(name, str) or not registry.has(registry.ADVANTAGE_ESTIMATORS, name):
      raise ConfigError(f"{key}: {name!r} is not an advantage estimator; one of {list(known)}")
    if not has_critic and registry.needs_critic(name):
      raise ConfigError(
        f"{key}: {name!r} needs a critic's values; this run has none (its estimator takes none)"
      )
  if len(set(names)) != len(names):
    raise ConfigError(f"{key}={list(names)!r} names an estimator twice")
  return tuple(names)


def halves(groups: np.ndarray) -> np.ndarray:
  """`[B]` bool, True for the rows of the first half of the batch's groups (in id order)."""
  ids = np.unique(groups)
  return np.isin(groups, ids[: max(1, len(ids) // 2)])


def shadow_advantages(
  config: Any,
  names: Sequence[str],
  terms: tuple[Any, Any, Any, np.ndarray],
  anchors: Any | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """`({name: advantages [B, T] as trained}, metrics)`: every estimator of `names` on the
  batch `terms = (rewards, values, loss_mask, groups)`, with the config's lambdas and
  normalization, and its noise as `shadow/<name>/advantage_noise[_trained][_turn]`."""
  rewards, values, loss_mask, groups = terms
  lam = advantage_step.policy_lambda(config, loss_mask)
  found, metrics = {}, {}
  for name in names:
    run = (config, rewards, values, loss_mask, groups, lam)
    trained, returns = advantage_step.estimate(*run, anchors=anchors, name=name)
    raw, _ = advantage_step.estimate(*run, normalize=False, anchors=anchors, name=name)
    noise = advantage_step.common_scale_noise(
      config, rewards, loss_mask, groups, (raw, trained, returns), anchors, name=name
    )
    metrics |= {f"{PREFIX}/{name}/{k.removeprefix('learner/')}": v for k, v in noise.items()}
    found[name] = np.asarray(trained, np.float32)
  return found, metrics
