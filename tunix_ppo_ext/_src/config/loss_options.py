"""The checks of verl's other policy losses and rollout correction that combine fields of
`PpoExtConfig` (each field alone: `config.ppo_section`'s tables), one `ConfigError` line
naming the field as `keys` names it:

- `clip_cov_lb` < `clip_cov_ub` (Clip-Cov's covariance band);
- `rollout_rs_threshold_lower` (k1 modes only, default `1 / upper`) below
  `rollout_rs_threshold`, for the `rollout_rs` mode (`ops.rollout_correction.rs_bounds`).
"""

from __future__ import annotations

from typing import Any

from tunix_ppo_ext._src.checks import ConfigError, FieldKeys, check_number
from tunix_ppo_ext._src.ops.rollout_correction import rs_bounds


def validate_toolbox(config: Any, keys: FieldKeys) -> None:
  """Checks the combinations listed in the module docstring (ConfigError naming the field).

  Args:
    config: the `PpoExtConfig` being checked (its fields checked alone already).
    keys: how the messages name the fields (`PpoExtConfig.tau_pos`, `ppo.tau_pos`).
  """
  check_number(
    keys.subject("clip_cov_ub"), config.clip_cov_ub, low=config.clip_cov_lb, low_open=True
  )
  if config.rollout_rs is not None:
    try:
      rs_bounds(config.rollout_rs, config.rollout_rs_threshold, config.rollout_rs_threshold_lower)
    except ValueError as err:
      raise ConfigError(
        f"{keys.subject('rollout_rs_threshold_lower')}={config.rollout_rs_threshold_lower!r} "
        f"is invalid with {keys.key('rollout_rs')}={config.rollout_rs!r}: {err}"
      ) from None
