"""Metric sinks for tunix's metrics logger: `metrics.jsonl` and a progress bar.

tunix's `MetricsLogger` sends every scalar as `jax.monitoring` events named
`<prefix>/<mode>/<name>` with a `step`; each backend here is a metrax `LoggingBackend`
(`log_scalar(event, value, step=...)`, `close()`).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import warnings
from typing import Any

import numpy as np
import tqdm


def _is_training_event(event: str) -> bool:
  """tunix's `<prefix>/<mode>/<name>` events; JAX's and orbax's own start with `/`."""
  return not event.startswith("/")


def _scalar(value: Any) -> float:
  return float(np.asarray(value).reshape(-1)[0])


class JsonlBackend:
  """Writes one JSON object per step (`{"step": s, name: value, ...}`) to `path`.

  Events of one step are gathered and the line is written when a later step arrives or
  at `close()`; non-finite values are written as `null`.
  """

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._file = self.path.open("a")
    self._step: int | None = None
    self._row: dict[str, float | None] = {}

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    if self._file.closed or not _is_training_event(event):
      return
    step = int(kwargs.get("step", 0))
    if self._step is not None and step != self._step:
      self._flush()
    self._step = step
    number = _scalar(value)
    self._row[event] = number if math.isfinite(number) else None

  def _flush(self) -> None:
    if self._row:
      self._file.write(json.dumps({"step": self._step, **self._row}) + "\n")
      self._file.flush()
    self._row = {}

  def close(self) -> None:
    if not self._file.closed:
      self._flush()
      self._file.close()


class ProgressBackend:
  """A tqdm bar over training steps showing the chosen metrics' latest values."""

  def __init__(self, total: int, shown: dict[str, str]):
    self._bar = tqdm.tqdm(total=total, unit="step", dynamic_ncols=True)
    self._shown = shown  # event name -> short label
    self._values: dict[str, float] = {}
    self._step = 0

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    if event in self._shown:
      self._values[self._shown[event]] = _scalar(value)
      self._bar.set_postfix({k: f"{v:.3f}" for k, v in self._values.items()}, refresh=False)
    step = int(kwargs.get("step", 0))
    if step > self._step:
      self._bar.update(step - self._step)
      self._step = step

  def close(self) -> None:
    self._bar.close()


def read_jsonl(path: str | pathlib.Path) -> list[dict[str, Any]]:
  """The rows of a `metrics.jsonl`, merged per step (a step may span several lines)."""
  rows: dict[int, dict[str, Any]] = {}
  for line in pathlib.Path(path).read_text().splitlines():
    if line.strip():
      row = json.loads(line)
      rows.setdefault(row["step"], {}).update(row)
  return [rows[s] for s in sorted(rows)]


class WandbSink:
  """W&B through metrax's `WandbBackend`, only tunix's training events, never fatal.

  `mode` is `online` or `offline`; `online` without an API key falls back to `offline`
  (sync later with `wandb sync`). A failing `wandb.init` leaves a single warning and a
  sink that drops everything, so training goes on.
  """

  def __init__(self, mode: str, run_dir: str | pathlib.Path, config: dict[str, Any]):
    self._backend = None
    if mode == "online" and not os.environ.get("WANDB_API_KEY"):
      mode = "offline"
    try:
      from metrax.logging import WandbBackend

      pathlib.Path(run_dir).mkdir(parents=True, exist_ok=True)
      self._backend = WandbBackend(
        project="tunix-ppo-ext", mode=mode, dir=str(run_dir), config=config, reinit=True
      )
    except Exception as err:  # noqa: BLE001 (W&B must never stop training)
      warnings.warn(f"W&B disabled for this run: {type(err).__name__}: {err}", stacklevel=2)

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    if self._backend is not None and _is_training_event(event):
      self._backend.log_scalar(event, value, **kwargs)

  def close(self) -> None:
    if self._backend is not None:
      self._backend.close()
      self._backend = None
