"""`tunix-ppo-ext export RUN_DIR OUT_DIR`: a run's trained policy as a Hugging Face checkpoint.

The policy is rebuilt from the run's saved `config.json` (as `train` builds it), its
parameters restored from the latest finalized actor checkpoint (`checkpoints/actor/<step>`),
and written to `OUT_DIR` as `config.json` + `model.safetensors`, loadable by
`transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`. The tokenizer files are
copied when the run used a Hugging Face tokenizer (`model.tokenizer` or the checkpoint's own);
the built-in character tokenizer has none. A run from a checkpoint keeps its family and
`config.json`; a built-in toy or named-size model is written as a Qwen3. A LoRA run's
checkpoint holds only the adapters: they are restored onto the base weights and merged into
them (`W + alpha/rank * A B`, `tunix.lora.merged`).

Nothing is left half-written: the files go to a sibling `OUT_DIR.partial-<pid>` renamed onto
`OUT_DIR` once complete, removed on any failure or Ctrl-C (a full disk or an unwritable
`OUT_DIR` is one line naming it). A run a live `train` holds (its `.lock`) is refused: its
checkpoints may be deleted while they are read. A newest checkpoint that cannot be restored
(a deleted or truncated file) is skipped for the next older one, as `train` does, with a
warning naming it (nothing is moved: export only reads the run).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.run import job, resume
from tunix_ppo_ext._src.run import run_dir as run_dir_lib
from tunix_ppo_ext._src.run.run_config import (
  RunConfig,
  load_resolved,
  lora_spec,
  tokenizer_directory,
)
from tunix_ppo_ext._src.tunix.cluster.disk_space import write_failure
from tunix_ppo_ext._src.tunix.models import hf_export, hf_models, lora

RUN_CONFIG = "config.json"


def check_out_dir(out_dir: pathlib.Path) -> None:
  """OUT_DIR must not exist, or be an empty directory; ValueError naming it otherwise."""
  if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
    raise ConfigError(
      f"OUT_DIR {str(out_dir)!r} exists and is not empty: export into a new or empty directory"
    )


def actor_steps(run_dir: pathlib.Path) -> list[int]:
  """The steps orbax finished writing under `RUN_DIR/checkpoints/actor`, newest first;
  ValueError naming the run when it has none (or is no run directory at all)."""
  if not (run_dir / RUN_CONFIG).is_file():
    raise ConfigError(
      f"RUN_DIR {str(run_dir)!r} has no {RUN_CONFIG}: give a train command's output directory"
    )
  steps = resume.finalized_steps(run_dir / "checkpoints" / "actor")
  if not steps:
    raise ConfigError(
      f"RUN_DIR {str(run_dir)!r} has no finalized actor checkpoint in checkpoints/actor: "
      "train until a checkpoint is saved (train.checkpoint_every) first"
    )
  return sorted(steps, reverse=True)


def latest_actor_step(run_dir: pathlib.Path) -> int:
  """The newest finalized actor step (see `actor_steps`)."""
  return actor_steps(run_dir)[0]


def check_not_training(run_dir: pathlib.Path) -> None:
  """ValueError when another process holds `RUN_DIR`'s run lock (a `train` still writing
  there)."""
  holder = run_dir_lib.RunLock(run_dir).holder()
  if holder is not None:
    raise ConfigError(
      f"RUN_DIR {str(run_dir)!r} is in use by a running train (pid {holder or '?'}): its "
      "checkpoints may be deleted while export reads them; export once it has stopped"
    )


def trained_policy(run_dir: pathlib.Path) -> tuple[RunConfig, object, int]:
  """`(run, policy, step)`: the run's config, its policy with the newest actor checkpoint's
  parameters that can be restored (a damaged newer one is skipped with a warning), and
  that step. The policy is built as `train` builds it (with its critic and reference, then
  dropped); a LoRA policy comes back with its adapters merged."""
  steps = actor_steps(run_dir)
  resolved = load_resolved(str(run_dir / RUN_CONFIG), [f"output_dir={run_dir}"])  # once
  run = resolved.run
  for index, step in enumerate(steps):
    policy = job.build_models(resolved)[0]
    try:
      hf_export.restore_params(policy, run_dir / "checkpoints" / "actor", step)
    except Exception as err:
      if not job.raised_in_orbax(err):
        raise
      if index + 1 == len(steps):
        raise ConfigError(
          f"RUN_DIR {str(run_dir)!r}: no actor checkpoint can be restored (steps "
          f"{sorted(steps)}; the oldest: {type(err).__name__}); train again from scratch"
        ) from err
      print(
        f"tunix-ppo-ext: warning: actor checkpoint step {step} cannot be restored "
        f"({type(err).__name__}); exporting step {steps[index + 1]} instead",
        file=sys.stderr,
      )
      continue
    if run.model.lora is not None:
      policy = lora.merged(policy, lora_spec(run.model.lora))
    return run, policy, step
  raise AssertionError("unreachable: the last step returns or raises")


@contextlib.contextmanager
def _staged(out_dir: pathlib.Path) -> Iterator[pathlib.Path]:
  """A sibling directory to write into, renamed onto `out_dir` when the block succeeds and
  removed when it fails (or is interrupted: Ctrl-C, or SIGTERM, which raises
  KeyboardInterrupt here instead of ending the process mid-write); an OSError becomes one
  ValueError naming it."""
  staging = out_dir.with_name(f"{out_dir.name}.partial-{os.getpid()}")
  with _terminate_interrupts():
    yield from _staged_steps(out_dir, staging)


@contextlib.contextmanager
def _terminate_interrupts() -> Iterator[None]:
  """SIGTERM raises KeyboardInterrupt inside the block (main thread only; elsewhere signal
  handlers cannot be set and SIGTERM keeps its action)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = signal.signal(signal.SIGTERM, _interrupt)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
  raise KeyboardInterrupt(f"signal {signum}")


def _staged_steps(out_dir: pathlib.Path, staging: pathlib.Path) -> Iterator[pathlib.Path]:
  try:
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    yield staging
    if out_dir.is_dir():
      out_dir.rmdir()  # empty (check_out_dir): the rename needs it gone
    staging.rename(out_dir)
  except Exception as err:
    # an OSError, or a writer's own error for one (safetensors' SafetensorError: "I/O error:
    # No space left on device")
    if not isinstance(err, OSError) and write_failure(err) is None:
      raise
    reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err) or err
    raise ConfigError(
      f"OUT_DIR {str(out_dir)!r} cannot be written ({reason}): free space or "
      "choose a writable directory; nothing was left there"
    ) from err
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def export_run(run_dir: str | pathlib.Path, out_dir: str | pathlib.Path) -> pathlib.Path:
  """Writes the run's trained policy (and tokenizer, if any) into `out_dir`; returns it.

  Args:
    run_dir: the run's output directory (its config and checkpoints).
    out_dir: where the Hugging Face checkpoint is written.

  Returns:
    `out_dir`, resolved.
  """
  run_dir, out_dir = pathlib.Path(run_dir).resolve(), pathlib.Path(out_dir).resolve()
  check_out_dir(out_dir)
  check_not_training(run_dir)
  run, policy, _ = trained_policy(run_dir)
  source = None
  if run.model.checkpoint is not None:
    source = hf_models.read_hf_config(run.model.checkpoint)
  with _staged(out_dir) as staging:
    hf_export.save_hf_checkpoint(policy, staging, source)
    tokenizer = tokenizer_directory(run.model)
    if tokenizer is not None:
      import transformers

      transformers.AutoTokenizer.from_pretrained(tokenizer).save_pretrained(staging)
  return out_dir
