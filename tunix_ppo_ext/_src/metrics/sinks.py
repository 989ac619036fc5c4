"""Metric sinks: `metrics.jsonl`, TensorBoard, a progress bar, W&B, and readers for them.

tunix's `MetricsLogger` sends every scalar as `jax.monitoring` events named
`<prefix>/<mode>/<name>` with a `step`; each backend here is a metrax `LoggingBackend`
(`log_scalar(event, value, step=...)`, `close()`). `KeyedBackend` puts any backend behind
the taxonomy of `metric_keys`, so sinks see published keys (`actor/pg_loss`, ...).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import stat
import struct
import time
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import tqdm

from tunix_ppo_ext._src.metrics.keys import MetricKeys


def _is_training_event(event: str) -> bool:
  """tunix's `<prefix>/<mode>/<name>` events; JAX's and orbax's own start with `/`."""
  return not event.startswith("/")


def _scalar(value: Any) -> float:
  return float(np.asarray(value).reshape(-1)[0])


class JsonlBackend:
  """Appends one JSON line per event to `path` (`{"step": s, name: value}`), at once.

  Every value is on disk as soon as tunix logs it, so a run killed at any moment loses
  nothing it logged; `read_jsonl` merges a step's lines, and the main job compacts the
  file to one line per step when the run ends. Non-finite values are written as `null`.
  """

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._file = self.path.open("a")

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    if self._file.closed or not _is_training_event(event):
      return
    number = _scalar(value)
    row = {"step": int(kwargs.get("step", 0)), event: number if math.isfinite(number) else None}
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()

  def close(self) -> None:
    if not self._file.closed:
      self._file.close()


def jsonl_sink(output_dir: pathlib.Path, config: dict[str, Any]) -> JsonlBackend:
  """The `jsonl` metric sink (registry protocol): `output_dir/metrics.jsonl`.

  Args:
    output_dir: the run's output directory.
    config: the sink's configuration (unused).

  Returns:
    The backend that appends to `output_dir/metrics.jsonl`.
  """
  del config
  return JsonlBackend(pathlib.Path(output_dir) / "metrics.jsonl")


class ProgressBackend:
  """A tqdm bar over the run's optimizer updates (`train.steps`, unit `update`) showing the
  chosen metrics' latest values.

  Until the first step ends the bar says `compiling` and gives no rate or ETA: that step
  compiles the rollout and the updates (minutes for a real model), and timed with the
  others it made the first ETA hours long. The first step ends when `step_done` (the
  published `timing_s/step`, logged after each step) arrives, or, with it dropped, when a
  later step's metrics do. From then on the bar says `training (first step N s)` and its
  elapsed time, rates and ETA are those of the steps after the first.
  `file`: where the bar goes (default stderr).
  """

  _open: weakref.WeakSet[ProgressBackend] = weakref.WeakSet()
  COMPILING, TRAINING = "compiling", "training"

  def __init__(
    self, total: int, shown: dict[str, str], step_done: str | None = None, file: Any = None
  ):
    self._bar = tqdm.tqdm(
      total=total, unit="update", desc=self.COMPILING, dynamic_ncols=True, file=file
    )
    ProgressBackend._open.add(self)
    self._shown = shown  # event name -> short label
    self._values: dict[str, float] = {}
    self._step_done = step_done
    self._compiling = True
    self._first: int | None = None  # the first step seen while compiling

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    if event in self._shown:
      self._values[self._shown[event]] = _scalar(value)
      self._bar.set_postfix({k: f"{v:.3f}" for k, v in self._values.items()}, refresh=False)
    step = int(kwargs.get("step", 0))
    if self._compiling:
      self._while_compiling(event, step)
    elif step > self._bar.n:
      self._bar.update(step - self._bar.n)

  def _while_compiling(self, event: str, step: int) -> None:
    """Moves the count untimed (`initial` follows it: no rate); ends the compiling at the
    first step's end."""
    if self._first is None and step > 0:
      self._first = step
    if self._step_done is not None:
      ended = event == self._step_done
    else:
      ended = self._first is not None and step > self._first
    if step > self._bar.n:
      self._bar.n = self._bar.initial = step
      self._bar.refresh()
    if ended:  # timed from here: rates, ETA and the final average are the steps' own
      now = time.time()
      first = now - self._bar.start_t
      self._bar.start_t = self._bar.last_print_t = now
      self._bar.last_print_n = self._bar.n
      self._bar.set_description_str(f"{self.TRAINING} (first step {first:.0f} s)")
      self._compiling = False

  def close(self) -> None:
    self._bar.close()
    ProgressBackend._open.discard(self)

  @classmethod
  def close_all(cls) -> None:
    """Closes every open bar (after a failure, so none is torn down at interpreter exit)."""
    for backend in list(cls._open):
      backend.close()


