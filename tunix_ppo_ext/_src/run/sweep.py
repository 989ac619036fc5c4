"""`tunix-ppo-ext sweep`: a seed study of one or more configs.

  tunix-ppo-ext sweep --seeds 5 [--jobs J] [--config PATH] [--output-dir DIR] [KEY=VALUE[,...] ...]

Each `KEY=V1,V2` override (commas outside brackets) makes one variant per value; several
such keys make their product. Every variant runs seeds `0 .. N-1`, each a normal
`tunix-ppo-ext train` in `DIR/<variant>/seed<k>` (a subprocess, so a killed sweep resumes
where it stopped; a seed whose `summary.json` exists is not run again), `J` of them at a
time (default 1: one after the other; each process uses every core XLA finds, so on a
many-core machine limit its threads, e.g. `XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`). Then
`DIR/table.md`, `DIR/table.json` and `DIR/curves.png` (mean training return per variant,
with its min-max band over seeds) are written.

Per variant, over seeds: mean, std (population) and min of `final_return`; how many seeds
reached 0.9 of the environment's maximum on the smoothed return curve and after how many
batches (rows of that curve; with `ppo.num_iterations=k` a batch is k of `train.steps`),
the mean over the seeds that did; the largest drop from a seed's smoothed peak to its
`final_return`; mean wall seconds. Smoothing is a trailing mean over a twentieth of the
curve (at least one point).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import ConfigError, check_integer
from tunix_ppo_ext._src.metrics import keys as metric_keys
from tunix_ppo_ext._src.metrics.sinks import read_jsonl, write_atomically

REACHED = 0.9  # share of the environment's max return that counts as solved


@dataclasses.dataclass(frozen=True)
class Variant:
  """One config of the study: its name (a directory) and its `KEY=VALUE` overrides."""

  name: str
  overrides: tuple[str, ...]


def split_values(raw: str) -> list[str]:
  """`"a,[1,2],b"` -> `["a", "[1,2]", "b"]`: commas outside brackets and braces split."""
  parts, depth, current = [], 0, ""
  for char in raw:
    depth += char in "[{"
    depth -= char in "]}"
    if char == "," and depth == 0:
      parts.append(current)
      current = ""
    else:
      current += char
  return [*parts, current]


def variants(overrides: Sequence[str]) -> list[Variant]:
  """The product of the overrides' values; a variant is named by its varying keys."""
  fixed, varying = [], []
  for override in overrides:
    key, sep, raw = override.partition("=")
    if not sep or not key:
      raise ConfigError(f"override {override!r} must look like section.key=value[,value...]")
    values = split_values(raw)
    if len(values) == 1:
      fixed.append(override)
    else:
      varying.append([f"{key}={v}" for v in values])
  if not varying:
    return [Variant("default" if not fixed else _dir_name(fixed), tuple(fixed))]
  return [Variant(_dir_name(choice), (*fixed, *choice)) for choice in itertools.product(*varying)]


def _dir_name(overrides: Sequence[str]) -> str:
  """A directory name from overrides: `ppo.kl_ctrl=adaptive` -> `kl_ctrl=adaptive`."""
  short = [o.split("=", 1)[0].rsplit(".", 1)[-1] + "=" + o.split("=", 1)[1] for o in overrides]
  name = "_".join(short)
  return "".join(c if c.isalnum() or c in "=-_." else "-" for c in name)[:120]


