"""A run's output directory: one run at a time, and reruns that match the saved config.

- `RunLock`: `OUTPUT_DIR/.lock` holds the pid of the run using the directory; a second
  run is refused while that process lives (a stale lock of a killed run is taken over).
- `check_rerun`: before anything is overwritten, a rerun into a directory with
  checkpoints is compared with its saved `config.json`. Settings the checkpoints depend on
  (`FIXED`: the model, its tokenizer, the environment, the estimator, the batch and the
  seed) must not change: the differences are listed in one error. Others (steps,
  learning rates, logging, ...) may: they are applied and appended to
  `config_history.jsonl`. A checkpoint beyond `train.steps` is an error too.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.metrics.sinks import write_atomically

FIXED = (
  "model",
  "env",
  "seed",
  "train.batch_size",
  "ppo.advantage_estimator",
  "ppo.num_generations",
)
LOCK = ".lock"
HISTORY = "config_history.jsonl"


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in config.items():
    if isinstance(value, dict) and key not in ("kwargs",):
      out |= _flat(value, f"{prefix}{key}.")
    else:
      out[f"{prefix}{key}"] = value
  return out


def _fixed(key: str) -> bool:
  return any(key == f or key.startswith(f + ".") for f in FIXED)


def check_rerun(out: pathlib.Path, config: dict[str, Any], checkpoint_step: int | None) -> None:
  """Refuses a rerun that changes a `FIXED` setting or asks for fewer steps than are done;
  records the other changes in `config_history.jsonl`. Writes `config.json` last.

  Raises:
    ValueError: one line listing every refused difference (`key: saved -> requested`).
  """
  saved_file = out / "config.json"
  if checkpoint_step is not None and saved_file.is_file():
    saved, requested = _flat(json.loads(saved_file.read_text())), _flat(config)
    changed = {
      k: (saved.get(k), requested.get(k))
      for k in sorted(saved.keys() | requested.keys())
      if saved.get(k) != requested.get(k)
    }
    refused = {k: v for k, v in changed.items() if _fixed(k)}
    if refused:
      listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
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
    if changed:
      record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "from_step": checkpoint_step}
      record["changed"] = {k: {"from": a, "to": b} for k, (a, b) in changed.items()}
      with (out / HISTORY).open("a") as history:
        history.write(json.dumps(record) + "\n")
  write_atomically(saved_file, json.dumps(config, indent=2))


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class RunLock:
  """`with RunLock(out):` holds `out/.lock` for this process; ValueError if another holds it."""

  def __init__(self, out: pathlib.Path):
    self.path = out / LOCK

  def __enter__(self) -> RunLock:
    while True:
      try:
        descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
      except FileExistsError:
        holder = self._holder()
        if holder is not None and holder != os.getpid() and _alive(holder):
          raise ConfigError(
            f"output dir {str(self.path.parent)!r} is in use by another run (pid {holder}); "
            "wait for it or choose another --output-dir"
          ) from None
        self.path.unlink(missing_ok=True)  # a killed run's stale lock
        continue
      with os.fdopen(descriptor, "w") as handle:
        handle.write(str(os.getpid()))
      return self

  def _holder(self) -> int | None:
    try:
      return int(self.path.read_text().strip() or "0") or None
    except (FileNotFoundError, ValueError):
      return None

  def __exit__(self, *exc: Any) -> None:
    if self._holder() == os.getpid():
      self.path.unlink(missing_ok=True)
