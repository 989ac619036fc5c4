"""`tunix-ppo-ext plot RUN_DIR`: a PNG grid of a run's main curves from its `metrics.jsonl`."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from tunix_ppo_ext._src.metrics.keys import MetricKeys
from tunix_ppo_ext._src.metrics.sinks import read_jsonl

# panel title -> published keys drawn in it
PANELS: dict[str, tuple[str, ...]] = {
  "episode return": ("train/episode_return/mean", "eval/episode_return/mean"),
  "success rate": ("train/success_rate", "eval/success_rate"),
  "entropy": ("actor/entropy",),
  "KL to reference": ("actor/kl",),
  "KL coefficient": ("actor/kl_coef",),
  "clip fractions": ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "critic/vf_clipfrac"),
  "value loss": ("critic/vf_loss",),
  "explained variance": ("critic/explained_variance",),
  "policy loss": ("actor/pg_loss",),
}
FILENAME = "curves.png"


def run_keys(run_dir: pathlib.Path) -> MetricKeys:
  """The run's metric keys (its `config.json` may rename or drop some)."""
  config_path = run_dir / "config.json"
  section: dict[str, Any] = {}
  if config_path.is_file():
    section = json.loads(config_path.read_text()).get("metrics", {}) or {}
  return MetricKeys(rename=section.get("rename", {}), drop=tuple(section.get("drop", ())))


def curves(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
  """`(steps, values)` of `key` over the rows that hold a finite value for it."""
  points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
  return [s for s, _ in points], [v for _, v in points]


def plot_run(run_dir: str | pathlib.Path, columns: int = 4) -> pathlib.Path:
  """Draws `PANELS` from `RUN_DIR/metrics.jsonl` into `RUN_DIR/curves.png`; returns its path."""
  import matplotlib  # noqa: PLC0415 (only this command needs it)

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # noqa: PLC0415

  run_dir = pathlib.Path(run_dir)
  metrics_path = run_dir / "metrics.jsonl"
  if not metrics_path.is_file():
    raise ValueError(f"RUN_DIR {str(run_dir)!r} has no metrics.jsonl")
  rows, keys = read_jsonl(metrics_path), run_keys(run_dir)
  rows_needed = -(-len(PANELS) // columns)
  figure, axes = plt.subplots(rows_needed, columns, figsize=(4 * columns, 3 * rows_needed))
  for axis, (title, names) in zip(axes.ravel(), PANELS.items(), strict=False):
    for name in names:
      key = keys.final(name)
      steps, values = curves(rows, key) if key else ([], [])
      if steps:
        axis.plot(steps, values, label=key, marker="." if len(steps) < 20 else None)
    axis.set_title(title)
    axis.set_xlabel("step")
    if axis.lines:
      axis.legend(fontsize="x-small")
    else:
      axis.text(0.5, 0.5, "not logged", ha="center", va="center", transform=axis.transAxes)
  figure.suptitle(str(run_dir.resolve().name))
  figure.tight_layout()
  out = run_dir / FILENAME
  figure.savefig(out, dpi=100)
  plt.close(figure)
  return out


def plot_spread(
  curves_by_name: dict[str, list[list[float]]], out: str | pathlib.Path
) -> pathlib.Path:
  """One line per name: the mean over its curves (e.g. seeds) per step, with the min-max band.

  `curves_by_name[name]` holds one curve per seed, `curves[k][t]` the value at step t+1;
  curves of unequal length are cut to the shortest. Writes the PNG at `out`.
  """
  import matplotlib  # noqa: PLC0415 (only the plot commands need it)

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # noqa: PLC0415

  figure, axis = plt.subplots(figsize=(7, 4))
  for name, runs in curves_by_name.items():
    length = min(len(c) for c in runs)
    if not length:
      continue
    values = np.array([c[:length] for c in runs], np.float64)
    steps = np.arange(1, length + 1)
    axis.plot(steps, values.mean(0), label=f"{name} (mean of {len(runs)})")
    axis.fill_between(steps, values.min(0), values.max(0), alpha=0.2)
  axis.set_xlabel("batch (row of the return curve)")
  axis.set_ylabel("training episode return")
  if axis.lines:
    axis.legend(fontsize="x-small")
  figure.tight_layout()
  figure.savefig(out, dpi=100)
  plt.close(figure)
  return pathlib.Path(out)
