"""Validation of the `PpoExtConfig` fields of verl's other policy losses and rollout correction.

`validate_toolbox(config, keys)` checks, in place (numbers stored as floats), each field with
one `ConfigError` line naming it (as `keys` names it), the value and what is allowed:

- `tau_pos`, `tau_neg` (SAPO's gate temperatures): finite, > 0.
- `clip_cov_ratio`, `kl_cov_ratio` (share of tokens Clip-Cov / KL-Cov act on): in (0, 1].
- `clip_cov_lb` < `clip_cov_ub` (Clip-Cov's covariance band); `ppo_kl_coef` (KL-Cov) >= 0.
- `rollout_is`: None, `token` or `sequence`; `rollout_is_threshold` (TIS truncation) > 0.
- `rollout_rs`: None or one of `ops.rollout_correction.ROLLOUT_RS_MODES`; its thresholds
  `rollout_rs_threshold` (upper, > 0) and `rollout_rs_threshold_lower` (k1 modes only,
  default `1 / upper`, must be below it).
"""

from __future__ import annotations

from typing import Any

from tunix_ppo_ext._src.checks import ConfigError, FieldKeys, check_number, did_you_mean
from tunix_ppo_ext._src.ops.rollout_correction import ROLLOUT_IS_LEVELS, ROLLOUT_RS_MODES, rs_bounds

_POSITIVE = ("tau_pos", "tau_neg", "rollout_is_threshold", "rollout_rs_threshold")
_SHARES = ("clip_cov_ratio", "kl_cov_ratio")


def _number(config: Any, keys: FieldKeys, name: str, **bounds: Any) -> None:
  value = check_number(keys.subject(name), getattr(config, name), **bounds)
  setattr(config, name, value)


def _choice(config: Any, keys: FieldKeys, name: str, accepted: tuple[str, ...]) -> None:
  value = getattr(config, name)
  if value is not None and value not in accepted:
    raise ConfigError(
      f"{keys.subject(name)}={value!r} is invalid: must be None or one of "
      f"{list(accepted)}{did_you_mean(value, accepted)}."
    )


def validate_toolbox(config: Any, keys: FieldKeys) -> None:
  """Checks the fields listed in the module docstring (ConfigError naming the field).

  Args:
    config: the `PpoExtConfig` being checked; its numbers are stored as floats.
    keys: how the messages name the fields (`PpoExtConfig.tau_pos`, `ppo.tau_pos`).
  """
  for name in _POSITIVE:
    _number(config, keys, name, low=0.0, low_open=True)
  for name in _SHARES:
    _number(config, keys, name, low=0.0, high=1.0, low_open=True)
  _number(config, keys, "ppo_kl_coef", low=0.0)
  _number(config, keys, "clip_cov_lb")
  _number(config, keys, "clip_cov_ub", low=config.clip_cov_lb, low_open=True)
  _choice(config, keys, "rollout_is", ROLLOUT_IS_LEVELS)
  _choice(config, keys, "rollout_rs", ROLLOUT_RS_MODES)
  if config.rollout_rs_threshold_lower is not None:
    _number(config, keys, "rollout_rs_threshold_lower", low=0.0, low_open=True)
  if config.rollout_rs is not None:
    try:
      rs_bounds(config.rollout_rs, config.rollout_rs_threshold, config.rollout_rs_threshold_lower)
    except ValueError as err:
      raise ConfigError(
        f"{keys.subject('rollout_rs_threshold_lower')}={config.rollout_rs_threshold_lower!r} "
        f"is invalid with {keys.key('rollout_rs')}={config.rollout_rs!r}: {err}"
      ) from None