def read_jsonl(path: str | pathlib.Path) -> list[dict[str, Any]]:
  """The rows of a `metrics.jsonl`, merged per step (a step may span several lines; a
  later line's value wins). A cut-off last line (writer killed mid-write) is skipped.

  Args:
    path: the `metrics.jsonl` file.

  Returns:
    One dict per step, `{"step": ..., key: value, ...}`, in step order.
  """
  rows: dict[int, dict[str, Any]] = {}
  for _, row in _parse_jsonl(read_text(path), path):
    rows.setdefault(row["step"], {}).update(row)
  return [rows[s] for s in sorted(rows)]


def read_text(path: str | pathlib.Path) -> str:
  """The UTF-8 text of `path`; ValueError naming the file when it is not UTF-8 text."""
  try:
    return pathlib.Path(path).read_text(encoding="utf-8")
  except UnicodeDecodeError as err:
    raise ValueError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None


def _parse_jsonl(text: str, path: str | pathlib.Path) -> list[tuple[str, dict[str, Any]]]:
  """`(line, row)` per line of a `metrics.jsonl`; a last line without its newline that does
  not parse is skipped, any other bad line raises ValueError naming it."""
  lines = text.split("\n")
  parsed = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      if number == len(lines):  # no newline after it: cut off mid-write
        continue
      raise ValueError(f"{path}:{number}: not a JSON line: {line[:80]!r}") from None
    if not isinstance(row, dict) or not isinstance(row.get("step"), int):
      raise ValueError(f"{path}:{number}: a row must be an object with an int 'step'")
    parsed.append((line, row))
  return parsed


def write_atomically(path: str | pathlib.Path, text: str) -> None:
  """Replaces the file at `path` with `text` in one step: a temporary file beside it,
  synced, renamed.

  A kill at any moment leaves either the old file or the new one, never a cut-off one. A
  symbolic link is written through: the file it points to is replaced, the link kept (a
  dangling one creates its target). What is not a file to replace, a character device or
  a FIFO (a terminal, `/dev/null`, a pipe) or an open descriptor (`/dev/stdout`,
  `/dev/fd/N`, whatever it is), is written directly, appending (a descriptor redirected to
  a file keeps what the command printed before).
  """
  path = pathlib.Path(path)
  if _stream(path):
    with path.open("a") as handle:
      handle.write(text)
    return
  target = pathlib.Path(os.path.realpath(path))  # the file a link points to
  temporary = target.with_name(f".{target.name}.tmp")
  with temporary.open("w") as handle:
    handle.write(text)
    handle.flush()
    os.fsync(handle.fileno())
  os.replace(temporary, target)


_DESCRIPTORS = re.compile(r"/proc/(self|\d+)/fd")  # where `/dev/stdout` and `/dev/fd` lead


def _stream(path: pathlib.Path) -> bool:
  """Whether `path` is a character device or a FIFO, or a link through an open descriptor
  (`/dev/stdout` -> `/proc/self/fd/1`)."""
  try:
    mode = path.stat().st_mode  # through links
  except OSError:  # missing (or a dangling link): a file to create
    return False
  if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
    return True
  for _ in range(40):  # the kernel's own limit on links followed
    if not path.is_symlink():
      return False
    if _DESCRIPTORS.fullmatch(os.path.realpath(path.parent)):
      return True
    path = path.parent / os.readlink(path)
  return False


def truncate_jsonl(path: str | pathlib.Path, last_step: int) -> int:
  """Keeps the complete lines of `path` with `step <= last_step`; returns how many.

  Atomic (`write_atomically`): call it before a `JsonlBackend` opens the file. A missing
  file is left missing; a file that is not UTF-8 text or holds a bad line raises
  ValueError naming it, the file untouched.
  """
  return truncate_jsonl_files([path], last_step)[0]


