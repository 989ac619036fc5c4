"""`tunix-ppo-ext plot RUN_DIR`: a PNG grid of a run's main curves from its `metrics.jsonl`."""

from __future__ import annotations

import io
import json
import os
import pathlib
from typing import Any

import numpy as np

from tunix_ppo_ext._src.metrics.keys import MetricKeys
from tunix_ppo_ext._src.metrics.sinks import read_jsonl, read_text

# panel title -> published keys drawn in it
PANELS: dict[str, tuple[str, ...]] = {
  "episode return": ("train/episode_return/mean", "eval/episode_return/mean"),
  "success rate": ("train/success_rate", "eval/success_rate"),
  "entropy": ("actor/entropy",),
  "return spread": ("train/in_group_return_std", "train/episode_return_std"),
  "gradient norm": ("actor/grad_norm", "critic/grad_norm"),
  "KL to reference": ("actor/kl",),
  "KL coefficient": ("actor/kl_coef",),
  "clip fractions": ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "critic/vf_clipfrac"),
  "value loss": ("critic/vf_loss",),
  "explained variance": ("critic/explained_variance",),
  "policy loss": ("actor/pg_loss",),
}
FILENAME = "curves.png"
ECHO_TRAP_KEY = "train/echo_trap"  # a dashed line on every panel where the warning fired
WARMUP_KEY = "critic/warmup"  # the critic warm-up's steps shaded on every panel
# panel title -> the range its values can meaningfully take; values outside are drawn
# off-scale (explained variance is at most 1, and below -1 a critic is worse than the
# mean by more than the returns' own variance: its first updates can give -100)
BOUNDS: dict[str, tuple[float, float]] = {"explained variance": (-1.0, 1.0)}
FENCE = 10.0  # `bulk_range`: points this many 10th-90th percentile bands away are off-scale


class UnwritablePlot(ValueError):
  """The PNG could not be written (a read-only file system or directory, a path under a
  file, a full disk): one line naming the path and the reason."""


def output_path(run_dir: pathlib.Path, out: str | os.PathLike | None) -> pathlib.Path:
  """Where `plot_run` writes: `RUN_DIR/curves.png`, else `out` (`out/curves.png` when `out`
  is a directory)."""
  if out is None:
    return run_dir / FILENAME
  out = pathlib.Path(out)
  return out / FILENAME if out.is_dir() else out


def run_keys(run_dir: pathlib.Path) -> MetricKeys:
  """The run's metric keys (its `config.json` may rename or drop some)."""
  config_path = run_dir / "config.json"
  section: dict[str, Any] = {}
  if config_path.is_file():
    try:
      config = json.loads(read_text(config_path))
    except json.JSONDecodeError as err:
      raise ValueError(f"{config_path}: not JSON ({err})") from None
    if not isinstance(config, dict):
      raise ValueError(f"{config_path}: a run's config must be a JSON object")
    section = config.get("metrics", {}) or {}
  return MetricKeys(rename=section.get("rename", {}), drop=tuple(section.get("drop", ())))


