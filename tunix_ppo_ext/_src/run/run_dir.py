"""A run's output directory: one run at a time, and reruns that match the saved config.

- `RunLock`: the run using the directory holds an OS lock on `OUTPUT_DIR/.lock` (the
  file also names its pid); a second run is refused while that process lives (the kernel
  releases the lock of a killed run).
- `check_rerun`: before anything is overwritten, a rerun into a directory with
  checkpoints is compared with its saved `config.json`. Settings the checkpoints depend on
  (`FIXED`: the model, its tokenizer, the task's environments, `env`, `envs` and the
  evaluation's `validation.env`, `validation.kwargs` and `validation.envs`, the estimator,
  the batch and the seed; not `COMPUTE_ONLY`, the model's fused head and remat) must not
  change (a key the saved config lacks may stay unset), nor may an optimizer setting that
  changes the structure of the optimizer state the checkpoints hold (`optim.<role>.name`,
  clipping on or off, gradient accumulation: orbax could not restore it): the differences
  are listed in one error. Others (steps, learning rates, logging, `COMPUTE_ONLY`, ...)
  may: they are applied and appended to `config_history.jsonl`. A checkpoint beyond
  `train.steps` is an error too.
- `finished_summary`: a run whose last step is checkpointed and summarized has nothing
  left to train; its rerun changes nothing.
- `earlier_parts` / `write_parts`: `parts.json` records each `train` command that trained
  into the directory (the step it started from, its wall time), so a resumed run's summary
  counts the whole run's time.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.config.run_sections import LoraSection
from tunix_ppo_ext._src.metrics.sinks import write_atomically
from tunix_ppo_ext._src.optim.optimizers import OptimizerSpec, build_optimizer

# what the checkpoints were trained for: the model, the task (the environment, a mixed
# run's environments, the evaluation's own ones) and what shapes the batch and its estimate
FIXED = (
  "model",
  "env",
  "envs",
  "validation.env",
  "validation.kwargs",
  "validation.envs",
  "seed",
  "train.batch_size",
  "ppo.advantage_estimator",
  "ppo.num_generations",
)
# how the model computes, not what it is: a resumed run may change them (and a run saved
# before they existed resumes with their defaults)
COMPUTE_ONLY = (
  "model.fused_head",
  "model.remat",
  "model.attention",
  "model.attention_block_size",
  "model.packing",
)
# tunix wraps the optimizer in optax.MultiSteps when it accumulates gradients
ACCUMULATION = ("batch.train_micro_batch_size", "batch.gradient_accumulation_steps")
OPTIMIZER_ROLES = ("actor", "critic")  # the roles of `ResolvedRun.optimizers`, in order
LOCK = ".lock"
HISTORY = "config_history.jsonl"
CONFIG = "config.json"
SUMMARY = "summary.json"
PARTS = "parts.json"  # one entry per `train` command that trained into the directory


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in config.items():
    if isinstance(value, dict) and key not in ("kwargs",):
      out |= _flat(value, f"{prefix}{key}.")
    else:
      out[f"{prefix}{key}"] = value
  return out


def _with_lora_defaults(config: dict[str, Any]) -> dict[str, Any]:
  """`config` with the keys its `model.lora` lacks at `LoraSection`'s defaults: a saved
  `config.json` holds the keys the config gave (before 2026-12-07) or those that differ
  from the defaults (since), so a key at its default compares equal written or not."""
  model = config.get("model")
  lora = model.get("lora") if isinstance(model, dict) else None
  if not isinstance(lora, dict):
    return config
  return {**config, "model": {**model, "lora": {**dataclasses.asdict(LoraSection()), **lora}}}


def _fixed(key: str) -> bool:
  return key not in COMPUTE_ONLY and any(key == f or key.startswith(f + ".") for f in FIXED)


def _refused(key: str, saved: dict[str, Any], requested: Any) -> bool:
  """Whether a change of `key` to `requested` is refused: a `FIXED` key, unless the saved
  config lacks it (a run from before the key existed) and the rerun leaves it unset (None,
  or an empty list or mapping: what the run had)."""
  return _fixed(key) and (key in saved or requested not in (None, [], {}))


def _state_structure(optimizer: optax.GradientTransformation) -> str:
  """The tree structure of `optimizer`'s state (a stand-in parameter does for any model)."""
  params = {"w": jax.ShapeDtypeStruct((1,), jnp.float32)}
  return str(jax.tree.structure(jax.eval_shape(optimizer.init, params)))


