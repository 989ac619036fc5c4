"""The losses in tunix's loss-function signature: what `ppo.policy_loss_fn` and
`ppo.value_loss_fn` name, and what the built-in entry points of the `policy_losses` and
`value_losses` plugin kinds load.

- `ppo_ext_policy_loss_fn`: PPO's clipped surrogate with every `PpoExtConfig` knob
  (asymmetric and dual clipping, verl's aggregation modes, entropy and KL terms).
- `ppo_ext_value_loss_fn`: the clipped value loss with its aggregation.
- verl's other policy losses: `gspo_policy_loss_fn`, `sapo_policy_loss_fn`,
  `geo_mean_policy_loss_fn`, `cispo_policy_loss_fn`, `gpg_policy_loss_fn`,
  `clip_cov_policy_loss_fn`, `kl_cov_policy_loss_fn` (the math: `tunix_ppo_ext.ops`).

Every name here loads tunix on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunix_ppo_ext import _lazy_attributes

_LOSS_FNS = "tunix_ppo_ext._src.tunix.learner.loss_fns"
_VERL_LOSS_FNS = "tunix_ppo_ext._src.tunix.learner.verl_loss_fns"
_LAZY = {
  "ppo_ext_policy_loss_fn": _LOSS_FNS,
  "ppo_ext_value_loss_fn": _LOSS_FNS,
  **{
    f"{name}_policy_loss_fn": _VERL_LOSS_FNS
    for name in ("gspo", "sapo", "geo_mean", "cispo", "gpg", "clip_cov", "kl_cov")
  },
}

if TYPE_CHECKING:
  from tunix_ppo_ext._src.tunix.learner.loss_fns import (
    ppo_ext_policy_loss_fn,
    ppo_ext_value_loss_fn,
  )
  from tunix_ppo_ext._src.tunix.learner.verl_loss_fns import (
    cispo_policy_loss_fn,
    clip_cov_policy_loss_fn,
    geo_mean_policy_loss_fn,
    gpg_policy_loss_fn,
    gspo_policy_loss_fn,
    kl_cov_policy_loss_fn,
    sapo_policy_loss_fn,
  )

__all__ = [
  "cispo_policy_loss_fn",
  "clip_cov_policy_loss_fn",
  "geo_mean_policy_loss_fn",
  "gpg_policy_loss_fn",
  "gspo_policy_loss_fn",
  "kl_cov_policy_loss_fn",
  "ppo_ext_policy_loss_fn",
  "ppo_ext_value_loss_fn",
  "sapo_policy_loss_fn",
]

__getattr__, __dir__ = _lazy_attributes(_LAZY, globals(), __name__)
