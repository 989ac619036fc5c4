"""`tunix-ppo-ext`: the command line.

  tunix-ppo-ext train [--config PATH] [--output-dir DIR] [KEY=VALUE ...]
  tunix-ppo-ext plan [--config PATH] [--topology v5e:2x4] [KEY=VALUE ...]
  tunix-ppo-ext plot RUN_DIR [--out PATH]
  tunix-ppo-ext sweep --seeds N [--jobs J] [--config PATH] [--output-dir DIR] [KEY=VALUE[,...] ...]
  tunix-ppo-ext export RUN_DIR OUT_DIR
  tunix-ppo-ext plugins
  tunix-ppo-ext tunix-agentic CONFIG.yaml [KEY=VALUE ...]

With no arguments `train` runs the embedded default: a toy tunix Qwen3 (random init)
with the built-in character tokenizer on the embedded multi-turn `memory` environment,
on CPU. It writes `metrics.jsonl`, `summary.json`, TensorBoard events and orbax
checkpoints into the output directory.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence

# Only what parsing needs is imported here (no JAX, tunix or NumPy): `--help` prints at once,
# and each command imports its own modules when it runs.
from tunix_ppo_ext._src.checks import ConfigError, ConfigWarning
from tunix_ppo_ext._src.plugins import registry

EXIT_BAD_INPUT, EXIT_NAN_GUARD, EXIT_INTERRUPTED, EXIT_FAILED = 2, 3, 130, 1
# After a failed or interrupted run, how long the command waits for the threads still
# running (checkpoint writes finishing) before it exits without them.
EXIT_GRACE_S = 30.0
_RESUMABLE = "interrupted; what was checkpointed is kept: run the same command to resume"
INTERRUPTED = {  # the line of a command stopped by Ctrl-C: what was kept
  "train": _RESUMABLE,
  "sweep": _RESUMABLE,
  "plan": "interrupted; nothing was written (plan writes its --json file only once done)",
  "tunix-agentic": "interrupted; tunix's trainers keep what they checkpointed",
}


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="tunix-ppo-ext", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--debug", action="store_true", help="show tracebacks of failures")
  commands = parser.add_subparsers(dest="command", required=True)
  train_parser = commands.add_parser("train", help="train on the configured environment")
  train_parser.add_argument("--config", help="YAML run config (default: the embedded default)")
  train_parser.add_argument("--output-dir", help="where metrics, summary and checkpoints go")
  train_parser.add_argument("--debug", action="store_true", help="show tracebacks of failures")
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
    help="dotted overrides, e.g. ppo.entropy_coef=0.01 train.steps=50 (before or after options)",
  )
  plan_parser = commands.add_parser("plan", help="per-chip memory of a config on a TPU topology")
  plan_parser.add_argument("--config", help="YAML run config (default: the embedded default)")
  plan_parser.add_argument("--topology", default="v5e:2x4", help="e.g. v5e:2x4, v4:2x2x1")
  plan_parser.add_argument(
    "--compiler", default="auto", help="auto (TPU with libtpu, else CPU), tpu or cpu"
  )
  plan_parser.add_argument(
    "--pieces", help="comma-separated pieces to compile (default: all the run builds)"
  )
  plan_parser.add_argument("--json", help="also write the figures to this JSON file")
  plan_parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides")
  plot_parser = commands.add_parser("plot", help="draw a run's main curves into RUN_DIR")
  plot_parser.add_argument("run_dir", metavar="RUN_DIR", help="a train command's output dir")
  plot_parser.add_argument(
    "--out",
    metavar="PATH",
    help="write the PNG here, not into RUN_DIR (a directory: PATH/curves.png)",
  )
  export_parser = commands.add_parser(
    "export", help="write a run's trained policy as a Hugging Face checkpoint into OUT_DIR"
  )
  export_parser.add_argument("run_dir", metavar="RUN_DIR", help="a train command's output dir")
  export_parser.add_argument("out_dir", metavar="OUT_DIR", help="a new or empty directory")
  commands.add_parser("plugins", help="list the plugins of every group and whether they load")
  _add_sweep_parser(commands)
  _add_tunix_agentic_parser(commands)
  return parser


def _add_tunix_agentic_parser(commands) -> None:
  agentic = commands.add_parser(
    "tunix-agentic",
    help="tunix main's PPO pipeline (tunix.cli.ppo_main) with training_mode: agentic_ppo "
    "trained by AgenticPpoLearner (tunix main only)",
  )
  agentic.add_argument("config", metavar="CONFIG", help="tunix's pipeline YAML config")
  agentic.add_argument(
    "overrides",
    nargs="*",
    metavar="KEY=VALUE",
    help="tunix's overrides, e.g. agentic_ppo_config.gae_lambda=0.9",
  )


def _add_sweep_parser(commands) -> None:
  sweep = commands.add_parser("sweep", help="train N seeds of one or more configs; a table")
  sweep.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per variant (5)")
  sweep.add_argument("--jobs", type=int, default=1, help="seeds trained at a time (1)")
  sweep.add_argument("--config", help="YAML run config (default: the embedded default)")
  sweep.add_argument("--output-dir", default="runs/sweep", help="where runs and table go")
  sweep.add_argument("overrides", nargs="*", metavar="KEY=VALUE[,VALUE...]")


def main(argv: Sequence[str] | None = None) -> int:
  """The `tunix-ppo-ext` command. Exit codes: 0 done, 2 bad input, 3 the NaN guard stopped
  the run, 130 interrupted (Ctrl-C), 1 any other failure; each failure is one line on
  stderr (with `--debug`, the traceback too).

  Args:
    argv: the command-line arguments after the program name; None: `sys.argv[1:]`.

  Returns:
    The exit code.
  """
  return _main(argv, own_process=False)


def _main(argv: Sequence[str] | None, own_process: bool) -> int:
  """`main`; `own_process`: the command is the process (the console script), whose heap
  a job may freeze (`_freeze_imported_heap`)."""
  parser = _parser()
  args, extra = parser.parse_known_args(argv)
  if args.command in ("train", "plan", "sweep", "tunix-agentic"):  # KEY=VALUE may follow
    misplaced = [a for a in extra if a.startswith("-") or "=" not in a]
    if misplaced:
      parser.error(f"unrecognized arguments: {' '.join(misplaced)}")
  elif extra:
    parser.error(f"unrecognized arguments: {' '.join(extra)}")
  if args.command == "plugins":
    return _plugins_command()
  if args.command == "plot":
    return _plot_command(args.run_dir, args.out)
  if args.command == "export":
    return _export_command(args.run_dir, args.out_dir, args.debug)
  return _job_command(args, [*args.overrides, *extra], own_process)


def _job_command(args: argparse.Namespace, overrides: list[str], own_process: bool) -> int:
  """`train`, `plan` or `sweep`, each failure one line with its exit code (see `main`)."""
  try:
    with warnings.catch_warnings():
      warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
      return _run_job(args, overrides, own_process)
  except KeyboardInterrupt as err:  # also while JAX and tunix load (seconds): the same line
    if args.debug:
      traceback.print_exc()
    _error(INTERRUPTED[args.command])
    if not args.debug:
      _free_quietly(err)
    return EXIT_INTERRUPTED
  except (ConfigError, registry.PluginError) as err:  # bad input, named: the user can fix it
    _error(str(err), args.debug)
    return EXIT_BAD_INPUT
  except _raised_by("optim.guards", "NonFiniteTrainingError") as err:  # after a checkpoint
    _error(str(err), args.debug)
    return EXIT_NAN_GUARD
  except _raised_by("tunix.cluster.disk_space", "OutOfSpaceError") as err:  # before a save
    _error(str(err), args.debug)
    return EXIT_FAILED
  except Exception as err:
    disk_space = sys.modules.get(f"{_SRC}.tunix.cluster.disk_space")
    full = disk_space.write_failure(err) if disk_space else None  # a full disk unforeseen
    line = full or f"{type(err).__name__}: {err} (rerun with --debug for the traceback)"
    _error(line, args.debug)
    if full and not args.debug:  # orbax's failed write would complain after the line
      _quiet_after_write_failure(err, own_process)
    return EXIT_FAILED


_SRC = "tunix_ppo_ext._src"


class _NeverRaised(Exception):
  """Stands for an exception class whose module a job never imported: nothing raised it."""


def _raised_by(module: str, name: str) -> type[Exception]:
  """The exception class `name` of `tunix_ppo_ext._src.<module>` when the job imported that
  module, else `_NeverRaised`: a config refused before JAX loaded imports none of them."""
  loaded = sys.modules.get(f"{_SRC}.{module}")
  return getattr(loaded, name) if loaded is not None else _NeverRaised


def _load_jax(own_process: bool) -> None:
  """Loads JAX and tunix (once a job is to run: parsing and a config's own checks need
  neither), refuses JAX's 64-bit mode (tunix's sampler fails in it) and, in the console
  script's own process, freezes the imported heap (`_freeze_imported_heap`)."""
  from tunix_ppo_ext._src.run.job import check_jax_precision

  if own_process:
    _freeze_imported_heap()
  check_jax_precision()  # before anything is made


