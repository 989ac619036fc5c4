"""Disk space of a run's checkpoints: stop at a step boundary before a checkpoint cannot fit.

A full disk at a checkpoint used to hang the run: orbax's and TensorBoard's writer threads
died on `ENOSPC` and the training thread waited for them for ever. `DiskGuard` checks the
free space of the checkpoint directory's filesystem before training and after every global
step, and stops the run with `OutOfSpaceError` (one line: directory, free and needed bytes,
the last checkpoint) while the checkpoints already written are intact, so the same command
resumes once there is room.

What one checkpoint step needs is counted from the live arrays: each trainer's trainable
parameters (the adapters under LoRA, as tunix saves) and its optimizer state, plus
`MARGIN_BYTES` for orbax's metadata and the metric files written until the next check.
"""

from __future__ import annotations

import errno
import logging
import pathlib
import re
import shutil
import sys
from collections.abc import Callable
from typing import Any

from flax import nnx

from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.models.lora import array_bytes

MARGIN_BYTES = 16 * 2**20
_MIB = 2**20
_WRITE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EFBIG: "file too large"}
_WRITE_ERRNOS[errno.EDQUOT] = "disk quota exceeded"
# how orbax and tensorstore report them (a ValueError whose text holds the OS's words)
_WRITE_TEXT = re.compile("(no space left on device|file too large|disk quota exceeded)", re.I)


class OutOfSpaceError(RuntimeError):
  """The checkpoint directory's filesystem has no room for the next checkpoint."""


def checkpoint_bytes(trainer: Any) -> int:
  """Bytes a tunix trainer's checkpoint holds: trainable parameters and optimizer state."""
  saved = nnx.LoRAParam if compat.lora_enabled(trainer) else nnx.Param
  return array_bytes(nnx.state(trainer.model, saved)) + array_bytes(trainer.optimizer.opt_state)


def finalized_steps(role_dir: str | pathlib.Path) -> set[int]:
  """Steps orbax finished writing under `role_dir` (its step directories are named `<int>`;
  unfinished saves live in `<step>.orbax-checkpoint-tmp-*` until orbax renames them)."""
  directory = pathlib.Path(role_dir)
  if not directory.is_dir():
    return set()
  return {int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit()}


def free_bytes(directory: str | pathlib.Path) -> int:
  """Free bytes (for this user) on the filesystem `directory` is (or will be) created on."""
  path = pathlib.Path(directory).resolve()
  while not path.exists():
    path = path.parent
  return shutil.disk_usage(path).free


class DiskGuard:
  """Stops a run whose checkpoint filesystem cannot take its next checkpoint step.

  Args:
    directory: the checkpoint root directory (tunix's `checkpoint_root_directory`).
    roles: the roles that save there (tunix saves each under `<directory>/<role>`).
    needed: the bytes one checkpoint step needs (see `checkpoint_bytes`).
  """

  def __init__(self, directory: str | pathlib.Path, roles: tuple[str, ...], needed: int):
    self.directory = pathlib.Path(directory)
    self.roles = roles
    self.needed = needed

  def check(self, step: int, stop: Callable[[], None] = lambda: None) -> None:
    """Raises `OutOfSpaceError` when fewer than `needed` bytes are free, after `stop()`.

    `stop` closes the run (tunix's trainers save their last step as they close, when it
    fits); the line then names the newest step every role finished writing.
    """
    free = free_bytes(self.directory)
    if free >= self.needed:
      return
    stop()
    saved = [finalized_steps(self.directory / role) for role in self.roles]
    last = max(set.intersection(*saved), default=0)
    kept = f"the checkpoint of step {last} is intact" if last else "no checkpoint was written"
    raise OutOfSpaceError(
      f"no space for a checkpoint at step {step}: {self.directory} has {free / _MIB:.1f} MiB "
      f"free, a checkpoint needs about {self.needed / _MIB:.1f} MiB; {kept}. Free space on "
      "that filesystem (or use another --output-dir) and run the same command to resume."
    )


def guard_for(rl_cluster: Any) -> DiskGuard | None:
  """The guard of a tunix `RLCluster`'s checkpoint directory; None when it saves none."""
  directory = rl_cluster.cluster_config.training_config.checkpoint_root_directory
  if directory is None:
    return None
  trainers = {"actor": rl_cluster.actor_trainer}
  if getattr(rl_cluster, "critic_trainer", None) is not None:
    trainers["critic"] = rl_cluster.critic_trainer
  needed = sum(checkpoint_bytes(t) for t in trainers.values()) + MARGIN_BYTES
  return DiskGuard(directory, tuple(trainers), needed)


def write_failure(err: BaseException) -> str | None:
  """One line for an error (or one it came from) that is a write refused by the filesystem
  (full disk, file-size limit, quota), naming the file; None for any other error.

  The guard sees a disk filling between steps; this names what it cannot see coming (a
  file-size limit, another process filling the disk mid-checkpoint)."""
  seen = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    reason, path = None, None
    if isinstance(err, OSError) and err.errno in _WRITE_ERRNOS:
      reason, path = _WRITE_ERRNOS[err.errno], err.filename
    elif found := _WRITE_TEXT.search(str(err)):
      reason = found.group(1).lower()
      quoted = re.search(r'"(/[^"]+)"', str(err))
      path = quoted.group(1) if quoted else None
    if reason is not None:
      return (
        f"cannot write {path or 'the output directory'}: {reason}. Free space (or raise the "
        "file-size limit) and run the same command to resume from the last checkpoint."
      )
    err = err.__cause__ or err.__context__
  return None


class QuietWriteFailures(logging.Filter):
  """Drops the records (and tracebacks) orbax's background threads log for a write the
  filesystem refused: the command's one error line (`write_failure`) names it instead."""

  def filter(self, record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return error is None or write_failure(error) is None


def quiet_write_failures() -> None:
  """Installs `QuietWriteFailures` on absl's logger (orbax logs through it), once; and
  drops the "Event loop is closed" errors Python would print as unraisable: tensorstore's
  callbacks of an orbax write that failed arrive after orbax closed that write's event
  loop (nothing is lost with them: the write already failed, and is reported)."""
  logger = logging.getLogger("absl")
  if not any(isinstance(f, QuietWriteFailures) for f in logger.filters):
    logger.addFilter(QuietWriteFailures())
  if not isinstance(sys.unraisablehook, _QuietUnraisable):
    sys.unraisablehook = _QuietUnraisable(sys.unraisablehook)


class _QuietUnraisable:
  """`sys.unraisablehook` that drops "Event loop is closed", and the ImportError of such a
  late callback that arrives while Python shuts down (it printed a stray last line after
  the run's one error line), and passes the rest on."""

  def __init__(self, previous: Any):
    self.previous = previous

  def __call__(self, unraisable: Any) -> None:
    error = unraisable.exc_value
    closed = isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
    shutting_down = isinstance(error, ImportError) and "shutting down" in str(error)
    if not (closed or shutting_down):
      self.previous(unraisable)
