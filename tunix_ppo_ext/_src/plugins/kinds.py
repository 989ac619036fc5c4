"""The plugin kinds: one entry-point group each (`tunix_ppo_ext.<kind>`)."""

from __future__ import annotations

KL_ESTIMATORS = "kl_estimators"
POLICY_LOSSES = "policy_losses"
VALUE_LOSSES = "value_losses"
ADVANTAGE_ESTIMATORS = "advantage_estimators"
METRIC_SINKS = "metric_sinks"
ENVIRONMENTS = "environments"
KINDS = (
  KL_ESTIMATORS,
  POLICY_LOSSES,
  VALUE_LOSSES,
  ADVANTAGE_ESTIMATORS,
  METRIC_SINKS,
  ENVIRONMENTS,
)
LABELS = {
  KL_ESTIMATORS: "KL estimator",
  POLICY_LOSSES: "policy loss",
  VALUE_LOSSES: "value loss",
  ADVANTAGE_ESTIMATORS: "advantage estimator",
  METRIC_SINKS: "metric sink",
  ENVIRONMENTS: "environment",
}
