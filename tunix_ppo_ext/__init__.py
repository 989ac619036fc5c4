"""tunix-ppo-ext: multi-turn PPO extensions for Google's tunix (JAX + Flax NNX).

The public API is this module and the modules beside it, each re-exporting a curated
`__all__` from the private implementation under `tunix_ppo_ext._src` (as optax does):

- `tunix_ppo_ext`: `PpoExtConfig` and `PpoExtLearner` (drop-in for tunix's `PPOConfig`
  and `PPOLearner`), `AgenticPpoConfig` and `AgenticPpoLearner` (PPO with a critic over
  tunix main's own agentic stack: its orchestrator, agents, environments and tools),
  `MultiTurnRollout`, and tunix's `rl/common.py` functions it extends,
  in tunix's signatures: `compute_kl_divergence(logp, ref, method=...)`, `process_ids`
  (with `completion_mask=`), `compute_per_token_logps`, `compute_score`.
- `tunix_ppo_ext.ops`: the pure JAX math (no tunix).
- `tunix_ppo_ext.envs`, `.rollout`: text environments and multi-turn rollouts.
- `tunix_ppo_ext.models`: meshes, clusters, toy and Hugging Face models, LoRA, export.
- `tunix_ppo_ext.config`, `.data`, `.metrics`, `.plugins`: configured names, trajectory
  containers, metric readers and the plot, the plugin registry.

`import tunix_ppo_ext` imports no JAX nor tunix: the names that need them load on first use.
Importing the package or building a learner changes nothing in tunix or qwix (a learner
prepares only the cluster it is given: its sampler, its checkpoints' metadata):
`install(rl_cluster=None)` does, explicitly (qwix's LoRA product; given a cluster, that
cluster's sampler; `models.build_cluster` calls it), and `register_builtins()` puts this
package's names into tunix's `function_registry` through it, for tunix's own learners.
Every such change is an entry of one table, `compat.patches.PATCHES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__version__ = "0.2.0"

# name -> module that defines it; imported on first access (these import NumPy, JAX, tunix).
_LAZY = {
  "AgenticPpoConfig": "tunix_ppo_ext._src.tunix.learner.agentic_ppo_config",
  "AgenticPpoLearner": "tunix_ppo_ext._src.tunix.learner.agentic_ppo",
  "TrajectoryBatch": "tunix_ppo_ext._src.data.trajectory",
  "compute_kl_divergence": "tunix_ppo_ext._src.ops.kl_methods",
  "PpoExtConfig": "tunix_ppo_ext._src.tunix.learner.ppo_config",
  "PpoExtLearner": "tunix_ppo_ext._src.tunix.learner.ppo_learner",
  "MultiTurnRollout": "tunix_ppo_ext._src.tunix.rollout.multi_turn",
  "compute_completion_logits": "tunix_ppo_ext._src.tunix.learner.passes",
  "compute_per_token_logps": "tunix_ppo_ext._src.tunix.learner.passes",
  "compute_score": "tunix_ppo_ext._src.tunix.learner.passes",
  "process_ids": "tunix_ppo_ext._src.tunix.learner.passes",
  "install": "tunix_ppo_ext._src.tunix.compat.patches",
  "register_builtins": "tunix_ppo_ext._src.tunix.learner.loss_fns",
}


def _lazy_attributes(
  table: dict[str, str], namespace: dict[str, Any], module: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
  """A public module's `__getattr__` and `__dir__` that import `table`'s names (name ->
  defining module) on first access, keeping the module itself free of tunix until then."""

  def __getattr__(name: str) -> Any:
    if name in table:
      value = getattr(importlib.import_module(table[name]), name)
      namespace[name] = value
      return value
    raise AttributeError(f"module {module!r} has no attribute {name!r}")

  def __dir__() -> list[str]:
    return sorted(set(namespace) | set(table))

  return __getattr__, __dir__


__all__ = [
  "AgenticPpoConfig",
  "AgenticPpoLearner",
  "MultiTurnRollout",
  "PpoExtConfig",
  "PpoExtLearner",
  "TrajectoryBatch",
  "compute_completion_logits",
  "compute_kl_divergence",
  "compute_per_token_logps",
  "compute_score",
  "install",
  "process_ids",
  "register_builtins",
]

__getattr__, __dir__ = _lazy_attributes(_LAZY, globals(), __name__)
