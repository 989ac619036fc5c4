"""tunix's `RLCluster` (`tunix.rl.rl_cluster`) and its rollout engine (`tunix.rl.rollout`).

What tunix 0.1.7 offers no public way to do, each with its reason:

- `on_role`: the mesh, logical-axis rules and host offload `RLCluster` wraps around each
  role's pass (its public passes take no attention mask).
- `log_step_metrics_now`: tunix writes a step's metrics only after its checkpoint.
- `vanilla_sampler`: the vanilla engine's `Sampler`, whose model, weights and cache size the
  multi-turn rollout's `ContinuingSampler` shares.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import vanilla_rollout

PINNED: dict[str, tuple[Any, tuple[str, ...]]] = {
  # object the names live on -> (the object, private names used here)
  "tunix.rl.rl_cluster.RLCluster": (
    rl_cluster_lib.RLCluster,
    (
      "_get_mesh_and_logical_axis_rules_cm",
      "_maybe_load_model_from_cpu",
      "_maybe_offload_model_to_cpu",
      "_log_metrics",
    ),
  ),
}
# Instance attributes set in constructors (checked on live objects by the tests).
PINNED_INSTANCE_ATTRIBUTES = {
  "RLCluster": ("_buffered_train_metrics",),
  "VanillaRollout": ("_sampler",),
}


@contextlib.contextmanager
def on_role(cluster: Any, role: Any, model: Any) -> Iterator[None]:
  """`RLCluster`'s setting for a pass of `role`: its mesh and logical-axis rules, the model
  loaded from host memory first and offloaded after (with `offload_to_cpu`)."""
  with cluster._get_mesh_and_logical_axis_rules_cm(role):
    cluster._maybe_load_model_from_cpu(model, role)
    try:
      yield
    finally:
      cluster._maybe_offload_model_to_cpu(model, role)


def log_step_metrics_now(cluster: Any) -> None:
  """Logs the train metrics buffered for the current global step now.

  tunix logs a step's buffered metrics only when the next step buffers its first one,
  after the step's checkpoint; a run killed in between would lose them for good.
  """
  buffers = cluster._buffered_train_metrics
  if buffers and buffers[-1].global_steps == cluster.global_steps:
    snapshot = copy.copy(buffers[-1])
    snapshot.metrics = dict(buffers[-1].metrics)  # what was logged stays intact for listeners
    cluster._log_metrics(snapshot)
    buffers[-1].metrics.clear()  # the buffer stays: tunix's bookkeeping expects one


def vanilla_sampler(rollout: Any) -> Any | None:
  """The vanilla engine's `Sampler`, or None for any other engine."""
  if not isinstance(rollout, vanilla_rollout.VanillaRollout):
    return None
  return getattr(rollout, "_sampler", None)