def _restructuring(
  changed: dict[str, Any], saved: dict, optimizers: Sequence[optax.GradientTransformation]
) -> set[str]:
  """The changed keys that would give the checkpoints' optimizer state another structure:
  the saved `optim.<role>` spec's optimizer against the run's own (learning rate and steps
  do not change the structure)."""
  keys = {k for k in changed if k in ACCUMULATION}
  for role, optimizer in zip(OPTIMIZER_ROLES, optimizers, strict=True):
    spec = (saved.get("optim") or {}).get(role)
    mine = [k for k in changed if k.startswith(f"optim.{role}.")]
    if mine and spec is not None:
      saved_optimizer = build_optimizer(OptimizerSpec(**spec), 1e-3, 1)
      if _state_structure(saved_optimizer) != _state_structure(optimizer):
        keys.update(mine)
  return keys


def check_rerun(
  out: pathlib.Path,
  config: dict[str, Any],
  checkpoint_step: int | None,
  optimizers: Sequence[optax.GradientTransformation],
) -> None:
  """Refuses a rerun that changes a `FIXED` setting or asks for fewer steps than are done
  (`rerun_changes`); records the other changes in `config_history.jsonl`. Writes
  `config.json` last.

  Args:
    out: the run's output directory.
    config: the requested run's config (`ResolvedRun.config`).
    checkpoint_step: the step of the directory's checkpoints (None: a new run).
    optimizers: the requested run's `(actor, critic)` optimizers (`ResolvedRun.optimizers`).

  Raises:
    ValueError: one line listing every refused difference (`key: saved -> requested`).
  """
  changed = rerun_changes(out, config, checkpoint_step, optimizers)
  if changed:
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "from_step": checkpoint_step}
    record["changed"] = {k: {"from": a, "to": b} for k, (a, b) in changed.items()}
    with (out / HISTORY).open("a") as history:
      history.write(json.dumps(record) + "\n")
  write_atomically(out / CONFIG, json.dumps(config, indent=2))


def rerun_changes(
  out: pathlib.Path,
  config: dict[str, Any],
  checkpoint_step: int | None,
  optimizers: Sequence[optax.GradientTransformation],
) -> dict[str, tuple[Any, Any]]:
  """The settings `config` changes from the saved `config.json` of a run with checkpoints,
  `{key: (saved, requested)}` ({} for a new run); writes nothing. `optimizers`: the
  requested run's `(actor, critic)`, whose state structures the saved specs' must match.

  Raises:
    ValueError: one line listing every refused difference (`key: saved -> requested`).
  """
  saved_file = out / CONFIG
  if checkpoint_step is None:
    return {}
  saved_config, reason = None, "not a JSON object"
  try:
    saved_config = json.loads(saved_file.read_text())
  except FileNotFoundError:
    reason = "it is missing"
  except (OSError, ValueError) as err:
    reason = f"{type(err).__name__}: {err}"
  if not isinstance(saved_config, dict):
    raise ConfigError(
      f"output dir {str(out)!r} holds checkpoints, but its {CONFIG} cannot be read ({reason}), "
      f"so the rerun's settings cannot be checked against them; restore {CONFIG} or use "
      "another --output-dir"
    )
  saved, requested = _flat(_with_lora_defaults(saved_config)), _flat(_with_lora_defaults(config))
  changed = {
    k: (saved.get(k), requested.get(k))
    for k in sorted(saved.keys() | requested.keys())
    if saved.get(k) != requested.get(k)
  }
  optimizer = _restructuring(changed, saved_config, optimizers)
  refused = {k: v for k, v in changed.items() if _refused(k, saved, v[1]) or k in optimizer}
  if refused:
    listed = "; ".join(
      f"{k}: {a!r} -> {b!r}" + (" changes the optimizer state's structure" * (k in optimizer))
      for k, (a, b) in refused.items()
    )
    raise ConfigError(
      f"output dir {str(out)!r} holds checkpoints of another run ({listed}); use another "
      "--output-dir, or the saved settings to resume"
    )
  steps = config["train"]["steps"]
  if checkpoint_step > steps:
    raise ConfigError(
      f"config key 'train.steps'={steps} is below the checkpoint in {str(out)!r} (step "
      f"{checkpoint_step}); raise it to continue that run, or use another --output-dir"
    )
  return changed