def _free_quietly(err: BaseException) -> None:
  """Frees now what the interrupted calls left half-made, their complaints muted: the
  locals of the frames `err` (and the errors it chains) passed through. Ctrl-C inside
  orbax's save left an event loop half-built and coroutines never awaited, whose
  `__del__` traceback and RuntimeWarnings followed the interrupted line (2026-12-07)."""
  hook = sys.unraisablehook
  sys.unraisablehook = lambda unraisable: None
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)
      seen: BaseException | None = err
      while seen is not None:
        traceback.clear_frames(seen.__traceback__)
        seen = seen.__cause__ or seen.__context__
      gc.collect()
  finally:
    sys.unraisablehook = hook


def _quiet_after_write_failure(err: BaseException, own_process: bool) -> None:
  """Keeps the one error line of a write the filesystem refused the last: orbax's writes,
  stopped by the exit, would log after it, and the coroutines of the failed save, never
  awaited, warned as they were freed ("coroutine ... was never awaited", on CI after the
  line, 2026-12-07). Frees what `err`'s frames hold now and, when the command is the
  process (it exits next), mutes those warnings until it does: the save already failed,
  and the line names it."""
  for name in ("absl", "asyncio"):
    logging.getLogger(name).setLevel(logging.CRITICAL + 1)
  _free_quietly(err)
  if own_process:
    warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)


