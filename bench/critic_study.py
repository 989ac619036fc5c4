"""How each seed of a critic-study sweep ended: the reply it settled on, if one.

Reads the seed directories `tunix-ppo-ext sweep` wrote (`DIR/<variant>/seed<k>/`) and prints
a markdown table per DIR: per seed (`tunix_ppo_ext.jobs.seed_result`), the final success
rate, episode return, entropy per token and invalid-reply share (each the mean over the
seed's last tenth of steps), the step the Echo Trap rule fired at, and the verdict:
`fixed reply` when the final entropy is below `--fixed` nats per token (one reply, the same
at every turn, whatever the observation), `fixed invalid reply` when that reply is not a
move (invalid share above 0.9), else `still sampling`. Then per variant: how many seeds
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
import functools
import pathlib
from collections.abc import Sequence
from typing import Any

from tunix_ppo_ext.jobs import seed_result
from tunix_ppo_ext.metrics import plot_spread, trailing_mean

ENTROPY = "actor/entropy"
INVALID = "train/env/invalid_action"
RETURN = "train/episode_return/mean"
# longest first: a variant's name runs its keys together (`turn_gae_critic_lambda=1.0_...`)
ESTIMATORS = ("reinforce_plus_plus", "turn_gae", "grpo", "rloo", "gae")


def verdict(entropy: float, invalid: float, fixed: float) -> str:
  if entropy >= fixed:
    return "still sampling"
  return "fixed invalid reply" if invalid > 0.9 else "fixed reply"


@functools.cache
def _result(run_dir: pathlib.Path) -> dict[str, Any]:
  """`seed_result`, read once per seed for the table and the plot."""
  return seed_result(run_dir)


def seed_line(run_dir: pathlib.Path, fixed: float) -> tuple[str, str]:
  """`(verdict, markdown row)` of one finished seed."""
  result = _result(run_dir)
  final = result["final_metrics"]
  entropy, invalid = final.get(ENTROPY, 0.0), final.get(INVALID, 0.0)
  ended = verdict(entropy, invalid, fixed)
  trap = result["echo_trap_step"]
  row = (
    f"| {short_name(run_dir.parent.name)} | {run_dir.name} | {_number(result['final_success'])} | "
    f"{final[RETURN]:.3f} | {entropy:.4f} | {invalid:.3f} | "
    f"{'-' if trap is None else trap} | {ended} |"
  )
  return ended, row


def _number(value: float | None) -> str:
  """`value` to 3 places; `-` for an environment that reports no success rate."""
  return "-" if value is None else f"{value:.3f}"


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
  value = variant.rsplit("advantage_estimator=", 1)[-1]
  return next((name for name in ESTIMATORS if value.startswith(name)), value.split("_", 1)[0])


def success_curves(sweep_dirs: Sequence[pathlib.Path]) -> dict[str, list[list[float]]]:
  """`{variant: [smoothed success per step, one list per finished seed]}`."""
  curves: dict[str, list[list[float]]] = collections.defaultdict(list)
  for sweep_dir in sweep_dirs:
    variants = {p.parent.name for p in sweep_dir.glob("*/seed*")}
    for run_dir in sorted(sweep_dir.glob("*/seed*")):
      if (run_dir / "summary.json").is_file():
        success = _result(run_dir)["success_curve"]
        # one variant in a sweep: named by its directory (each ablation its own sweep)
        label = sweep_dir.name if len(variants) == 1 else short_name(run_dir.parent.name)
        curves[label].append(list(trailing_mean(success)))
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
