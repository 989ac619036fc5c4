"""tunix's trainer (`tunix.sft.peft_trainer.PeftTrainer`), which `RLCluster` builds per role.

What tunix 0.1.7 offers no public way to do, each with its reason:

- `add_checkpoint_metadata`: tunix takes the metadata function only in the trainer's
  constructor. `restored_metadata`: the custom metadata tunix restored. `lora_enabled`: as
  tunix's own save call passes it.
- `write_pending_metrics`: tunix 0.1.7 closes the shared metrics logger with the actor
  trainer, before the critic trainer writes its last step.
- `save_at_close`: tunix's trainers save their current step as they close, without the
  metadata a resume needs: the learner's training makes that save with it,
  `metadata_after_the_step`, and a run the disk guard stops closes without it,
  `close_without_a_last_save`.
- `silence_progress_bar`: tunix's trainer opens its own tqdm bar whenever it runs under
  IPython or a terminal, with no setting to turn it off; the actor's and critic's bars
  interleave with the run's own bar.

`add_checkpoint_metadata` and `silence_progress_bar` are applied by `patches.prepare`, and
`save_at_close` for its block (entries of `patches.PATCHES`).
- `loss_and_aux`: what tunix's trainer differentiates of a loss's output, on either tested
  tunix (main's own losses return a `LossOutput`, 0.1.7's and ours a `(loss, aux)` pair).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from tunix.sft import peft_trainer

PINNED: dict[str, tuple[Any, tuple[str, ...]]] = {
  # object the names live on -> (the object, private names used here)
  "tunix.sft.peft_trainer.PeftTrainer": (
    peft_trainer.PeftTrainer,
    ("_write_train_metrics", "_save_last_checkpoint"),
  ),
}
# Instance attributes set in constructors (checked on live objects by the tests).
PINNED_INSTANCE_ATTRIBUTES = {
  "PeftTrainer": ("_lora_enabled", "_pbar", "_restored_custom_metadata"),
}


def add_checkpoint_metadata(trainer: Any, extra: Callable[[], dict[str, Any]]) -> None:
  """Adds `extra()` to what the trainer saves as custom checkpoint metadata.

  tunix's `Trainer` takes its metadata function only in its constructor (which
  `RLCluster` calls), so the learner's state is chained onto the live trainer's.
  """
  base = trainer.custom_checkpoint_metadata_fn
  trainer.custom_checkpoint_metadata_fn = lambda: {**base(), **extra()}


def restored_metadata(trainer: Any) -> dict[str, Any]:
  """The custom checkpoint metadata tunix's trainer restored (empty on a fresh run).

  Read without a fallback: were tunix to rename the attribute, a resumed run must fail
  here (pinned by test_compat) rather than silently resume without its sampling state."""
  return trainer._restored_custom_metadata or {}


def lora_enabled(trainer: Any) -> bool:
  """Whether the trainer trains LoRA adapters (tunix saves only those then)."""
  return bool(trainer._lora_enabled)


def write_pending_metrics(trainer: Any) -> None:
  """Writes the trainer's buffered metrics (tunix writes them only at its next step)."""
  trainer._write_train_metrics()


@contextlib.contextmanager
def save_at_close(cluster: Any, save: Callable[[Any], None]) -> Iterator[None]:
  """Within the block, the save each trainer makes as it closes is `save(trainer)`.

  `PeftTrainer.close` saves the current step when it is newer than the last saved one
  (`_save_last_checkpoint`), without the custom metadata its scheduled saves carry (the
  global step, the learner's KL controller and sampler state): a run resumed from it would
  start its metrics at step 1 again with a fresh KL controller (found by the disk guard's
  test on CI). The trainers' own method is back after the block; nested blocks restore the
  outer block's `save`.
  """
  trainers = [cluster.actor_trainer, getattr(cluster, "critic_trainer", None)]
  trainers = [t for t in trainers if t is not None]
  outer = [t.__dict__.get("_save_last_checkpoint") for t in trainers]
  for trainer in trainers:  # an instance attribute over the method
    trainer._save_last_checkpoint = functools.partial(save, trainer)
  try:
    yield
  finally:
    for trainer, previous in zip(trainers, outer, strict=True):
      if previous is None:
        del trainer._save_last_checkpoint
      else:
        trainer._save_last_checkpoint = previous


def close_without_a_last_save(cluster: Any) -> None:
  """`cluster.close()` without the checkpoint tunix's trainers save as they close
  (`save_at_close`): a run stopped early (the disk guard) keeps a scheduled checkpoint as its
  newest, which resumes exactly. Metrics are flushed and the checkpoint in flight is
  finished as in `close`."""
  with save_at_close(cluster, lambda trainer: None):
    cluster.close()


def metadata_after_the_step(cluster: Any, trainer: Any) -> dict[str, Any]:
  """The trainer's custom checkpoint metadata for a save made once tunix has counted the
  global step (as it closes): tunix's metadata function adds 1 to `global_steps` for the
  saves made during a step, before the count."""
  return {**trainer.custom_checkpoint_metadata(), "global_step": cluster.global_steps}


class SilentProgressBar:
  """Stands in for tunix's `ProgressBar` on a trainer: takes its calls, shows nothing."""

  def update_metrics(self, metric_names: list[str], mode: Any, ndigits: int = 3) -> None:
    del metric_names, mode, ndigits

  def update(self, n: int = 1) -> None:
    del n

  def close(self) -> None:
    pass


def silence_progress_bar(trainer: Any) -> None:
  """Keeps tunix's trainer from opening its own tqdm bar (the run shows one bar of its own).

  tunix 0.1.7's `PeftTrainer.train` creates `tunix.sft.progress_bar.ProgressBar` when its
  `_pbar` is None (enabled under IPython or a terminal, no setting to disable it) and keeps
  it across `train` calls until `close()`; a bar already in place is used instead.
  """
  trainer._pbar = SilentProgressBar()


def loss_and_aux(out: Any) -> tuple[Any, Any]:
  """`(the value tunix's trainer differentiates, aux)` of a policy or value loss's output.

  tunix main's own losses return an `sft.utils.LossOutput`, which its `PeftTrainer`
  differentiates through `primary_loss.unreduced_sum` (keeping the whole output as aux);
  ours, and tunix 0.1.7's, return the `(loss, aux)` pair.
  """
  primary = getattr(out, "primary_loss", None)
  return (primary.unreduced_sum, out) if primary is not None else out