def _run_job(args: argparse.Namespace, overrides: list[str], own_process: bool) -> int:
  """The job command `args.command` names (`train` reads and checks its config first)."""
  if args.command == "train":
    return _train_command(args, overrides, own_process)
  _load_jax(own_process)
  if args.command == "plan":
    return _plan_command(args, overrides)
  if args.command == "sweep":
    return _sweep_command(args, overrides)
  if args.command == "tunix-agentic":
    return _tunix_agentic_command(args, overrides)
  raise AssertionError(f"unknown job command {args.command!r}")


def _show_warning(show: Callable[..., None], message, category, *args, **kwargs) -> None:
  """`warnings.showwarning` with a `ConfigWarning` as one line, `tunix-ppo-ext: warning:`
  (not Python's two, the file and the source line); any other warning as `show` shows it."""
  if issubclass(category, ConfigWarning):
    print(f"tunix-ppo-ext: warning: {message}", file=sys.stderr)
  else:
    show(message, category, *args, **kwargs)


def _freeze_imported_heap() -> None:
  """Moves every object alive now (JAX's, tunix's and the other imported modules', which
  live as long as the process) out of the garbage collector's sight (`gc.freeze`).

  tunix collects garbage in full where it builds a cluster or a learner and around weight
  syncs (`gc.collect()` in `RLCluster` and `show_hbm_usage`); each full collection walked
  the whole imported heap. Frozen, they walk only what the run made: a toy run
  (`configs/smoke.yaml`, timed by `gc.callbacks`) spent 0.99 s in full collections
  before, 0.47 s after. Only the
  console script's process is frozen: a Python caller's heap is its own.
  """
  gc.freeze()


