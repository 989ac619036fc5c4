"""`tunix-ppo-ext sweep`: a seed study of one or more configs.

  tunix-ppo-ext sweep --seeds 5 [--jobs J] [--config PATH] [--output-dir DIR] [KEY=VALUE[,...] ...]

Each `KEY=V1,V2` override (commas outside brackets) makes one variant per value; several
such keys make their product (a key given twice, a value listed twice, or two variants that
resolve to the same config are refused, as is `output_dir=`: the sweep's directory is
`--output-dir`). Every variant runs seeds `0 .. N-1` (or the seeds
a `seed=3,4` override lists; `--seeds` is then not used), each a normal
`tunix-ppo-ext train` in `DIR/<variant>/seed<k>`, a subprocess, so a killed sweep resumes
where it stopped: a seed whose `summary.json` exists is not run again. Before any seed
runs, each seed directory with a saved `config.json` is compared with the config the
sweep would train there; one of another config (another `--config` or other fixed
overrides into the same `DIR`) is refused with one line naming the directory and the
differing keys (use another `DIR`, or delete that directory). `<variant>` is the varying
keys' last parts and values (`ppo.kl_ctrl=adaptive` -> `kl_ctrl=adaptive`); one that would
lose characters (other than letters, digits and `=-_.`, or beyond 100) or equal another's
ignoring case ends in `-` and 8 hex digits of its overrides' hash. `J` seeds run at a time
(default 1: one after the other; each process uses every core XLA finds, so on a many-core
machine limit its threads, e.g. `XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`). SIGTERM
or SIGINT is forwarded to the running seeds (each checkpoints and stops as `train` does);
no further seed starts and the sweep exits 130 once they have stopped. A failed seed also
stops further starts; the sweep then fails naming it. Then
`DIR/table.md`, `DIR/table.json` and `DIR/curves.png` (mean training return per variant,
with its min-max band over seeds) are written.

Per variant, over seeds: mean, std (population) and min of `final_return`; the mean, min
and max of the seeds' final success rates (`train/success_rate` averaged over each seed's
last tenth of steps; `-` for an environment without successes); how many seeds
reached 0.9 of the environment's maximum on the smoothed return curve and after how many
batches (rows of that curve; with `ppo.num_iterations=k` a batch is k of `train.steps`),
the mean over the seeds that did; the largest drop from a seed's smoothed peak to its
`final_return`; how many seeds' `metrics.jsonl` fire the Echo Trap rule
(`tunix_ppo_ext._src.metrics.collapse`); mean wall seconds. Smoothing is a trailing mean
over a twentieth of the curve (at least one point).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import ConfigError, check_integer
from tunix_ppo_ext._src.metrics import keys as metric_keys
from tunix_ppo_ext._src.metrics.collapse import EchoTrapRule, echo_trap_step
from tunix_ppo_ext._src.metrics.sinks import read_jsonl, write_atomically
from tunix_ppo_ext._src.metrics.stats import trailing_mean

_UNSET = object()  # a key no default has
REACHED = 0.9  # share of the environment's max return that counts as solved
SUCCESS_KEY = "train/success_rate"  # logged by environments that say what a success is


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


def _split_override(override: str, seen: dict[str, str]) -> tuple[str, list[str]]:
  """`(key, values)` of one override; ValueError for a malformed one, a key given twice, a
  value listed twice or `output_dir` (the sweep's `--output-dir`)."""
  key, sep, raw = override.partition("=")
  if not sep or not key:
    raise ConfigError(f"override {override!r} must look like section.key=value[,value...]")
  if key in seen:
    raise ConfigError(
      f"sweep: key {key!r} is given twice ({seen[key]!r}, {override!r}); give it once, "
      "with every value after one '='"
    )
  seen[key] = override
  if key == "output_dir":  # each seed's `train` gets its own `--output-dir`
    raise ConfigError(
      f"sweep: override {override!r} is not the sweep's directory (each seed trains in "
      "DIR/<variant>/seed<k>); give it as --output-dir DIR"
    )
  values = split_values(raw)
  repeated = sorted({v for v in values if values.count(v) > 1})
  if repeated:
    raise ConfigError(
      f"sweep: override {override!r} lists {repeated[0]!r} more than once; list each value once"
    )
  return key, values


def variants(overrides: Sequence[str]) -> list[Variant]:
  """The product of the overrides' values; a variant is named by its varying keys (a
  short hash of them is added when the name would lose characters or collide)."""
  fixed, varying, seen = [], [], {}
  for override in overrides:
    key, values = _split_override(override, seen)
    if len(values) == 1:
      fixed.append(override)
    else:
      varying.append([f"{key}={v}" for v in values])
  if not varying:
    names = _dir_names([tuple(fixed)]) if fixed else ["default"]
    return [Variant(names[0], tuple(fixed))]
  choices = list(itertools.product(*varying))
  return [
    Variant(name, (*fixed, *choice))
    for name, choice in zip(_dir_names(choices), choices, strict=True)
  ]


def _dir_names(choices: Sequence[Sequence[str]]) -> list[str]:
  """Directory names of the variants' named overrides: `ppo.kl_ctrl=adaptive` ->
  `kl_ctrl=adaptive`; a name that had to drop or map characters (`/` -> `-`, cut at 100),
  or that equals another's ignoring case, ends in `-` and 8 hex digits of its overrides' hash."""
  raw = [
    "_".join(o.split("=", 1)[0].rsplit(".", 1)[-1] + "=" + o.split("=", 1)[1] for o in c)
    for c in choices
  ]
  kept = ["".join(c if c.isalnum() or c in "=-_." else "-" for c in name)[:100] for name in raw]
  folded = [name.casefold() for name in kept]
  names = []
  for choice, name, short in zip(choices, raw, kept, strict=True):
    if short == name and folded.count(short.casefold()) == 1 and short not in (".", ".."):
      names.append(short)
    else:
      digest = hashlib.sha256("\n".join(choice).encode()).hexdigest()[:8]
      names.append(f"{short}-{digest}")
  return names


def split_seeds(seeds: int, overrides: Sequence[str]) -> tuple[list[int], list[str]]:
  """`(seeds, other overrides)`: `0 .. seeds-1`, or the values of a `seed=3,4` override
  (then the study's seeds are those, whatever `--seeds` says)."""
  given = [o for o in overrides if o.partition("=")[0] == "seed"]
  rest = [o for o in overrides if o.partition("=")[0] != "seed"]
  if not given:
    return list(range(check_integer("--seeds", seeds, low=1))), rest
  _, values = _split_override(given[0], {})
  if len(given) > 1:
    raise ConfigError(
      f"sweep: key 'seed' is given twice ({given[0]!r}, {given[1]!r}); give it once"
    )
  if not all(v.strip().isdigit() for v in values):
    raise ConfigError(
      f"sweep: override {given[0]!r} must list seeds as integers >= 0, e.g. seed=3,4"
    )
  numbers = [int(v) for v in values]
  if len(set(numbers)) < len(numbers):
    raise ConfigError(f"sweep: override {given[0]!r} lists a seed twice; list each seed once")
  return numbers, rest


def seed_overrides(overrides: Sequence[str], seed: int) -> list[str]:
  """The `KEY=VALUE` overrides of one seed's `train` (W&B off unless overridden)."""
  return ["wandb=disabled", *overrides, f"seed={seed}"]


def train_command(config: str | None, out: pathlib.Path, overrides: Sequence[str]) -> list[str]:
  """The `tunix-ppo-ext train` subprocess of one seed (`overrides` from `seed_overrides`)."""
  command = [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", "train", "--output-dir", str(out)]
  if config is not None:
    command += ["--config", config]
  return [*command, *overrides]


class Seeds:
  """Runs seeds as `train` subprocesses (each in its own session, so a terminal's Ctrl-C
  reaches it once, through the sweep) and stops them all on SIGTERM/SIGINT.

  `stop(signum)` (the signal handler) forwards the signal to every running child and makes
  `run` start no further seed; a failed seed also stops new starts (the running ones finish).
  """

  def __init__(self, config: str | None):
    self.config = config
    self.children: set[subprocess.Popen[str]] = set()
    self.lock = threading.Lock()
    self.signal: int | None = None
    self.failed = False

  def stop(self, signum: int, frame: Any = None) -> None:
    """Signal handler: forwards `signum` to the running children; no new seed starts."""
    del frame
    self.signal = signum
    for child in list(self.children):
      _send(child, signum)

  def run(self, out: pathlib.Path, overrides: Sequence[str], seed: int) -> None:
    """Trains one seed into `out` unless it finished already (or the sweep is stopping).

    Raises RuntimeError naming the run directory when the training command fails.
    """
    if _finished(out):
      return
    command = train_command(self.config, out, seed_overrides(overrides, seed))
    with self.lock:
      if self.signal is not None or self.failed:
        return
      print(f"tunix-ppo-ext sweep: {out}", file=sys.stderr, flush=True)
      child = subprocess.Popen(
        command, env=os.environ, stdout=subprocess.PIPE, text=True, start_new_session=True
      )
      self.children.add(child)
    if self.signal is not None:  # it arrived while the child started
      _send(child, self.signal)
    stdout, _ = child.communicate()
    with self.lock:
      self.children.discard(child)
    print(stdout, end="", file=sys.stderr)  # the seed's summary; stdout is the table's
    if child.returncode != 0 and self.signal is None:
      self.failed = True
      raise RuntimeError(f"seed {seed} failed (exit {child.returncode}) in {out}")


def _send(child: subprocess.Popen[str], signum: int) -> None:
  with contextlib.suppress(ProcessLookupError):  # it has just exited
    child.send_signal(signum)


def last_tenth(rows: Sequence[dict[str, Any]], key: str) -> float | None:
  """Mean of `key` over the last tenth of the steps that log it (at least one); None where
  no step does (e.g. `train/success_rate` of an environment without successes)."""
  values = [float(r[key]) for r in rows if r.get(key) is not None]
  return float(np.mean(values[-max(1, len(values) // 10) :])) if values else None


def final_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
  """`{key: last_tenth(rows, key)}` for every numeric key the rows log (not `step`)."""
  keys = {k for r in rows for k, v in r.items() if k != "step" and isinstance(v, int | float)}
  return {key: last_tenth(rows, key) for key in sorted(keys)}


def seed_result(run_dir: pathlib.Path) -> dict[str, Any]:
  """One finished seed of a sweep (or any run directory of the main job): its
  `summary.json` plus `curve` (episode return per step), `success_curve` (success rate per
  step; empty without successes), `steps_to_reach` (the first step where the smoothed
  return reaches 0.9 of `max_return`, or None), `final_success` (success over the last
  tenth of the steps, or None), `final_metrics` (every logged key's mean over its last
  tenth), `peak_drop` and `echo_trap_step` (or None).

  Args:
    run_dir: the seed's run directory.

  Returns:
    The summary dict with the keys above added.
  """
  summary = json.loads((run_dir / "summary.json").read_text())
  rows = read_jsonl(run_dir / "metrics.jsonl")
  key = metric_keys.SUMMARY_KEY
  curve = [float(r[key]) for r in rows if r.get(key) is not None]
  smooth = trailing_mean(curve)
  final = final_metrics(rows)
  reached = np.flatnonzero(smooth >= REACHED * summary["max_return"])
  return {
    **summary,
    "curve": curve,
    "steps_to_reach": int(reached[0]) + 1 if reached.size else None,
    "success_curve": [float(r[SUCCESS_KEY]) for r in rows if r.get(SUCCESS_KEY) is not None],
    "final_success": final.get(SUCCESS_KEY),
    "final_metrics": final,
    "peak_drop": float(smooth.max() - summary["final_return"]) if smooth.size else 0.0,
    "echo_trap_step": echo_trap_step(rows, _echo_rule(run_dir), summary["max_return"]),
  }


def _echo_rule(run_dir: pathlib.Path) -> EchoTrapRule:
  """The Echo Trap rule the seed trained with (`metrics.echo_trap` in its `config.json`;
  the default for a run saved before the key existed)."""
  saved = json.loads((run_dir / "config.json").read_text()).get("metrics") or {}
  return EchoTrapRule(**(saved.get("echo_trap") or {}))


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
    **_success_columns([r.get("final_success") for r in results]),
    "echo_trap": sum(r["echo_trap_step"] is not None for r in results),
    "wall_s_mean": float(np.mean([r["wall_s"] for r in results])),
  }


def _success_columns(values: Sequence[float | None]) -> dict[str, float | None]:
  """Mean, min and max of the seeds' final success rates; None where a seed has none."""
  if not values or any(v is None for v in values):
    return dict.fromkeys(("success_mean", "success_min", "success_max"))
  return {
    "success_mean": float(np.mean(values)),
    "success_min": float(min(values)),
    "success_max": float(max(values)),
  }


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
  """`table.md`: one line per variant."""
  header = (
    "| variant | seeds | final_return mean | std | min | final success mean [min, max] | "
    "reached 0.9 of max | batches to 0.9 (mean) | max drop from peak | echo trap | "
    "wall s (mean) |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
  )
  lines = []
  for r in rows:
    steps = "-" if r["steps_to_reach_mean"] is None else f"{r['steps_to_reach_mean']:.0f}"
    success = "-"
    if r.get("success_mean") is not None:
      success = f"{r['success_mean']:.3f} [{r['success_min']:.3f}, {r['success_max']:.3f}]"
    lines.append(
      f"| {r['variant']} | {r['seeds']} | {r['final_mean']:.3f} | {r['final_std']:.3f} | "
      f"{r['final_min']:.3f} | {success} | {r['reached']}/{r['seeds']} | {steps} | "
      f"{r['peak_drop_max']:.3f} | {r['echo_trap']}/{r['seeds']} | {r['wall_s_mean']:.1f} |"
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
  table and plot. The first failed seed is raised once the running ones have finished (no
  further seed starts), after the table of the variants that finished every seed. SIGTERM
  or SIGINT is forwarded to the running seeds and raised as KeyboardInterrupt once they
  have stopped.

  Args:
    seeds: seeds per variant, `0 .. seeds-1` (a `seed=3,4` override lists them instead).
    output_dir: the sweep's directory (`DIR/<variant>/seed<k>` per seed).
    overrides: `KEY=VALUE` overrides; each `KEY=V1,V2` makes one variant per value.
    config: the YAML config file; None: the embedded default.
    jobs: seeds run at a time.

  Returns:
    The table's rows: one per variant whose seeds all finished (`variant_row`).

  Raises:
    ValueError: a bad override, or a seed directory holding a run of another config.
  """
  check_integer("--jobs", jobs, low=1)
  seed_list, overrides = split_seeds(seeds, overrides)
  out = pathlib.Path(output_dir)
  study = variants(overrides)
  runs = [(v, seed, out / v.name / f"seed{seed}") for v in study for seed in seed_list]
  _check_configs(config, study, runs)
  runner = Seeds(config)
  with _forwarding_signals(runner), futures.ThreadPoolExecutor(jobs) as pool:
    pending = [pool.submit(runner.run, d, v.overrides, seed) for v, seed, d in runs]
    errors = [done.exception() for done in pending]
  if runner.signal is not None:
    raise KeyboardInterrupt(f"sweep stopped by signal {runner.signal}")
  failed = {v.name for (v, _, _), error in zip(runs, errors, strict=True) if error is not None}
  rows = write_table(out, [run for run in runs if run[0].name not in failed])
  for error in errors:  # the variants that finished are tabled first
    if error is not None:
      raise error
  return rows


def _finished(run_dir: pathlib.Path) -> bool:
  return (run_dir / "summary.json").is_file()


def write_table(out: pathlib.Path, runs: Sequence[tuple[Variant, int, pathlib.Path]]) -> list:
  """`table.json`, `table.md` and `curves.png` of the variants whose seeds in `runs` all
  finished (a sweep stopped by a failed seed tables the others); returns the rows."""
  results: dict[str, list[dict[str, Any]]] = {}
  for variant, _, run_dir in runs:
    results.setdefault(variant.name, []).append(run_dir)
  finished = {n: dirs for n, dirs in results.items() if all(_finished(d) for d in dirs)}
  seeds = {name: [seed_result(d) for d in dirs] for name, dirs in finished.items()}
  rows = [variant_row(name, seed_results) for name, seed_results in seeds.items()]
  if not rows:
    return rows
  write_atomically(out / "table.json", json.dumps(rows, indent=2))
  write_atomically(out / "table.md", markdown_table(rows))
  from tunix_ppo_ext._src.metrics.plot import plot_spread

  plot_spread({n: [r["curve"] for r in rs] for n, rs in seeds.items()}, out / "curves.png")
  return rows


@contextlib.contextmanager
def _forwarding_signals(runner: Seeds) -> Iterator[None]:
  """SIGTERM and SIGINT go to `runner.stop` (main thread only; elsewhere as they were)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {s: signal.signal(s, runner.stop) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def _check_configs(
  config: str | None,
  study: Sequence[Variant],
  runs: Sequence[tuple[Variant, int, pathlib.Path]],
) -> None:
  """Before the first seed runs: every seed's config loads and validates (each resolved
  once), no two variants resolve to the same config, and every seed directory with a saved
  `config.json` holds a run of the config this sweep would train there (else one ValueError
  naming it)."""
  from tunix_ppo_ext._src.run.run_config import config_dict, load_run_config

  first: dict[str, str] = {}
  for variant, seed, run_dir in runs:
    settings = [*seed_overrides(variant.overrides, seed), f"output_dir={run_dir}"]
    wanted = json.loads(json.dumps(config_dict(load_run_config(config, settings))))
    if seed == runs[0][1]:  # every variant runs the same seeds: compare at the first
      same = json.dumps({k: v for k, v in wanted.items() if k != "output_dir"}, sort_keys=True)
      if same in first:
        raise ConfigError(
          f"sweep: variants {first[same]!r} and {variant.name!r} resolve to the same config; "
          "list each value once"
        )
      first[same] = variant.name
    saved_file = run_dir / "config.json"
    if saved_file.is_file():
      _compare(run_dir, json.loads(saved_file.read_text()), wanted)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out: dict[str, Any] = {}
  for key, value in config.items():
    if isinstance(value, dict) and key != "kwargs":
      out |= _flat(value, f"{prefix}{key}.")
    else:
      out[f"{prefix}{key}"] = value
  return out


@functools.cache
def _default_config() -> dict[str, Any]:
  """Every run-config key's default, flat (read once per process)."""
  from tunix_ppo_ext._src.run.run_config import RunConfig, config_dict

  return _flat(json.loads(json.dumps(config_dict(RunConfig()))))


def _compare(run_dir: pathlib.Path, saved: dict[str, Any], wanted: dict[str, Any]) -> None:
  """ValueError listing the settings in which `run_dir`'s saved config differs. A key the
  saved config predates (added by a later version of this package) counts as the same
  when the wanted value is that key's default."""
  old, new, defaults = _flat(saved), _flat(wanted), _default_config()
  changed = [
    k
    for k in sorted(old.keys() | new.keys())
    if old.get(k) != new.get(k) and not (k not in old and new.get(k) == defaults.get(k, _UNSET))
  ]
  if changed:
    listed = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:3])
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    raise ConfigError(
      f"sweep: {str(run_dir)!r} holds a run of another config ({listed}{more}); use another "
      "--output-dir, or delete that directory to train it again"
    )
