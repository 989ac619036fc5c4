"""Numerical safety of a run: the learner's side of the NaN guard on optimizer updates
(the optax side, `guarded_adam`, is `tunix_ppo_ext._src.optim.guards`).

- `NanGuard`: after every global step reads the skip counters from the actor's and the
  critic's optimizer state, reports the skips as metrics and, after
  `PpoExtConfig.max_nonfinite_steps` consecutive skipped updates of one trainer, saves a
  checkpoint of the current state (the last good one: skipped updates change nothing),
  closes the run and raises `NonFiniteTrainingError`; at the run's last step it does the
  same when the updates skipped in a row at the end are at least half of the run's updates
  (a short run that trained nothing does not end as a success).
(Non-finite rewards are a reward policy: `tunix_ppo_ext._src.data.rewards.NonFiniteRewards`.)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from tunix_ppo_ext._src.optim.guards import (
  NonFiniteTrainingError,
  SkipCounts,
  new_skips,
  skip_counts,
  stuck,
  stuck_at_end,
)
from tunix_ppo_ext._src.tunix import compat

# Internal metric names (`metric_keys.TAXONOMY` publishes them as `actor/nonfinite_skips`,
# `critic/nonfinite_skips` and `{mode}/dropped_episodes`).
SKIP_METRICS = {
  "actor": "learner/actor_nonfinite_skips",
  "critic": "learner/critic_nonfinite_skips",
}


class NanGuard:
  """Counts skipped (non-finite) updates per trainer and stops a run that keeps skipping.

  Args:
    rl_cluster: tunix's `RLCluster` whose actor (and critic, if any) trainers use an
      optimizer with `apply_if_finite` inside (`guarded_adam`); without one, a trainer
      is not watched.
    max_consecutive: consecutive skipped updates of one trainer that stop the run.
  """

  def __init__(self, rl_cluster: Any, max_consecutive: int):
    self.rl_cluster = rl_cluster
    self.max_consecutive = max_consecutive
    self._seen = {role: counts.total for role, counts in self._counts().items()}
    # the updates a resumed run starts from: the run's own updates are counted from here
    self._start = {role: trainer.train_steps for role, trainer in self._trainers().items()}
    unguarded = sorted(set(self._trainers()) - set(self._seen))
    if unguarded:
      warnings.warn(
        f"the {' and '.join(unguarded)} optimizer has no optax.apply_if_finite: updates with "
        "a NaN or inf gradient are applied, not skipped (build it with "
        "tunix_ppo_ext.models.guarded_adam, as build_cluster does)",
        stacklevel=3,
      )

  def _trainers(self) -> dict[str, Any]:
    trainers = {"actor": self.rl_cluster.actor_trainer}
    critic = getattr(self.rl_cluster, "critic_trainer", None)
    if critic is not None:
      trainers["critic"] = critic
    return trainers

  def _counts(self) -> dict[str, SkipCounts]:
    counts = {}
    for role, trainer in self._trainers().items():
      found = skip_counts(trainer.optimizer.opt_state)
      if found is not None:
        counts[role] = found
    return counts

  def after_global_step(self) -> dict[str, tuple[int, Callable[..., Any]]]:
    """Metrics of the step's skipped updates; raises once a trainer skipped too many in a row.

    Before raising `NonFiniteTrainingError` it saves a checkpoint of every trainer at its
    current step (unless one exists) and closes the cluster (metrics flushed, saves done).
    """
    counts = self._counts()
    skipped = new_skips(counts, self._seen)
    metrics = {SKIP_METRICS[role]: (n, np.sum) for role, n in skipped.items()}
    self._seen |= {role: found.total for role, found in counts.items()}
    stopped = stuck(counts, self.max_consecutive)
    if stopped:
      self.rl_cluster.buffer_metrics(metrics)
      saved = self._save_and_close()
      raise NonFiniteTrainingError(self._message(stopped, saved))
    return metrics

  def at_last_step(self) -> None:
    """At the run's last step: raises (after saving each trainer's current state and closing
    the cluster) when a trainer's updates skipped in a row at the end are at least
    half of the updates this run made, so a run shorter than `max_consecutive` that skipped
    all or nearly all of them does not end as a success."""
    trainers = self._trainers()
    made = {role: t.train_steps - self._start.get(role, 0) for role, t in trainers.items()}
    stopped = stuck_at_end(self._counts(), made)
    if stopped:
      saved = self._save_and_close()
      raise NonFiniteTrainingError(self._message(stopped, saved, ended=True))

  def _save_and_close(self) -> dict[str, int | None]:
    """Saves each trainer's current (= last good) state, then closes the cluster."""
    saved = self._save_current_states()
    critic = self._trainers().get("critic")
    if critic is not None:
      # tunix closes the shared metrics logger with the actor, before the critic writes.
      compat.write_pending_metrics(critic)
    self.rl_cluster.close()
    return saved

  def _save_current_states(self) -> dict[str, int | None]:
    """Saves each trainer's current state unless its newest checkpoint is of this step, with
    the custom metadata of tunix's scheduled saves (the global step, the learner's state),
    which the save tunix's trainers make as they close lacks; returns the newest step by
    role. Called within a global step (before tunix counts it), as the scheduled saves."""
    saved = {}
    for role, trainer in self._trainers().items():
      save_state(trainer, trainer.custom_checkpoint_metadata())
      saved[role] = trainer.checkpoint_manager.latest_step()
    return saved

  def _message(
    self, stuck: dict[str, SkipCounts], saved: dict[str, int | None], ended: bool = False
  ) -> str:
    parts = []
    for role, counts in stuck.items():
      trainer = self._trainers()[role]
      last, made = trainer.train_steps, trainer.train_steps - self._start.get(role, 0)
      of = f" of the run's {made}" if ended else ""
      parts.append(
        f"the {role} trainer skipped its last {counts.consecutive}{of} optimizer updates "
        f"({last - counts.consecutive + 1} to {last}; {counts.total} skipped in total)"
      )
    where = ", ".join(f"{r} at step {s}" for r, s in saved.items() if s is not None)
    checkpoint = (
      f"checkpoints of the last good state: {where}" if where else "no checkpoint directory"
    )
    verb = "ended untrained" if ended else "stopped"
    return (
      f"training {verb} at step {self.rl_cluster.global_steps + 1}: "
      + "; ".join(parts)
      + " because the loss or gradient was NaN or inf (PpoExtConfig.max_nonfinite_steps="
      f"{self.max_consecutive}); {checkpoint}. Lower the learning rate, check the rewards, "
      "or resume from the checkpoint."
    )


def save_state(trainer: Any, metadata: dict[str, Any]) -> None:
  """Saves the trainer's model and optimizer at its current step with custom `metadata`,
  unless its newest checkpoint is of this step already (as tunix's own saves do)."""
  manager, step = trainer.checkpoint_manager, trainer.train_steps
  if manager.latest_step() != step:
    manager.save(
      step,
      trainer.model,
      trainer.optimizer,
      save_only_lora_params=compat.lora_enabled(trainer),  # as tunix saves
      force=True,
      custom_metadata=metadata,
    )