def _error(message: str, debug: bool = False) -> None:
  sinks = sys.modules.get(f"{_SRC}.metrics.sinks")  # its progress bars, if a job made any
  if sinks is not None:
    sinks.ProgressBackend.close_all()
  if debug:
    traceback.print_exc()
  first = message.strip().splitlines()[0] if message.strip() else "failed"
  print(f"tunix-ppo-ext: error: {first}", file=sys.stderr)


def _train_command(args: argparse.Namespace, overrides: list[str], own_process: bool) -> int:
  """`tunix-ppo-ext train`: reads the config (a bad key fails before JAX loads), resolves it,
  joins the other hosts, trains (`job`)."""
  from tunix_ppo_ext._src.config.loader import read_run_config

  if args.output_dir is not None:
    overrides.append(string_override("output_dir", args.output_dir))
  run = read_run_config(args.config, overrides)
  _load_jax(own_process)  # JAX and tunix load here, when a checked config is to run
  from tunix_ppo_ext._src.metrics import sinks
  from tunix_ppo_ext._src.run import distributed, job
  from tunix_ppo_ext._src.run.compile_cache import use_compile_cache
  from tunix_ppo_ext._src.run.run_config import resolve
  from tunix_ppo_ext._src.tunix.cluster import disk_space, mesh
  from tunix_ppo_ext._src.tunix.cluster.mesh import describe_meshes

  cache, uncached = use_compile_cache()  # before anything compiles
  resolved = resolve(run)  # the one resolution of this command
  run = resolved.run
  if not args.debug:  # a refused write is this command's one error line
    disk_space.quiet_write_failures()
  distributed.initialize(distributed.multi_host_reason(args.multi_host, os.environ), os.environ)
  if job.finished_run(resolved) is not None:  # already complete: its one line, nothing opened
    return 0
  meshes = job.run_meshes(run)  # device counts are known only now (after joining other hosts)
  for line in describe_meshes(meshes).splitlines():
    print(f"tunix-ppo-ext: {line}", file=sys.stderr)
  if wandb_off := run.wandb != "disabled" and sinks.wandb_mode_problem():
    print(f"tunix-ppo-ext: warning: W&B is off for this run: {wandb_off}", file=sys.stderr)
  elif run.wandb == "online" and not sinks.has_wandb_key():
    print("tunix-ppo-ext: W&B has no API key here: the run is written offline", file=sys.stderr)
  mesh.quiet_cpu_notices()  # tunix's TPU notices, on a CPU-only run
  kept = f"; kept in {cache} for the next run" if cache else ""
  kept = f"; not kept: {uncached}" if uncached else kept
  print(
    "tunix-ppo-ext: building the models; the first step compiles the rollout and the updates "
    f"(minutes for a real model on a CPU{kept}) while the bar says compiling",
    file=sys.stderr,
  )
  with warnings.catch_warnings():
    if wandb_off:  # said above, before the bar: not again as the sink's warning
      warnings.filterwarnings("ignore", "W&B disabled for this run: WANDB_MODE=")
    job.train(resolved, meshes)  # the meshes built once, here
  return 0


def _plan_command(args: argparse.Namespace, overrides: list[str]) -> int:
  """`tunix-ppo-ext plan`: compiles the config's step for a TPU topology, prints memory."""
  from tunix_ppo_ext._src.metrics import sinks
  from tunix_ppo_ext._src.run import plan
  from tunix_ppo_ext._src.run.run_config import load_resolved

  resolved = load_resolved(args.config, overrides, need_files=False)
  pieces = [p for p in (args.pieces or "").split(",") if p]
  result = plan.plan(resolved, args.topology, pieces, args.compiler)
  print(plan.format_plan(result, args.config), flush=True)  # before a `--json /dev/stdout`
  if args.json:
    sinks.write_atomically(args.json, json.dumps(result.to_json(), indent=2))
  return 0