def curves(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
  """`(steps, values)` of `key` over the rows that hold a value for it; ValueError naming
  the step and key of a value that is not a number."""
  points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
  for step, value in points:
    if isinstance(value, bool) or not isinstance(value, int | float):
      raise ValueError(f"metrics.jsonl step {step}: {key!r} is {value!r}, not a number")
  return [s for s, _ in points], [v for _, v in points]


def robust_limits(
  values: list[float], tail: float = 1.0, bounds: tuple[float, float] | None = None
) -> tuple[float, float] | None:
  """y-limits that keep spikes and a block of early outliers from flattening a curve: the
  range of `bulk_range`, widened by a tenth of its span (`None` for no values).

  `bounds`: the range the values can meaningfully take (`BOUNDS`); values outside it are
  left off-scale, unless no value lies inside. With fewer than 20 values the full range
  (within `bounds`) is kept, still padded: a short run shows every point.
  """
  data = np.asarray([v for v in values if np.isfinite(v)], np.float64)
  if bounds is not None:
    inside = data[(data >= bounds[0]) & (data <= bounds[1])]
    data = inside if inside.size else data
  if not data.size:
    return None
  low, high = bulk_range(data, tail) if data.size >= 20 else (float(data.min()), float(data.max()))
  pad = 0.1 * (high - low) if high > low else max(abs(high) * 0.1, 1e-3)
  return low - pad, high + pad


def bulk_range(data: np.ndarray, tail: float = 1.0) -> tuple[float, float]:
  """The `(low, high)` of the points a person reads a curve by (at least 20 finite values).

  - A few spikes: the `tail`-th to `(100 - tail)`-th percentiles, once the spikes stretch
    the range to more than twice that band.
  - A block of outliers, more than `tail` percent of the points (the first updates'
    explained variance near -100, the rest in [0, 0.5]): the points within `FENCE` times
    the 10th-to-90th percentile band of it.
  Nothing outside either: the full range (a curve that rises steadily is kept whole).
  """
  low, high = float(data.min()), float(data.max())
  low_p, high_p = np.percentile(data, [tail, 100.0 - tail])
  if high_p > low_p and (high - low) > 2.0 * float(high_p - low_p):
    low, high = float(low_p), float(high_p)
  low_q, high_q = np.percentile(data, [10.0, 90.0])
  reach = FENCE * float(high_q - low_q)
  if reach > 0:
    kept = data[(data >= low_q - reach) & (data <= high_q + reach)]
    low, high = max(low, float(kept.min())), min(high, float(kept.max()))
  return low, high


def offscale_note(
  points: list[tuple[int, float]],
  limits: tuple[float, float],
  bounds: tuple[float, float] | None = None,
) -> str | None:
  """The panel's note on its points `(step, value)` outside the y-`limits`: per side, how
  many, past what (the panel's bound when they all pass it, else the axis) and over which
  steps, e.g. `off-scale: 10 points below -1 (steps 1-10)`; None when there are none."""
  sides = (
    ("below", [(s, v) for s, v in points if v < limits[0]], bounds and bounds[0], -1.0),
    ("above", [(s, v) for s, v in points if v > limits[1]], bounds and bounds[1], 1.0),
  )
  parts = []
  for side, outside, bound, sign in sides:
    if not outside:
      continue
    steps = [s for s, _ in outside]
    past_bound = bound is not None and all(sign * (v - bound) > 0 for _, v in outside)
    edge = f"{bound:g}" if past_bound else "the axis"
    span = f"step {steps[0]}" if min(steps) == max(steps) else f"steps {min(steps)}-{max(steps)}"
    count = f"{len(outside)} point{'s' if len(outside) > 1 else ''}"
    parts.append(f"{count} {side} {edge} ({span})")
  return f"off-scale: {'; '.join(parts)}" if parts else None


Panel = tuple[str, list[tuple[str, list[int], list[float]]]]  # title, (key, steps, values)


def logged_panels(rows: list[dict[str, Any]], keys: MetricKeys) -> list[Panel]:
  """The `PANELS` whose keys (as the run published them) the rows hold, each with its
  lines `(key, steps, values)`; panels without a logged key are left out."""
  panels: list[Panel] = []
  for title, names in PANELS.items():
    lines = []
    for name in names:
      key = keys.final(name)
      steps, values = curves(rows, key) if key else ([], [])
      if steps:
        lines.append((key, steps, values))
    if lines:
      panels.append((title, lines))
  return panels


def warmup_span(rows: list[dict[str, Any]], keys: MetricKeys) -> tuple[float, float] | None:
  """The steps of the critic warm-up (`critic/warmup` 1), as `(first - 0.5, last + 0.5)`;
  None when the run had none."""
  key = keys.final(WARMUP_KEY)
  steps, values = curves(rows, key) if key else ([], [])
  warm = [s for s, v in zip(steps, values, strict=True) if v > 0]
  return (min(warm) - 0.5, max(warm) + 0.5) if warm else None


def draw_run(run_dir: str | pathlib.Path, columns: int = 3) -> Any:
  """The matplotlib figure of the `PANELS` a run logged in `RUN_DIR/metrics.jsonl`.

  Panels whose keys the run never logged (no critic, no success rate, dropped keys) are
  left out; all panels share one step axis (the number of updates done); y-limits are
  robust to spikes and early outliers (`robust_limits`, within a panel's `BOUNDS`), and a
  panel notes the points it leaves off-scale (`offscale_note`). Where the Echo Trap
  warning fired (`train/echo_trap`), every panel has a dashed line; the critic warm-up's
  steps (`critic/warmup`) are shaded on every panel.
  """
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  run_dir = pathlib.Path(run_dir)
  metrics_path = run_dir / "metrics.jsonl"
  if not metrics_path.is_file():
    raise ValueError(f"RUN_DIR {str(run_dir)!r} has no metrics.jsonl")
  rows, keys = read_jsonl(metrics_path), run_keys(run_dir)
  panels = logged_panels(rows, keys)
  if not panels:
    raise ValueError(f"RUN_DIR {str(run_dir)!r}: metrics.jsonl holds none of the plotted keys")
  echo_key = keys.final(ECHO_TRAP_KEY)
  echo_steps = curves(rows, echo_key)[0] if echo_key else []
  warmup = warmup_span(rows, keys)
  columns = min(columns, len(panels))
  rows_needed = -(-len(panels) // columns)
  figure, axes = plt.subplots(
    rows_needed, columns, figsize=(4.5 * columns, 2.8 * rows_needed), sharex=True, squeeze=False
  )
  flat = list(axes.ravel())
  for axis, panel in zip(flat, panels, strict=False):
    draw_panel(axis, panel, echo_steps, warmup)
  for axis in flat[len(panels) :]:
    axis.remove()  # the last row's unused cells: no empty frames
  for axis in flat[: len(panels)]:
    if axis.get_subplotspec().is_last_row() or flat.index(axis) + columns >= len(panels):
      axis.set_xlabel("step (updates done)")
      axis.tick_params(labelbottom=True)
  figure.suptitle(str(run_dir.resolve().name))
  figure.tight_layout()
  return figure


def draw_panel(
  axis: Any, panel: Panel, echo_steps: list[int], warmup: tuple[float, float] | None
) -> None:
  """One panel's lines, Echo Trap lines and warm-up shading, its y-limits and the note on
  the points they leave off-scale."""
  title, lines = panel
  points: list[tuple[int, float]] = []
  for key, steps, values in lines:
    axis.plot(steps, values, label=key, marker="." if len(steps) < 20 else None)
    points += [(s, v) for s, v in zip(steps, values, strict=True) if np.isfinite(v)]
  for step in echo_steps:
    axis.axvline(step, color="tab:red", linestyle="--", linewidth=0.8, label="echo trap")
  if warmup is not None:
    axis.axvspan(*warmup, color="tab:gray", alpha=0.15, label="critic warm-up")
  limits = robust_limits([v for _, v in points], bounds=BOUNDS.get(title))
  note = None
  if limits is not None:
    axis.set_ylim(*limits)
    note = offscale_note(points, limits, BOUNDS.get(title))
  if note:
    box = {"facecolor": "white", "alpha": 0.7, "edgecolor": "none"}
    axis.text(0.01, 0.97, note, transform=axis.transAxes, va="top", fontsize=7, bbox=box)
  axis.set_title(title, fontsize=10)
  axis.grid(alpha=0.3)
  if len(lines) > 1 or echo_steps or warmup is not None:
    axis.legend(fontsize="x-small")
  else:
    axis.set_ylabel(lines[0][0], fontsize=7)


def plot_run(
  run_dir: str | pathlib.Path, columns: int = 3, out: str | os.PathLike | None = None
) -> pathlib.Path:
  """Draws the `PANELS` a run logged from `RUN_DIR/metrics.jsonl` (`draw_run`) into
  `RUN_DIR/curves.png`, or `out` (`output_path`). Returns the PNG's path;
  `UnwritablePlot` when it cannot be written there.

  Args:
    run_dir: the run's output directory (holds `metrics.jsonl`).
    columns: panels per row of the figure.
    out: where to write the PNG; None: `RUN_DIR/curves.png`.

  Returns:
    The PNG's path.
  """
  figure = draw_run(run_dir, columns)  # selects matplotlib's Agg backend first
  from matplotlib import pyplot as plt

  target = output_path(pathlib.Path(run_dir), out)
  try:  # drawn in memory, then written and closed here: a write refused only at close (a
    # full disk) raises here, where matplotlib's own file writing let it pass
    image = io.BytesIO()
    figure.savefig(image, dpi=100, format=target.suffix[1:].lower() or None)
    target.write_bytes(image.getvalue())
  except OSError as err:  # EROFS, EACCES, ENOSPC...: the path and the reason, no traceback
    reason = os.strerror(err.errno).lower() if err.errno else str(err)
    raise UnwritablePlot(f"cannot write {str(target)!r} ({reason})") from None
  finally:
    plt.close(figure)
  return target


def spread_band(runs: list[list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
  """`(mean, min, max)` per step over the curves `runs` (e.g. one per seed), each cut to
  the shortest; `None` when there is no curve or the shortest is empty."""
  length = min((len(c) for c in runs), default=0)
  if not length:
    return None
  values = np.array([c[:length] for c in runs], np.float64)
  return values.mean(0), values.min(0), values.max(0)


def plot_spread(
  curves_by_name: dict[str, list[list[float]]],
  out: str | pathlib.Path,
  ylabel: str = "training episode return",
  reference: tuple[str, list[float]] | None = None,
) -> pathlib.Path:
  """One line per name: the mean over its curves (e.g. seeds) per step, with the min-max band.

  `curves_by_name[name]` holds one curve per seed, `curves[k][t]` the value at step t+1;
  curves of unequal length are cut to the shortest. `reference = (label, values)` draws the
  values' min-max as a horizontal band and their mean as a dotted line (e.g. a baseline's
  batches). Writes the PNG at `out`.

  Args:
    curves_by_name: name -> one curve (a list of per-step values) per seed.
    out: the PNG's path.
    ylabel: the y axis' label.
    reference: optional `(label, values)` drawn as a band and its mean.

  Returns:
    The PNG's path.
  """
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  figure, axis = plt.subplots(figsize=(7, 4))
  for name, runs in curves_by_name.items():
    band = spread_band(runs)
    if band is None:
      continue
    mean, low, high = band
    steps = np.arange(1, len(mean) + 1)
    axis.plot(steps, mean, label=f"{name} (mean of {len(runs)})")
    axis.fill_between(steps, low, high, alpha=0.2)
  if reference is not None and reference[1]:
    label, values = reference
    axis.axhspan(min(values), max(values), color="gray", alpha=0.15, label=f"{label} (min-max)")
    axis.axhline(float(np.mean(values)), color="gray", linestyle=":", label=f"{label} (mean)")
  axis.set_xlabel("batch (row of the return curve)")
  axis.set_ylabel(ylabel)
  if axis.lines:
    axis.legend(fontsize="x-small")
  figure.tight_layout()
  figure.savefig(out, dpi=100)
  plt.close(figure)
  return pathlib.Path(out)
