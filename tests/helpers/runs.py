"""Runs of `tunix-ppo-ext train` on the smoke config, in process or as a subprocess, the environment
those subprocesses get, a run-lock holder and the checkpoints of a run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pathlib
import signal
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  pass


def train_in_process(config: str | pathlib.Path, out: pathlib.Path, *overrides: str) -> Any:
  """Trains `config` with `overrides` into the new directory `out` as `train` does (its
  `config.json` written first, so `export` and reruns find it) and returns the learner, its
  cluster closed."""
  from tunix_ppo_ext._src.run import job, run_dir
  from tunix_ppo_ext._src.run.run_config import load_resolved

  resolved = load_resolved(str(config), [f"output_dir={out}", *overrides])
  out.mkdir()
  run_dir.check_rerun(out, resolved.config, None, resolved.optimizers)
  learner, batches, eval_batches, _ = job.build_run(resolved, out)
  learner.train(batches, eval_ds=eval_batches)
  learner.rl_cluster.close()
  return learner


def train_argv(
  config: str | os.PathLike, output_dir: str | os.PathLike, *overrides: str
) -> list[str]:
  """The command line's `train --config CONFIG --output-dir OUTPUT_DIR OVERRIDES...`."""
  return ["train", "--config", str(config), "--output-dir", str(output_dir), *overrides]


def save_weights_only(model: Any, directory: str | pathlib.Path) -> pathlib.Path:
  """`model`'s Hugging Face `model.safetensors` (`tunix_ppo_ext.models.save_hf_checkpoint`,
  the export) without its `config.json`: a checkpoint of weights only, whose sizes the run
  config gives. Returns the safetensors file."""
  from tunix_ppo_ext.models import save_hf_checkpoint

  directory = save_hf_checkpoint(model, directory, None)
  (directory / "config.json").unlink()
  return directory / "model.safetensors"


SMOKE = pathlib.Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml"


def smoke_args(out: pathlib.Path, *overrides: str) -> list[str]:
  """`tunix-ppo-ext train`'s arguments for the smoke config into `out` (for `cli.main`)."""
  return ["train", "--config", str(SMOKE), "--output-dir", str(out), *overrides]


def train_command(out: pathlib.Path, *overrides: str) -> list[str]:
  """`tunix-ppo-ext train` on the smoke config into `out`, as a subprocess command."""
  return [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", *smoke_args(out, *overrides)]


def subprocess_env(tmp_path: pathlib.Path) -> dict[str, str]:
  """One CPU device, and the suite's persistent compilation cache (`JAX_CACHE`, in
  `os.environ`) so a run skips the compiling other tests did."""
  del tmp_path  # the cache is the suite's, not the test's
  return {**os.environ, "JAX_PLATFORMS": "cpu"}


def _hold_run_lock(out: pathlib.Path, held: Any) -> None:
  from tunix_ppo_ext._src.run import run_dir

  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leaves the `with`: releases it
  with run_dir.RunLock(out):
    held.set()
    while True:
      time.sleep(60)


@contextlib.contextmanager
def run_lock_holder(out: pathlib.Path) -> Iterator[Any]:
  """Another process (forked: it imports nothing) holding `out`'s run lock until the block
  ends (SIGTERM: it releases the lock as a run does), unless the block kills it first;
  yields the `multiprocessing.Process`."""
  context = multiprocessing.get_context("fork")
  held = context.Event()
  process = context.Process(target=_hold_run_lock, args=(out, held), daemon=True)
  with warnings.catch_warnings():  # the child runs no JAX: JAX's threads are no danger
    warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
    process.start()
  try:
    assert held.wait(60), f"the holder never took {out}'s lock (exit {process.exitcode})"
    yield process
  finally:
    process.terminate()
    process.join(30)
    if process.is_alive():
      process.kill()
      process.join()


def common_checkpoints(out: pathlib.Path, roles: Sequence[str] = ("actor", "critic")) -> set[int]:
  """Steps every trainer of `roles` checkpointed under `out/checkpoints` (a run with a
  group estimator has no critic: `roles=("actor",)`)."""
  from tunix_ppo_ext._src.run import resume

  ckpt = out / "checkpoints"
  return set.intersection(*(resume.finalized_steps(ckpt / role) for role in roles))
