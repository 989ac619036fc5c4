"""How each seed of a critic-study sweep ended: the reply it settled on, if one.

Reads the seed directories `tunix-ppo-ext sweep` wrote (`DIR/<variant>/seed<k>/`) and prints
a markdown table per DIR: per seed, the final success rate and episode return (the sweep's
`final_success` rule: the mean over the last tenth of the steps), the final entropy per token
and invalid-reply share (the same last tenth), the step the Echo Trap rule fired at, and the
verdict: `fixed reply` when the final entropy is below `--fixed` nats per token (one reply,
the same at every turn, whatever the observation), `fixed invalid reply` when that reply is
not a move (invalid share above 0.9), else `still sampling`. Then per variant: how many seeds
ended each way.

  python bench/critic_study.py runs/sweeps/critic_frozenlake_slippery [DIR ...] [--fixed 0.05]
      [--plot OUT.png]

`--plot` draws every variant's success rate per batch (each seed's trailing mean over a
twentieth of its steps, as the sweep smooths returns; the mean over seeds with the min-max
band), the variants of every DIR in one figure, named by their estimator (`StarPO-S` for
the std filter + critic + clip-higher variant).
"""

from __future__ import annotations

import argparse
import collections
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from tunix_ppo_ext._src.metrics.plot import plot_spread
from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.run import sweep

ENTROPY = "actor/entropy"
INVALID = "train/env/invalid_action"
RETURN = "train/episode_return/mean"


def last_tenth(rows: Sequence[dict[str, Any]], key: str) -> float | None:
  """Mean of `key` over the last tenth of the steps that log it (at least one)."""
  values = [float(r[key]) for r in rows if r.get(key) is not None]
  return float(np.mean(values[-max(1, len(values) // 10) :])) if values else None


def verdict(entropy: float, invalid: float, fixed: float) -> str:
  if entropy >= fixed:
    return "still sampling"
  return "fixed invalid reply" if invalid > 0.9 else "fixed reply"


def seed_line(run_dir: pathlib.Path, fixed: float) -> tuple[str, str]:
  """`(verdict, markdown row)` of one finished seed."""
  rows = read_jsonl(run_dir / "metrics.jsonl")
  result = sweep.seed_result(run_dir)
  entropy, invalid = last_tenth(rows, ENTROPY) or 0.0, last_tenth(rows, INVALID) or 0.0
  ended = verdict(entropy, invalid, fixed)
  trap = result["echo_trap_step"]
  row = (
    f"| {short_name(run_dir.parent.name)} | {run_dir.name} | {result['final_success']:.3f} | "
    f"{last_tenth(rows, RETURN):.3f} | {entropy:.4f} | {invalid:.3f} | "
    f"{'-' if trap is None else trap} | {ended} |"
  )
  return ended, row


def report(sweep_dir: pathlib.Path, fixed: float) -> str:
  header = (
    f"### {sweep_dir.name}\n\n| variant | seed | final success | final return | entropy | "
    "invalid share | echo trap at step | ended |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
  )
  lines, counts = [], collections.defaultdict(collections.Counter)
  for run_dir in sorted(sweep_dir.glob("*/seed*")):
    if (run_dir / "summary.json").is_file():
      ended, row = seed_line(run_dir, fixed)
      lines.append(row)
      counts[short_name(run_dir.parent.name)][ended] += 1
  tally = "\n".join(
    f"- {variant}: " + ", ".join(f"{n} {what}" for what, n in sorted(c.items()))
    for variant, c in counts.items()
  )
  return header + "\n".join(lines) + "\n\n" + tally + "\n"


def short_name(variant: str) -> str:
  """`advantage_estimator=gae` -> `gae`; the std-filter variant -> `StarPO-S`."""
  if "keep_ratio" in variant:
    return "StarPO-S"
  return variant.rsplit("advantage_estimator=", 1)[-1].split("_", 1)[0]


def success_curves(sweep_dirs: Sequence[pathlib.Path]) -> dict[str, list[list[float]]]:
  """`{variant: [smoothed success per step, one list per finished seed]}`."""
  curves: dict[str, list[list[float]]] = collections.defaultdict(list)
  for sweep_dir in sweep_dirs:
    for run_dir in sorted(sweep_dir.glob("*/seed*")):
      if (run_dir / "summary.json").is_file():
        rows = read_jsonl(run_dir / "metrics.jsonl")
        values = [float(r[sweep.SUCCESS_KEY]) for r in rows if r.get(sweep.SUCCESS_KEY) is not None]
        curves[short_name(run_dir.parent.name)].append(list(sweep.smoothed(values)))
  return dict(curves)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("sweeps", nargs="+", type=pathlib.Path)
  parser.add_argument("--fixed", type=float, default=0.05, help="entropy below: one reply")
  parser.add_argument("--plot", type=pathlib.Path, help="success-rate curves PNG")
  args = parser.parse_args(argv)
  for sweep_dir in args.sweeps:
    print(report(sweep_dir, args.fixed))
  if args.plot is not None:
    plot_spread(success_curves(args.sweeps), args.plot, ylabel="success rate (smoothed)")


if __name__ == "__main__":
  main()