def train_command(config: str | None, out: pathlib.Path, overrides: Sequence[str]) -> list[str]:
  """The `tunix-ppo-ext train` subprocess of one seed (W&B off unless overridden)."""
  command = [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", "train", "--output-dir", str(out)]
  if config is not None:
    command += ["--config", config]
  return [*command, "wandb=disabled", *overrides]


def run_seed(config: str | None, out: pathlib.Path, overrides: Sequence[str], seed: int) -> None:
  """Trains one seed into `out` unless its `summary.json` is there already.

  Raises RuntimeError naming the run directory when the training command fails.
  """
  if (out / "summary.json").is_file():
    return
  command = train_command(config, out, [*overrides, f"seed={seed}"])
  print(f"tunix-ppo-ext sweep: {out}", file=sys.stderr, flush=True)
  done = subprocess.run(command, env=os.environ, stdout=subprocess.PIPE, text=True, check=False)  # noqa: S603 (our own CLI)
  print(done.stdout, end="", file=sys.stderr)  # the seed's summary; stdout is the table's
  if done.returncode != 0:
    raise RuntimeError(f"seed {seed} failed (exit {done.returncode}) in {out}")


def smoothed(values: Sequence[float]) -> np.ndarray:
  """Trailing mean over `max(1, len // 20)` points (a shorter window at the start)."""
  x = np.asarray(values, np.float64)
  window = max(1, len(x) // 20)
  sums = np.cumsum(np.concatenate([[0.0], x]))
  starts = np.maximum(np.arange(1, len(x) + 1) - window, 0)
  return (sums[1:] - sums[starts]) / (np.arange(1, len(x) + 1) - starts)


def seed_result(run_dir: pathlib.Path) -> dict[str, Any]:
  """One seed's summary plus `curve` (return per step), `steps_to_reach` and `peak_drop`."""
  summary = json.loads((run_dir / "summary.json").read_text())
  rows = read_jsonl(run_dir / "metrics.jsonl")
  key = metric_keys.SUMMARY_KEY
  curve = [float(r[key]) for r in rows if r.get(key) is not None]
  smooth = smoothed(curve)
  reached = np.flatnonzero(smooth >= REACHED * summary["max_return"])
  return {
    **summary,
    "curve": curve,
    "steps_to_reach": int(reached[0]) + 1 if reached.size else None,
    "peak_drop": float(smooth.max() - summary["final_return"]) if smooth.size else 0.0,
  }


def variant_row(name: str, results: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """The table row of one variant: statistics over its seeds' results."""
  finals = np.array([r["final_return"] for r in results])
  reached = [r["steps_to_reach"] for r in results if r["steps_to_reach"] is not None]
  return {
    "variant": name,
    "seeds": len(results),
    "max_return": results[0]["max_return"],
    "final_mean": float(finals.mean()),
    "final_std": float(finals.std()),
    "final_min": float(finals.min()),
    "reached": len(reached),
    "steps_to_reach_mean": float(np.mean(reached)) if reached else None,
    "peak_drop_max": float(max(r["peak_drop"] for r in results)),
    "wall_s_mean": float(np.mean([r["wall_s"] for r in results])),
  }


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
  """`table.md`: one line per variant."""
  header = (
    "| variant | seeds | final_return mean | std | min | reached 0.9 of max | batches to 0.9 "
    "(mean) | max drop from peak | wall s (mean) |\n| --- | --- | --- | --- | --- | --- | --- "
    "| --- | --- |\n"
  )
  lines = []
  for r in rows:
    steps = "-" if r["steps_to_reach_mean"] is None else f"{r['steps_to_reach_mean']:.0f}"
    lines.append(
      f"| {r['variant']} | {r['seeds']} | {r['final_mean']:.3f} | {r['final_std']:.3f} | "
      f"{r['final_min']:.3f} | {r['reached']}/{r['seeds']} | {steps} | "
      f"{r['peak_drop_max']:.3f} | {r['wall_s_mean']:.1f} |"
    )
  return header + "\n".join(lines) + "\n"


def sweep(
  seeds: int,
  output_dir: str | pathlib.Path,
  overrides: Sequence[str],
  config: str | None = None,
  jobs: int = 1,
) -> list[dict[str, Any]]:
  """Runs every variant's seeds (skipping finished ones), `jobs` at a time, and writes the
  table and plot. The first failed seed is raised once the running ones have finished."""
  check_integer("--seeds", seeds, low=1)
  check_integer("--jobs", jobs, low=1)
  out = pathlib.Path(output_dir)
  study = variants(overrides)
  _check_configs(config, study)
  runs = [(v, seed, out / v.name / f"seed{seed}") for v in study for seed in range(seeds)]
  with futures.ThreadPoolExecutor(jobs) as pool:
    pending = [pool.submit(run_seed, config, d, v.overrides, seed) for v, seed, d in runs]
    for done in pending:
      done.result()
  results: dict[str, list[dict[str, Any]]] = {}
  for variant, _, run_dir in runs:
    results.setdefault(variant.name, []).append(seed_result(run_dir))
  rows = [variant_row(name, seed_results) for name, seed_results in results.items()]
  write_atomically(out / "table.json", json.dumps(rows, indent=2))
  write_atomically(out / "table.md", markdown_table(rows))
  from tunix_ppo_ext._src.metrics.plot import plot_spread  # noqa: PLC0415 (matplotlib only here)

  plot_spread({n: [r["curve"] for r in rs] for n, rs in results.items()}, out / "curves.png")
  return rows


def _check_configs(config: str | None, study: Sequence[Variant]) -> None:
  """Every variant's config is loaded and validated before the first seed runs."""
  from tunix_ppo_ext._src.run.run_config import load_run_config  # noqa: PLC0415

  for variant in study:
    load_run_config(config, [*variant.overrides, "seed=0"])
