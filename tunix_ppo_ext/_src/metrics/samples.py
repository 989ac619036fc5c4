"""Sampled conversations of a run: `samples.jsonl` in the run directory and a W&B table.

`SampleWriter(path, wandb_sink)` is the `on_samples` callback of `MultiTurnRollout`: each
evaluation hands it a few episodes (`metrics.episodes.conversation` turns, marked
`observation` or `agent`). Every sample is one JSON line `{"step", "mode", "row", "seed",
"return", "success", "turns"}`, appended and flushed at once; `step` is the number of
optimizer updates done, the step of every metric (`MetricKeys.step`), so the samples and
metrics of one evaluation share it; with an active `WandbSink`
the evaluation's samples also go to W&B as a table (`eval/samples`: one row per turn,
columns `step`, `row`, `turn`, `role`, `text`, `return`, `success`).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

FILENAME = "samples.jsonl"
TABLE_KEY = "eval/samples"
TABLE_COLUMNS = ["step", "row", "turn", "role", "text", "return", "success"]


def table_rows(step: int, samples: list[dict[str, Any]]) -> list[list[Any]]:
  """One row per turn of every sample, in `TABLE_COLUMNS` order."""
  return [
    [step, s["row"], t, turn["role"], turn["text"], s["return"], s["success"]]
    for s in samples
    for t, turn in enumerate(s["turns"])
  ]


class SampleWriter:
  """Appends each evaluation's samples to `path` and, if `wandb_sink()` gives an active
  sink, logs them as a W&B table at the evaluation's step.

  Args:
    path: the `samples.jsonl` to append to (created with its directory).
    wandb_sink: returns the run's `WandbSink` or None (it is created lazily by tunix's
      metrics logger, so it is looked up at every call).
    updates_per_batch: optimizer updates per training batch: the rollout hands tunix's
      global step (batches done), written as `step * updates_per_batch` (updates done).
  """

  def __init__(
    self,
    path: str | pathlib.Path,
    wandb_sink: Callable[[], Any] | None = None,
    mode: str = "eval",
    updates_per_batch: int = 1,
  ):
    self.path = pathlib.Path(path)
    self._wandb_sink = wandb_sink or (lambda: None)
    self.mode = mode
    self.updates_per_batch = updates_per_batch

  def __call__(self, batches: int, samples: list[dict[str, Any]]) -> None:
    """Writes an evaluation's `samples`, made after `batches` training batches."""
    step = int(batches) * self.updates_per_batch
    self.path.parent.mkdir(parents=True, exist_ok=True)
    with self.path.open("a") as handle:
      for sample in samples:
        handle.write(json.dumps({"step": int(step), "mode": self.mode, **sample}) + "\n")
    sink = self._wandb_sink()
    if sink is not None and getattr(sink, "active", False):
      sink.log_table(TABLE_KEY, TABLE_COLUMNS, table_rows(int(step), samples), int(step))


def read_samples(path: str | pathlib.Path) -> list[dict[str, Any]]:
  """The samples of a `samples.jsonl` (a cut-off last line, from a killed run, is skipped)."""
  rows = []
  for line in pathlib.Path(path).read_text().splitlines():
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return rows
