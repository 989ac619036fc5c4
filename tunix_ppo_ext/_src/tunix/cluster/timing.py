"""Wall-clock timing of a step's phases (`timing_s/<phase>` metrics).

`PhaseTimer` times the phases of the rollout step; `UpdateTimer` is a tunix training
hook that times one trainer's update phase.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.sft import hooks

Mode = rl_cluster_lib.Mode


class PhaseTimer:
  """Wall seconds per named phase of the rollout step (`timing_s/<name>` metrics)."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str):
    start = time.perf_counter()
    yield
    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

  @staticmethod
  def ready(tree: Any) -> Any:
    """Waits for JAX's asynchronous dispatch so the phase is timed, not just launched."""
    return jax.block_until_ready(tree)

  def metrics(self) -> dict[str, tuple[float, Callable[..., Any]]]:
    return {f"timing_s/{name}": (value, np.mean) for name, value in self.seconds.items()}


class UpdateTimer(hooks.TrainingHooks):
  """tunix training hooks that time one trainer's update phase (`train()` call) per step."""

  def __init__(self, cluster: rl_cluster_lib.RLCluster, name: str):
    self._cluster, self._name, self._start = cluster, name, 0.0

  def on_train_start(self, train_ctx: Any) -> None:
    self._start = time.perf_counter()

  def on_train_end(self, train_ctx: Any) -> None:  # tunix waits for the device first
    seconds = time.perf_counter() - self._start
    self._cluster.buffer_metrics({self._name: (seconds, np.sum)}, mode=Mode.TRAIN)

  def on_train_step_start(self, train_ctx: Any) -> None:
    pass

  def on_train_step_end(self, train_ctx: Any, train_step: int, train_loss: Any) -> None:
    pass

  def on_eval_step_start(self, train_ctx: Any) -> None:
    pass

  def on_eval_step_end(self, train_ctx: Any, eval_loss: Any) -> None:
    pass
