"""`tunix-ppo-ext`: the command line.

  tunix-ppo-ext train [--config PATH] [--output-dir DIR] [KEY=VALUE ...]
  tunix-ppo-ext plot RUN_DIR
  tunix-ppo-ext plugins

With no arguments `train` runs the embedded default: a toy tunix Qwen3 (random init)
with the built-in character tokenizer on the embedded multi-turn `memory` environment,
on CPU. It writes `metrics.jsonl`, `summary.json`, TensorBoard events and orbax
checkpoints into the output directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tunix_ppo_ext.app import distributed
from tunix_ppo_ext.app.job import run_meshes, train
from tunix_ppo_ext.app.run_config import load_run_config
from tunix_ppo_ext.plugins import registry as plugin_registry
from tunix_ppo_ext.tunix.guards import NonFiniteTrainingError
from tunix_ppo_ext.tunix.mesh import describe_meshes


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="tunix-ppo-ext", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  commands = parser.add_subparsers(dest="command", required=True)
  train_parser = commands.add_parser("train", help="train on the configured environment")
  train_parser.add_argument("--config", help="YAML run config (default: the embedded default)")
  train_parser.add_argument("--output-dir", help="where metrics, summary and checkpoints go")
  train_parser.add_argument(
    "--multi-host",
    action=argparse.BooleanOptionalAction,
    default=None,
    help="call jax.distributed.initialize() (default: when JAX_COORDINATOR_ADDRESS is set or "
    "TPU_WORKER_HOSTNAMES lists several hosts); run the same command on every host",
  )
  train_parser.add_argument(
    "overrides",
    nargs="*",
    metavar="KEY=VALUE",
    help="dotted overrides, e.g. ppo.entropy_coef=0.01 train.steps=50",
  )
  plot_parser = commands.add_parser("plot", help="draw a run's main curves into RUN_DIR")
  plot_parser.add_argument("run_dir", metavar="RUN_DIR", help="a train command's output dir")
  commands.add_parser("plugins", help="list the plugins of every group and whether they load")
  args = parser.parse_args(argv)
  if args.command == "plugins":
    return _plugins_command()
  if args.command == "plot":
    return _plot_command(args.run_dir)
  overrides = list(args.overrides)
  if args.output_dir is not None:
    overrides.append(f"output_dir={args.output_dir}")
  try:
    run = load_run_config(args.config, overrides)
  except ValueError as err:
    print(f"tunix-ppo-ext: error: {err}", file=sys.stderr)
    return 2
  try:
    distributed.initialize(distributed.multi_host_reason(args.multi_host, os.environ), os.environ)
    meshes = run_meshes(run)  # device counts are known only now (after joining other hosts)
  except ValueError as err:
    print(f"tunix-ppo-ext: error: {err}", file=sys.stderr)
    return 2
  for line in describe_meshes(meshes).splitlines():
    print(f"tunix-ppo-ext: {line}", file=sys.stderr)
  try:
    train(run)
  except NonFiniteTrainingError as err:  # the NaN guard stopped the run after a checkpoint
    print(f"tunix-ppo-ext: error: {err}", file=sys.stderr)
    return 3
  return 0


def _plot_command(run_dir: str) -> int:
  """`tunix-ppo-ext plot RUN_DIR`: writes and prints the path of `RUN_DIR/curves.png`."""
  from tunix_ppo_ext.metrics.plot import plot_run  # noqa: PLC0415 (matplotlib only here)

  try:
    print(plot_run(run_dir))
  except ValueError as err:
    print(f"tunix-ppo-ext: error: {err}", file=sys.stderr)
    return 2
  return 0


def _plugins_command() -> int:
  """`tunix-ppo-ext plugins`: every entry-point group with name, distribution, version, status."""
  print(plugin_registry.format_report(plugin_registry.report()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
