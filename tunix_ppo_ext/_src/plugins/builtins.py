"""This package's own names: the table the registry reads them from (stdlib only).

Each row names an object as `module:attribute`, imported when its name is looked up, as
an entry point would be; nothing here imports the package's modules. A new built-in is a
row here: it works from the source tree at once, with no `pip install -e .` again
(entry points, read from installed metadata, are for other distributions' plugins).

An advantage estimator's row says whether it takes a critic's values (`needs_critic`):
the learner builds a critic for it only when it does.
"""

from __future__ import annotations

import dataclasses

from tunix_ppo_ext._src.plugins import kinds


@dataclasses.dataclass(frozen=True)
class Builtin:
  """One built-in name.

  Attributes:
    target: `module:attribute` of the object, imported on first use.
    needs_critic: advantage estimators: whether it takes a critic's values (None for
      the other kinds).
  """

  target: str
  needs_critic: bool | None = None


_OPS, _LOSSES = "tunix_ppo_ext.ops", "tunix_ppo_ext.losses"

BUILTINS: dict[str, dict[str, Builtin]] = {
  kinds.KL_ESTIMATORS: {
    "kl": Builtin(f"{_OPS}:kl_k1"),
    "abs": Builtin(f"{_OPS}:kl_abs"),
    "mse_kl": Builtin(f"{_OPS}:kl_k2"),
    "low_var_kl": Builtin(f"{_OPS}:kl_k3"),
  },
  kinds.ADVANTAGE_ESTIMATORS: {
    "gae": Builtin(f"{_OPS}:compute_gae_advantages", needs_critic=True),
    "grpo": Builtin(f"{_OPS}:compute_grpo_advantages", needs_critic=False),
    "rloo": Builtin(f"{_OPS}:compute_rloo_advantages", needs_critic=False),
    "reinforce_plus_plus": Builtin(
      f"{_OPS}:compute_reinforce_plus_plus_advantages", needs_critic=False
    ),
    "turn_gae": Builtin(f"{_OPS}:compute_turn_gae_advantages", needs_critic=True),
    "gigpo": Builtin(f"{_OPS}:compute_gigpo_advantages", needs_critic=False),
  },
  kinds.POLICY_LOSSES: {
    name: Builtin(f"{_LOSSES}:{name}_policy_loss_fn")
    for name in ("ppo_ext", "gspo", "sapo", "geo_mean", "cispo", "gpg", "clip_cov", "kl_cov")
  },
  kinds.VALUE_LOSSES: {
    "ppo_ext": Builtin(f"{_LOSSES}:ppo_ext_value_loss_fn"),
  },
  kinds.ENVIRONMENTS: {
    "memory": Builtin("tunix_ppo_ext.envs:MemoryEnv"),
    "countdown": Builtin("tunix_ppo_ext.envs:CountdownEnv"),
    "countdown_multiturn": Builtin("tunix_ppo_ext.envs:CountdownMultiTurnEnv"),
    "frozenlake": Builtin("tunix_ppo_ext.envs:FrozenLakeEnv"),
    "sokoban": Builtin("tunix_ppo_ext.envs:SokobanEnv"),
    "stash": Builtin("tunix_ppo_ext.envs:StashEnv"),
    "guess": Builtin("tunix_ppo_ext.envs:GuessEnv"),
  },
  kinds.METRIC_SINKS: {
    "jsonl": Builtin("tunix_ppo_ext.metrics:jsonl_sink"),
  },
}