def truncate_jsonl_files(paths: Sequence[str | pathlib.Path], last_step: int) -> list[int]:
  """`truncate_jsonl` of each of `paths` (a run's `metrics.jsonl` and `samples.jsonl`),
  every file read and checked before any is rewritten: a file that is not UTF-8 text or
  holds a bad line raises ValueError naming it, and none of them is changed.

  Args:
    paths: the JSON-lines files; a missing one is left missing.
    last_step: the last step kept.

  Returns:
    How many lines each file keeps (0 for a missing one).
  """
  files = [pathlib.Path(p) for p in paths]
  kept = [
    [line for line, row in _parse_jsonl(read_text(file), file) if row["step"] <= last_step]
    if file.exists()
    else None
    for file in files
  ]
  for file, lines in zip(files, kept, strict=True):
    if lines is not None:
      write_atomically(file, "".join(line + "\n" for line in lines))
  return [len(lines or []) for lines in kept]


def compact_jsonl(path: str | pathlib.Path) -> int:
  """Rewrites `path` as one line per step in step order (rows merged as `read_jsonl` does),
  atomically; returns the number of steps."""
  rows = read_jsonl(path)
  write_atomically(path, "".join(json.dumps(row) + "\n" for row in rows))
  return len(rows)


def has_wandb_key() -> bool:
  """An API key in `WANDB_API_KEY` or in `~/.netrc` (where `wandb login` puts it)."""
  netrc = pathlib.Path.home() / ".netrc"
  in_netrc = netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")
  return bool(os.environ.get("WANDB_API_KEY")) or in_netrc


WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")  # W&B's `mode`


def wandb_mode_problem() -> str:
  """Why W&B would refuse to start (its `WANDB_MODE` environment variable is not one of
  its modes), in one line; "" when it is unset or one of them."""
  mode = os.environ.get("WANDB_MODE")
  if mode is None or mode in WANDB_MODES:
    return ""
  return (
    f"WANDB_MODE={mode!r} is not a W&B mode (one of {', '.join(map(repr, WANDB_MODES))}); "
    "unset it or set one"
  )


class WandbSink:
  """W&B through the `wandb` library, one history row per step; never fatal.

  Every key is plotted against `global_step` (`define_metric`), so late rows (an
  evaluation logged after the next step began) land at their own step; the keys' first
  path component becomes a W&B section. `mode` is `online` or `offline`; `online` without
  an API key, or failing to start (no network), falls back to `offline` (sync later with
  `wandb sync`). The run directory is `run_dir/wandb`. If `wandb` is missing or cannot
  start even offline, one warning is issued and the sink drops everything, so training
  goes on.
  """

  STEP_KEY = "global_step"

  def __init__(self, mode: str, run_dir: str | pathlib.Path, config: dict[str, Any]):
    self._run = None
    self._step: int | None = None
    self._row: dict[str, float] = {}
    if mode == "online" and not has_wandb_key():
      mode = "offline"
    try:
      import wandb
    except ImportError:
      warnings.warn("W&B disabled for this run: wandb is not installed", stacklevel=2)
      return
    if problem := wandb_mode_problem():  # W&B's own refusal: pydantic's 5 lines
      warnings.warn(f"W&B disabled for this run: {problem}", stacklevel=2)
      return
    pathlib.Path(run_dir).mkdir(parents=True, exist_ok=True)
    try:
      self._run = self._init(wandb, mode, run_dir, config)
    except Exception as err:
      if mode == "online":  # e.g. no network: keep the run, offline
        warnings.warn(f"W&B online failed ({type(err).__name__}: {err}); offline", stacklevel=2)
        try:
          self._run = self._init(wandb, "offline", run_dir, config)
          return
        except Exception as second:
          err = second
      self._run = None
      first = str(err).strip().splitlines()[0] if str(err).strip() else ""
      warnings.warn(f"W&B disabled for this run: {type(err).__name__}: {first}", stacklevel=2)

  def _init(self, wandb: Any, mode: str, run_dir: str | pathlib.Path, config: dict[str, Any]):
    run = wandb.init(
      project=os.environ.get("WANDB_PROJECT", "tunix-ppo-ext"),
      mode=mode,
      dir=str(run_dir),
      config=config,
      reinit="create_new",
      settings=wandb.Settings(silent=True, console="off", init_timeout=60),
    )
    run.define_metric(self.STEP_KEY)
    run.define_metric("*", step_metric=self.STEP_KEY)
    return run

  @property
  def active(self) -> bool:
    return self._run is not None

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    if self._run is None:
      return
    step = int(kwargs.get("step", 0))
    if self._step is not None and step != self._step:
      self._flush()
    self._step = step
    self._row[event] = _scalar(value)

  def _flush(self) -> None:
    if self._row and self._run is not None:
      try:
        self._run.log({**self._row, self.STEP_KEY: self._step})
      except Exception as err:
        warnings.warn(f"W&B logging stopped: {type(err).__name__}: {err}", stacklevel=2)
        self._run = None
    self._row = {}

  def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
    """Logs `rows` as a `wandb.Table` under `key` at `step` (its own history row); never
    fatal: a failure costs one warning and the table."""
    if self._run is None:
      return
    try:
      import wandb

      self._run.log({key: wandb.Table(columns=columns, data=rows), self.STEP_KEY: step})
    except Exception as err:
      warnings.warn(f"W&B table {key!r} not logged: {type(err).__name__}: {err}", stacklevel=2)

  def close(self) -> None:
    if self._run is not None:
      self._flush()
      self._run.finish()
      self._run = None


