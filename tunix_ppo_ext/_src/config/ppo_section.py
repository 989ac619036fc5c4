"""The `ppo` section's keys without tunix: each key with its kind and bound.

`PpoExtConfig` (tunix's `PPOConfig` plus this package's fields, `tunix_ppo_ext._src.tunix.
learner.ppo_config`) checks its fields with these tables, and a run config checks its
`ppo` section with them before JAX or tunix is imported (`check_ppo_section`): an unknown
key, a wrong type or a value out of its bound is refused in one line naming `ppo.<key>`.
What needs tunix or the plugin registry (the estimators' and losses' names, the KL
estimators, how fields combine) is `PpoExtConfig`'s own check. The tables hold every field
of `PpoExtConfig`, tunix's too; a test pins them to its fields on each tunix version.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tunix_ppo_ext._src.checks import (
  ConfigError,
  FieldKeys,
  check_integer,
  check_number,
  did_you_mean,
)
from tunix_ppo_ext._src.names import NONFINITE_REWARD_MODES, ROLLOUT_IS_LEVELS, ROLLOUT_RS_MODES

KL_PENALTY_PLACEMENTS = ("reward", "loss", "none")
KL_CONTROLLERS = ("fixed", "adaptive")

# the number fields and their intervals (`check_number`'s bounds; `none_ok`: None allowed:
# `epsilon_low`, `epsilon_high` and `entropy_coef` None take PpoExtConfig's default)
_OPEN_UNIT = {"low": 0.0, "high": 1.0, "low_open": True, "high_open": True}
NUMBERS: dict[str, dict[str, Any]] = {
  "epsilon": _OPEN_UNIT,
  "epsilon_low": {**_OPEN_UNIT, "none_ok": True},
  "epsilon_high": {"low": 0.0, "low_open": True, "none_ok": True},
  "epsilon_c": {"low": 1.0, "low_open": True, "none_ok": True},
  "entropy_coef": {"low": 0.0, "none_ok": True},
  "beta": {"low": 0.0},
  "kl_loss_coef": {"low": 0.0},
  "gamma": {"low": 0.0, "high": 1.0},
  "gigpo_step_weight": {"low": 0.0},
  "gae_lambda": {"low": 0.0, "high": 1.0},
  "critic_lambda": {"low": 0.0, "high": 1.0, "none_ok": True},
  "adaptive_lambda_alpha": {"low": 0.0, "low_open": True, "none_ok": True},
  "gamma_turn": {"low": 0.0, "high": 1.0, "none_ok": True},
  "critic_warmup_lambda": {"low": 0.0, "high": 1.0},
  "critic_warmup_until_ev": {"high": 1.0, "none_ok": True},
  "kl_target": {"low": 0.0, "low_open": True},
  "kl_horizon": {"low": 0.0, "low_open": True},
  "kl_clamp_value": {"low": 0.0, "low_open": True, "none_ok": True},
  "logps_temperature": {"low": 0.0, "low_open": True, "none_ok": True},
  "clip_range_value": {"low": 0.0, "low_open": True, "none_ok": True},
  # verl's other policy losses (`tunix_ppo_ext._src.tunix.learner.verl_loss_fns`): SAPO's
  # gate temperatures, the share of tokens Clip-Cov / KL-Cov act on, Clip-Cov's band
  # (`clip_cov_lb` < `clip_cov_ub`: `config.loss_options`), KL-Cov's coefficient
  "tau_pos": {"low": 0.0, "low_open": True},
  "tau_neg": {"low": 0.0, "low_open": True},
  "clip_cov_ratio": {"low": 0.0, "high": 1.0, "low_open": True},
  "clip_cov_lb": {},
  "clip_cov_ub": {},
  "kl_cov_ratio": {"low": 0.0, "high": 1.0, "low_open": True},
  "ppo_kl_coef": {"low": 0.0},
  # rollout correction's thresholds (the lower one below the upper: `config.loss_options`)
  "rollout_is_threshold": {"low": 0.0, "low_open": True},
  "rollout_rs_threshold": {"low": 0.0, "low_open": True},
  "rollout_rs_threshold_lower": {"low": 0.0, "low_open": True, "none_ok": True},
}
# the integer fields, their least value and whether None is allowed
INTEGERS: dict[str, tuple[int, bool]] = {
  "num_iterations": (1, False),
  "critic_warmup_steps": (0, False),
  "critic_warmup_patience": (1, True),
  "logits_chunk_size": (0, False),
  "num_generations": (1, False),
  "max_nonfinite_steps": (1, False),
}
FLAGS = (
  "norm_adv_by_std",
  "gigpo_norm_by_std",
  "whiten_advantages",
  "fused_head",
  "packing",
  "recompute_old_logps",
)
# the text fields, their fixed choices (None: a name `PpoExtConfig` resolves: an
# estimator, a loss, a KL method, a mode) and whether None is allowed
TEXTS: dict[str, tuple[tuple[str, ...] | None, bool]] = {
  "algo_variant": (None, False),
  "advantage_estimator": (None, False),
  "policy_loss_fn": (None, False),
  "value_loss_fn": (None, False),
  "reward_manager": (None, False),
  "kl_method": (None, False),
  "kl_penalty": (KL_PENALTY_PLACEMENTS, False),
  "kl_ctrl": (KL_CONTROLLERS, False),
  "loss_agg_mode": (None, False),
  "value_loss_agg_mode": (None, False),
  "nonfinite_rewards": (NONFINITE_REWARD_MODES, False),
  "rollout_is": (ROLLOUT_IS_LEVELS, True),
  "rollout_rs": (ROLLOUT_RS_MODES, True),
}
FIELDS = (*NUMBERS, *INTEGERS, *FLAGS, *TEXTS)  # every field of PpoExtConfig
# PpoExtConfig fields a run config sets from another section's key
SET_ELSEWHERE = {"fused_head": "model.fused_head", "packing": "model.packing"}
KEYS = tuple(name for name in FIELDS if name not in SET_ELSEWHERE)  # the section's keys
# how the checks name the fields in a run config's messages
RUN_KEYS = FieldKeys(prefix="ppo.", elsewhere=SET_ELSEWHERE)


def check_ppo_values(values: Mapping[str, Any], keys: FieldKeys) -> dict[str, Any]:
  """Each of `values` (field name -> value) checked by its kind and bound alone; the same
  mapping with the numbers as floats. ConfigError naming the field by `keys`."""
  checked = dict(values)
  for name, value in values.items():
    subject = keys.subject(name)
    if name in NUMBERS:
      bounds = dict(NUMBERS[name])
      none_ok = bounds.pop("none_ok", False)
      if not (value is None and none_ok):
        checked[name] = check_number(subject, value, **bounds)
    elif name in INTEGERS:
      low, none_ok = INTEGERS[name]
      if not (value is None and none_ok):
        check_integer(subject, value, low)
    elif name in FLAGS and not isinstance(value, bool):
      raise ConfigError(f"{subject}={value!r} is invalid: must be True or False.")
    elif name in TEXTS:
      _check_text(subject, value, *TEXTS[name])
  return checked


def _check_text(subject: str, value: Any, choices: tuple[str, ...] | None, none_ok: bool) -> None:
  if value is None and none_ok:
    return
  if not isinstance(value, str):
    allowed = "a name" + (" or None" if none_ok else "")
    raise ConfigError(f"{subject}={value!r} is invalid: must be {allowed}.")
  if choices is not None and value not in choices:
    hint = did_you_mean(value, choices)
    allowed = f"{'None or ' if none_ok else ''}one of {list(choices)}{hint}"
    raise ConfigError(f"{subject}={value!r} is invalid: must be {allowed}.")


def check_ppo_section(given: Any) -> dict[str, Any]:
  """A run config's `ppo` section checked without tunix: a mapping of known keys (with the
  closest names for an unknown one), each value by its kind and bound.

  Args:
    given: the section as the YAML and the overrides give it.

  Returns:
    The keys given, the numbers as floats.
  """
  if not isinstance(given, dict):
    raise ConfigError(f"config key 'ppo' must be a mapping, got {given!r}")
  for key in given:
    if key in SET_ELSEWHERE:
      raise ConfigError(f"config key 'ppo.{key}': set {SET_ELSEWHERE[key]} instead")
    if key not in KEYS:
      raise ConfigError(f"unknown config key {'ppo.' + str(key)!r}{did_you_mean(key, KEYS, n=3)}")
  return check_ppo_values(given, RUN_KEYS)