def finished_summary(
  out: pathlib.Path, checkpoint_step: int | None, steps: int
) -> dict[str, Any] | None:
  """The `summary.json` of a run with nothing left to train, else None: its newest
  checkpoint is the last step, `steps`, and the summary was written after it (its
  `updates` are that step; a summary from before `updates` was recorded must be newer than
  the actor's checkpoint). A run killed after its last checkpoint, before its summary, is
  not finished: its rerun writes the summary."""
  if checkpoint_step is None or checkpoint_step != steps:
    return None
  try:
    summary = json.loads((out / SUMMARY).read_text())
  except (OSError, ValueError):
    return None
  if not isinstance(summary, dict):
    return None
  if "updates" in summary:
    return summary if summary["updates"] == steps else None
  newest = out / "checkpoints" / "actor" / str(steps)
  written = (out / SUMMARY).stat().st_mtime
  return summary if newest.is_dir() and written >= newest.stat().st_mtime else None


def earlier_parts(out: pathlib.Path, resuming: bool) -> list[dict[str, Any]]:
  """The parts of the run in `out` that earlier `train` commands trained (`parts.json`),
  each `{"from_step", "started", "wall_s"}`; [] unless `resuming` (a run that starts from
  scratch starts a new record).

  A part killed before it recorded its wall time (SIGKILL) counts until `metrics.jsonl`
  was last written: call this before that file is truncated. A run from before
  `parts.json` counts as one part, its summary's `wall_s`.
  """
  if not resuming:
    return []
  try:
    parts = json.loads((out / PARTS).read_text())
  except (OSError, ValueError):
    parts = None
  if not isinstance(parts, list) or not all(isinstance(part, dict) for part in parts):
    parts = _summary_part(out)  # missing or not this package's: as a run from before it
  last_write = (out / "metrics.jsonl").stat().st_mtime if (out / "metrics.jsonl").is_file() else 0
  for part in parts:
    if part.get("wall_s") is None:  # killed: until its last metric
      part["wall_s"] = round(max(0.0, last_write - part.get("started", last_write)), 1)
  return parts


def _summary_part(out: pathlib.Path) -> list[dict[str, Any]]:
  try:
    return [{"from_step": 0, "wall_s": float(json.loads((out / SUMMARY).read_text())["wall_s"])}]
  except (OSError, ValueError, KeyError, TypeError):
    return []


def write_parts(out: pathlib.Path, parts: list[dict[str, Any]]) -> None:
  """Writes `parts.json` (`earlier_parts`' record, the running part last)."""
  write_atomically(out / PARTS, json.dumps(parts, indent=2))


# what makes a directory unusable as an output directory (not a full disk: that is a
# write failure, `disk_space.write_failure`); ENOENT: a place where no directory can be
# made although its parent exists (`/proc/x`), or one removed under the run
_UNUSABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST, errno.ENOENT)


def unusable_output_dir(out: pathlib.Path, err: OSError) -> ConfigError | None:
  """The one-line ConfigError for an output directory this process cannot create or write
  (read-only, no permission, a file in its path, a file system that makes no directories);
  None for any other OSError."""
  if err.errno not in _UNUSABLE:
    return None
  return ConfigError(
    f"config key 'output_dir' (--output-dir) {str(out)!r} cannot be written "
    f"({os.strerror(err.errno).lower()}: {err.filename}); choose a writable directory"
  )


# the sections every run's `config.json` has had (beside `seed`): a mapping each
RUN_SECTIONS = ("model", "env", "train")


def check_output_dir(out: pathlib.Path) -> None:
  """Refuses an output directory that holds something other than a run of this package,
  before anything is written (a Hugging Face checkpoint's own `config.json` would be
  replaced, its `metrics.jsonl` emptied). Accepted: a missing or empty directory (a lock
  file, a write's temporary, `.NAME.tmp`, and `*.log` files aside: a run writes none, and a
  shell's `2> OUT/train.log` creates one before the command starts), one with this
  package's checkpoints
  (`checkpoints/actor`: `check_rerun` compares the rerun with them), or one whose
  `config.json` is a run's (`RUN_SECTIONS` as mappings, and `seed`). Reads only; a path
  that cannot be listed is left to `make_output_dir` and the lock.

  Raises:
    ConfigError: one line naming the directory and some of what it holds.
  """
  try:
    names = sorted(entry.name for entry in out.iterdir())
  except OSError:  # missing, a file, unreadable: not this check's to say
    return
  own = [n for n in names if n != LOCK and not _leftover(n)]
  if not own or (out / "checkpoints" / "actor").is_dir() or _is_run_config(out / CONFIG):
    return
  listed = ", ".join(own[:4]) + (", ..." if len(own) > 4 else "")
  raise ConfigError(
    f"output dir {str(out)!r} is not empty and holds no tunix-ppo-ext run (no run's "
    f"{CONFIG}, no checkpoints; it holds {listed}): nothing was written; train into a new "
    "or empty directory"
  )