class TensorboardBackend:
  """TensorBoard event files in `log_dir` (tensorboardX's own record writer), written in the
  calling thread and flushed once a step.

  metrax's backend writes through tensorboardX's writer thread: when that thread dies (a
  full disk), the next scalar waits for ever on its queue and the run hangs. Here a write
  that fails costs one warning and TensorBoard logging; training goes on (the disk guard,
  or the metrics.jsonl write, reports a full disk). `log_dir=None` writes nothing (the
  processes of a multi-host run other than process 0).
  """

  def __init__(self, log_dir: str | pathlib.Path | None):
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto import event_pb2
    from tensorboardX.summary import scalar

    self._event, self._summary = event_pb2.Event, scalar
    self._writer, self._step = None, None
    if log_dir is not None:
      pathlib.Path(log_dir).mkdir(parents=True, exist_ok=True)
      self._writer = self._guarded(lambda: EventsWriter(str(pathlib.Path(log_dir) / "events")))

  def _guarded(self, write: Any) -> Any:
    try:
      return write()
    except OSError as err:
      warnings.warn(f"TensorBoard logging stopped: {err}", stacklevel=3)
      self._writer = None
      return None

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    writer, step = self._writer, int(kwargs.get("step", 0))
    if writer is None:
      return
    if self._step is not None and step != self._step:
      self._guarded(writer.flush)
    self._step = step
    summary = self._summary(event.lstrip("/"), _scalar(value))
    event_proto = self._event(wall_time=time.time(), step=step, summary=summary)
    self._guarded(lambda: writer.write_event(event_proto))

  def close(self) -> None:
    writer, self._writer = self._writer, None
    if writer is not None:
      self._guarded(writer.close)


class KeyedBackend:
  """Any metrax-style backend behind the taxonomy: events renamed to published keys.

  Events that `keys.key` maps to `None` (dropped, or JAX's own `/...` events) never reach
  `backend`; steps are published steps (`MetricKeys.step`).
  """

  def __init__(self, backend: Any, keys: MetricKeys):
    self.backend, self._keys = backend, keys

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    key = self._keys.key(event)
    if key is not None:
      step = self._keys.step(event, int(kwargs.pop("step", 0)))
      self.backend.log_scalar(key, value, step=step, **kwargs)

  def close(self) -> None:
    self.backend.close()


def read_tensorboard(log_dir: str | pathlib.Path) -> dict[str, list[tuple[int, float]]]:
  """Every scalar in the TensorBoard event files under `log_dir`: `{tag: [(step, value)]}`.

  Reads the TFRecord framing (length, CRC, payload, CRC) and tensorboardX's `Event` proto.

  Args:
    log_dir: the directory searched for event files.

  Returns:
    tag -> `[(step, value)]`.
  """
  from tensorboardX.proto import event_pb2

  scalars: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(pathlib.Path(log_dir).rglob("events.out.tfevents.*")):
    data, pos = path.read_bytes(), 0
    while pos + 12 <= len(data):
      (length,) = struct.unpack("<Q", data[pos : pos + 8])
      payload = data[pos + 12 : pos + 12 + length]
      pos += 12 + length + 4
      if len(payload) < length:
        break  # a record cut short by a crash
      event = event_pb2.Event.FromString(payload)
      for value in event.summary.value:
        if value.HasField("simple_value"):
          scalars.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
  return scalars