def string_override(key: str, value: str) -> str:
  """`KEY=VALUE` with VALUE as a YAML single-quoted string: an option's text stays text
  (`--output-dir 123`, `yes`, `~` or `""` read as a number, a flag or null otherwise)."""
  return f"{key}='{value.replace(chr(39), chr(39) * 2)}'"


def _sweep_command(args: argparse.Namespace, overrides: list[str]) -> int:
  """`tunix-ppo-ext sweep`: prints the table (`tunix_ppo_ext._src.run.sweep`)."""
  from tunix_ppo_ext._src.run import sweep

  if not args.output_dir:  # '' would be the current directory
    raise ConfigError("--output-dir is empty: name the directory the sweep's runs go to")
  rows = sweep.sweep(args.seeds, args.output_dir, overrides, args.config, args.jobs)
  print(sweep.markdown_table(rows), end="")
  return 0


def _tunix_agentic_command(args: argparse.Namespace, overrides: list[str]) -> int:
  """`tunix-ppo-ext tunix-agentic`: tunix main's PPO pipeline, `agentic_ppo` trained by
  `AgenticPpoLearner` (`learner.agentic_ppo_pipeline`); one line on tunix 0.1.7."""
  from tunix_ppo_ext._src.tunix import compat

  try:
    compat.needs_main("tunix-ppo-ext tunix-agentic")
  except RuntimeError as err:  # the tunix installed: the user's to change
    raise ConfigError(str(err)) from None
  from tunix_ppo_ext._src.tunix.learner import agentic_ppo_pipeline

  agentic_ppo_pipeline.run([args.config, *overrides])
  return 0


def _plot_command(run_dir: str, out: str | None) -> int:
  """`tunix-ppo-ext plot RUN_DIR [--out PATH]`: writes and prints the path of
  `RUN_DIR/curves.png` (or of `--out`'s); a path it cannot write is one line (exit 2)
  that points at `--out`."""
  from tunix_ppo_ext._src.metrics.plot import UnwritablePlot, plot_run

  try:
    print(plot_run(run_dir, out=out))
  except ValueError as err:
    hint = "; pass --out PATH to write it elsewhere" if isinstance(err, UnwritablePlot) else ""
    print(f"tunix-ppo-ext: error: {err}{hint}", file=sys.stderr)
    return 2
  return 0


def _export_command(run_dir: str, out_dir: str, debug: bool) -> int:
  """`tunix-ppo-ext export RUN_DIR OUT_DIR`: prints OUT_DIR once written (`export_cmd`)."""
  from tunix_ppo_ext._src.run.export_cmd import export_run

  try:
    print(export_run(run_dir, out_dir))
  except KeyboardInterrupt:
    _error("interrupted; nothing was left in OUT_DIR: run the same command again", debug)
    return EXIT_INTERRUPTED
  except ValueError as err:
    _error(str(err), debug)
    return EXIT_BAD_INPUT
  return 0


def _plugins_command() -> int:
  """`tunix-ppo-ext plugins`: every entry-point group with name, distribution, version, status."""
  print(registry.format_report(registry.report()))
  return 0


def _other_threads() -> list[threading.Thread]:
  """The live threads besides this one that the interpreter's exit waits for: the
  non-daemon ones, and every thread-pool worker, daemon or not (`concurrent.futures` joins
  them all at exit; a worker started from a daemon thread, as tunix's agentic loop starts
  its executor's, is a daemon). Without that private name (another Python): the first."""
  workers = set(_pool_workers())
  me = threading.current_thread()
  return [
    t
    for t in threading.enumerate()
    if t is not me and t.is_alive() and (not t.daemon or t in workers)
  ]


