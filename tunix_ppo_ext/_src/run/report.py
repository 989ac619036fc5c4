"""What `train` tells a person when a run ends, or when there is nothing left to train.

`end_lines`: after the progress bar closes, a few lines on stdout: the output directory,
the updates (and batches) done and the wall time of every part of the run, the episode
return and success rate at the end and at best (against the best possible return), the
last evaluation's figures, and the next command (`tunix-ppo-ext plot DIR`). The figures
are `summary.json`'s and `metrics.jsonl`'s; `summary.json` is the machine-readable record.

`finished_line`: the one line of a rerun into a run that is already complete.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from tunix_ppo_ext._src.metrics.keys import MetricKeys

SUCCESS_KEY = "train/success_rate"
EVAL_KEYS = {"episode return": "eval/episode_return/mean", "success rate": "eval/success_rate"}


def finished_line(output_dir: str, summary: dict[str, Any], steps: int) -> str:
  """The rerun's one line: the run is complete, and how to train further."""
  done = f"{summary.get('updates', steps)} updates in {summary.get('wall_s', 0.0)} s"
  return (
    f"tunix-ppo-ext: {output_dir} is already complete ({done}; summary.json); nothing was "
    f"changed. To train further, rerun with more steps (e.g. train.steps={2 * steps}), or "
    "train a new run with --output-dir DIR"
  )


def end_lines(
  output_dir: str, summary: dict[str, Any], rows: Sequence[dict[str, Any]], keys: MetricKeys
) -> list[str]:
  """The lines printed when a run ends: `summary` (the run's `summary.json`) and the rows of
  its `metrics.jsonl`, whose keys are `keys`' published ones."""
  lines = [f"tunix-ppo-ext: {output_dir}: {_done(summary)}"]
  tail = max(1, summary["steps"] // 10)
  batches = f"the last {tail} batches" if tail > 1 else "the last batch"
  lines.append(
    f"  episode return {summary['final_return']:.3f} at the end (mean of {batches}), best "
    f"{summary['best_return']:.3f}, of {summary['max_return']:.4g} possible"
  )
  success = _series(rows, keys.final(SUCCESS_KEY))
  if success:
    final = sum(success[-tail:]) / len(success[-tail:])
    lines.append(f"  success rate {final:.3f} at the end, best {max(success):.3f}")
  evaluation = _last_evaluation(rows, keys)
  if evaluation:
    lines.append(f"  last evaluation, {evaluation}")
  lines.append(f"  next: tunix-ppo-ext plot {shlex.quote(output_dir)}")
  return lines


def _done(summary: dict[str, Any]) -> str:
  """`600 updates (300 batches) in 87.7 s`, and the parts of a resumed run."""
  text = f"{summary['updates']} updates ({summary['steps']} batches) in {summary['wall_s']} s"
  resumes = summary.get("resumes") or []
  if resumes:
    at = ", ".join(str(step) for step in resumes)
    text += f", {len(resumes) + 1} parts (resumed at update {at})"
  return text


def _series(rows: Sequence[dict[str, Any]], key: str | None) -> list[float]:
  return [row[key] for row in rows if key is not None and row.get(key) is not None]


def _last_evaluation(rows: Sequence[dict[str, Any]], keys: MetricKeys) -> str:
  """`after 600 updates: episode return 1.200, success rate 0.970`, or '' without one."""
  published = {label: keys.final(key) for label, key in EVAL_KEYS.items()}
  for row in reversed(rows):
    figures = [
      f"{label} {row[key]:.3f}" for label, key in published.items() if row.get(key) is not None
    ]
    if figures:
      return f"after {row['step']} updates: " + ", ".join(figures)
  return ""
