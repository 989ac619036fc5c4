"""tunix-ppo-ext: PPO extensions for Google's tunix.

The public API, re-exported from its layers the way optax does:

- `tunix_ppo_ext.ops`: pure JAX math (no tunix): KL estimators and controllers, losses,
  advantage estimators, log-probs / entropy / full KL from logits.
- `tunix_ppo_ext.config`: configured names resolved to callables (`resolve_kl_method`).
- `tunix_ppo_ext.data`: `TrajectoryBatch` and reward policies.
- `tunix_ppo_ext.tunix`: everything that touches tunix (`PpoExtConfig`, `PpoExtLearner`,
  `MultiTurnRollout`, the mask-aware model passes), loaded on first use, so that
  `import tunix_ppo_ext` and the math do not import tunix.

Importing the package registers nothing anywhere; `PpoExtLearner` puts its configured
names into tunix's `function_registry` when it is built.
"""

from __future__ import annotations

import importlib
from typing import Any

from tunix_ppo_ext.data import TrajectoryBatch
from tunix_ppo_ext.ops import (
  AdaptiveKLController,
  FixedKLController,
  aggregate_loss,
  compute_gae_advantages,
  compute_grpo_advantages,
  compute_kl_divergence,
  compute_reinforce_plus_plus_advantages,
  compute_rloo_advantages,
  entropy_from_logits,
  full_kl_divergence,
  logps_and_entropy,
  make_kl_controller,
  policy_loss,
  value_loss,
)

__version__ = "0.1.0"

# name -> module that defines it; imported on first access (these import tunix).
_LAZY = {
  "PpoExtConfig": "tunix_ppo_ext.tunix.ppo_config",
  "PpoExtLearner": "tunix_ppo_ext.tunix.learner",
  "MultiTurnRollout": "tunix_ppo_ext.tunix.rollout",
  "compute_completion_logits": "tunix_ppo_ext.tunix.passes",
  "compute_per_token_logps": "tunix_ppo_ext.tunix.passes",
  "compute_score": "tunix_ppo_ext.tunix.passes",
  "process_ids": "tunix_ppo_ext.tunix.passes",
}


def __getattr__(name: str) -> Any:
  if name in _LAZY:
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'tunix_ppo_ext' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_LAZY))


__all__ = [
  "AdaptiveKLController",
  "FixedKLController",
  "MultiTurnRollout",
  "PpoExtConfig",
  "PpoExtLearner",
  "TrajectoryBatch",
  "aggregate_loss",
  "compute_completion_logits",
  "compute_gae_advantages",
  "compute_grpo_advantages",
  "compute_kl_divergence",
  "compute_per_token_logps",
  "compute_reinforce_plus_plus_advantages",
  "compute_rloo_advantages",
  "compute_score",
  "entropy_from_logits",
  "full_kl_divergence",
  "logps_and_entropy",
  "make_kl_controller",
  "policy_loss",
  "value_loss",
]