def console_main() -> None:
  """The `tunix-ppo-ext` console script: `main()`, then exit with its status.

  A run stopped by Ctrl-C or an error can leave a worker thread waiting for the main
  thread that will never come back to it (one of tunix's or orbax's), and the
  interpreter would wait for it for ever: threads still alive `EXIT_GRACE_S` seconds
  after a non-zero status are left behind (`os._exit`). Checkpoints already committed
  are kept; a save still being written is one orbax never committed, so a rerun resumes
  from the one before. The threads that are no pool's workers are waited for first: a
  save's thread that Ctrl-C left running (begun inside orbax's save, before its manager
  knew of it) still submits work to a pool (`asyncio.to_thread`), which the interpreter's
  shutdown refuses ("cannot schedule new futures after shutdown" tracebacks, 2026-12-07).
  Then idle thread-pool workers (orbax's executors, never shut down) are woken to exit,
  as the interpreter's own exit wakes them (`_wake_idle_workers`): the grace waited for
  them in full, 30 s after every failed run.

  Ctrl-C after the command returned is ignored: what it could stop is the exit itself.

  A reader that closes the pipe early (`tunix-ppo-ext plugins | head -1`) ends the command
  quietly with status 1, not a `BrokenPipeError` traceback.
  """
  try:
    code = _main(None, own_process=True)
  except BrokenPipeError:
    _quiet_stdout()
    code = EXIT_FAILED
  # the command is over: a Ctrl-C now would only break the exit (a traceback from an exit
  # handler, jax's `clear_backends`, or from the wait for threads below, bounded anyway)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if code != 0:
    sys.stdout.flush()
    sys.stderr.flush()
    deadline = time.monotonic() + EXIT_GRACE_S
    workers = set(_pool_workers())  # first the others: a save's thread may still need a pool
    _join_all([t for t in _other_threads() if t not in workers], deadline)
    _wake_idle_workers()
    _join_all(_other_threads(), deadline)
    if any(thread.is_alive() for thread in _other_threads()):
      os._exit(code)
  sys.exit(code)


def _join_all(threads: list[threading.Thread], deadline: float) -> None:
  """Waits for each of `threads` until `deadline` (`time.monotonic()`) at the latest."""
  for thread in threads:
    _join_quietly(thread, max(0.0, deadline - time.monotonic()))


def _quiet_stdout() -> None:
  """Points stdout at the null device: the interpreter's last flush of what could not be
  written to a closed pipe would raise again (Python's documented recipe for SIGPIPE)."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stdout.fileno())
  os.close(devnull)


def _wake_idle_workers() -> None:
  """What the interpreter's exit does first (`concurrent.futures.thread._python_exit`,
  run before it joins the other threads): marks thread pools shut down and wakes every
  worker, so an idle one exits at once and a busy one after its current task. Without
  those private names (another Python), nothing: the grace still bounds the wait."""
  from concurrent.futures import thread as futures_thread

  lock = getattr(futures_thread, "_global_shutdown_lock", None)
  if lock is None or not hasattr(futures_thread, "_shutdown"):
    return
  with lock:
    futures_thread._shutdown = True
  for work_queue in _pool_workers().values():
    work_queue.put(None)


def _pool_workers() -> dict[threading.Thread, queue.SimpleQueue]:
  """Every live `concurrent.futures` thread-pool worker and its work queue: the private
  registry the interpreter's exit reads (`concurrent.futures.thread._threads_queues`, a
  weak mapping). Without it (another Python): none."""
  from concurrent.futures import thread as futures_thread

  return dict(getattr(futures_thread, "_threads_queues", {}))


def _join_quietly(thread: threading.Thread, timeout: float) -> None:
  """Waits for `thread` after the run failed. orbax's save futures re-raise their thread's
  error from `join` (another role's save refused by the same full disk, say): a refused
  write is the failure the error line already named; any other is one more line."""
  from tunix_ppo_ext._src.tunix.cluster.disk_space import write_failure

  try:
    thread.join(timeout)
  except Exception as err:
    if write_failure(err) is None:
      _error(f"{thread.name} also failed: {str(err) or type(err).__name__}")


if __name__ == "__main__":
  console_main()