def _leftover(name: str) -> bool:
  """A name a run may find in a directory it may still use (`check_output_dir`)."""
  return (name.startswith(".") and name.endswith(".tmp")) or name.endswith(".log")


def _is_run_config(path: pathlib.Path) -> bool:
  """Whether `path` is a run's saved config (`check_output_dir`)."""
  try:
    config = json.loads(path.read_text())
  except (OSError, ValueError):
    return False
  return (
    isinstance(config, dict)
    and "seed" in config
    and all(isinstance(config.get(section), dict) for section in RUN_SECTIONS)
  )


def make_output_dir(out: pathlib.Path) -> None:
  """Creates `out` (and its parents); ConfigError when it cannot (`unusable_output_dir`)."""
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as err:
    raise unusable_output_dir(out, err) or err from None


class RunLock:
  """`with RunLock(out):` holds `out/.lock` for this process; ConfigError if another does.

  The lock is the kernel's (`fcntl.flock`, exclusive, on the open file): held while this
  process keeps the file open, released when it exits however it exits (a SIGKILL too), so
  a killed run's file is no lock at all and no staleness is ever guessed from a pid. The
  file holds the holder's pid for the messages only. Two processes never both hold it: the
  lock counts only on the file the path still names once it is taken (a holder unlinks the
  file on release, and a process that opened it before would lock an unlinked file).
  Checks (`check_free`, `holder`) take a shared lock for an instant, which tells a run
  (exclusive) from another check; a run that meets only checks tries again.
  """

  def __init__(self, out: pathlib.Path):
    self.path = out / LOCK
    self._descriptor: int | None = None

  def __enter__(self) -> RunLock:
    while self._descriptor is None:
      try:
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      except OSError as err:  # a read-only directory: before anything else is written
        raise unusable_output_dir(self.path.parent, err) or err from None
      if not _lock(descriptor, fcntl.LOCK_EX):
        os.close(descriptor)
        holder = self._held_by()
        if holder is not None:  # a run (this process's own other one too)
          raise self._in_use(holder)
        time.sleep(0.001)  # only checks, for an instant
      elif not _same_file(descriptor, self.path):  # released and unlinked meanwhile
        os.close(descriptor)
      else:
        os.ftruncate(descriptor, 0)
        os.write(descriptor, str(os.getpid()).encode())
        self._descriptor = descriptor
    return self

  def __exit__(self, *exc: Any) -> None:
    if self._descriptor is not None:
      self.path.unlink(missing_ok=True)  # while holding it: see the class docstring
      os.close(self._descriptor)
      self._descriptor = None

  def check_free(self) -> None:
    """ConfigError when another process holds the lock; takes nothing, writes nothing."""
    holder = self.holder()
    if holder is not None:
      raise self._in_use(holder)

  def holder(self) -> int | None:
    """The pid of the other process holding the lock (0: not written yet), None when no
    other process holds it (this one may)."""
    holder = self._held_by()
    return None if holder == os.getpid() else holder

  def _held_by(self) -> int | None:
    """The pid of the process holding the lock (0: not written yet), None when none does."""
    try:
      descriptor = os.open(self.path, os.O_RDONLY)
    except FileNotFoundError:
      return None
    try:
      if _lock(descriptor, fcntl.LOCK_SH):  # no run holds it (released with the descriptor)
        return None
    finally:
      os.close(descriptor)
    for _ in range(20):  # a holder writes its pid right after it takes the lock
      pid = _pid_in(self.path)
      if pid:
        return pid
      time.sleep(0.01)
    return 0

  def _in_use(self, holder: int) -> ConfigError:
    return ConfigError(
      f"output dir {str(self.path.parent)!r} is in use by another run (pid {holder or '?'}); "
      "wait for it or choose another --output-dir"
    )


def _lock(descriptor: int, operation: int) -> bool:
  """Takes `operation` (`fcntl.LOCK_EX` or `LOCK_SH`) on `descriptor` without waiting;
  False when another process's lock is in the way."""
  try:
    fcntl.flock(descriptor, operation | fcntl.LOCK_NB)
  except BlockingIOError:
    return False
  return True


def _same_file(descriptor: int, path: pathlib.Path) -> bool:
  """Whether `path` still names the file open at `descriptor`."""
  try:
    named = path.stat()
  except FileNotFoundError:
    return False
  mine = os.fstat(descriptor)
  return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


def _pid_in(path: pathlib.Path) -> int:
  """The pid a holder wrote into the lock file (0: not yet, or unreadable)."""
  try:
    return int(path.read_text().strip() or "0")
  except (OSError, ValueError):
    return 0
