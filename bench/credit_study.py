"""Credit across turns with the power to decide: GRPO, PPO with a critic and GiGPO on
SmolLM2-135M-Instruct, `guess` 1..32 with 5 turns and the information-gain reward 0.2,
8 seeds an arm (issue 70).

Arms (each the same 48 actor updates of 8 episodes; `bench/real_model.py` runs every
seed, `--baseline-steps 0`):
- `grpo`: `configs/smollm2.yaml` (2 secrets x 4 samples a batch, std-normalized GRPO);
- `ppo`: `configs/smollm2_ppo.yaml` with the actor's lambda 0.5 and 8 distinct secrets
  x 1 (no group baseline knows the secret): 8 critic-only steps + 48 updates;
- `gigpo`: `configs/smollm2.yaml` with `ppo.advantage_estimator=gigpo` (2 x 4; the step
  groups are the episodes of a group that reached the same allowed interval).

  python bench/credit_study.py run [--seeds 8] [--arms grpo ppo gigpo] [--out DIR] [--rerun]
  python bench/credit_study.py run --arms ppo_shadows --seeds 1
  python bench/credit_study.py report [--out DIR]

`ppo_shadows`, not one of the study's arms: PPO's arm with 2 secrets x 4 a batch, 8
critic-only steps + 24 updates, with `metrics.shadow_estimators=[grpo,gigpo]`, so that on
each of its batches the learned critic's policy gradient, GRPO's and GiGPO's are measured
on the same episodes (`shadow/<name>/grad_cosine`, the agreement of the batch's halves).

`run` trains one seed of one arm at a time, always the arm with the fewest finished seeds
(ties in the order given), so an interrupted study has balanced arms; resumable: a rerun
skips every finished seed and tunix resumes an unfinished one from its checkpoint (every
8 steps); a SIGTERM stops the seed's training process with the study's. A fresh clone's
committed `DIR/<arm>/results.json` counts its seeds as finished:
`run --rerun` (or `BENCH_RERUN=1`) runs them again, each seed without its own
`seed<N>/result.json` in this tree. An arm whose estimator is not available in the
installed package is skipped with a line saying so.

`report` writes `DIR/report.md`: per arm, each seed's mean success over the batches the
policy sampled after 16 through 48 updates (batches 17-48 of the actor's), the mean over
seeds ± its standard error, and Welch's t test for every pair; for each arm against GRPO,
Welch's one-sided test of the least gain theory predicts (`PREDICTED_GAIN`); what each arm's own
batches show over the same window (`BATCH_METRICS`: the advantages' noise per turn on one
scale, GiGPO's step groups, the critic's explained variance), from the seeds'
`metrics.jsonl` where this tree has them, kept in `DIR/batches.json`;
`DIR/report_success.png` the per-batch success, mean over seeds with the seeds' min-max
band; and, where `ppo_shadows` ran, each estimator's gradient agreement on its batches after
8 updates and its paired difference from GRPO's (`shadow_table`, kept in `DIR/shadows.json`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
GAME = (
  "env.kwargs.high=32",
  "env.kwargs.max_turns=5",
  "env.max_turns=5",
  "env.max_completion_len=160",
  "env.kwargs.info_gain_reward=0.2",
  "train.checkpoint_every=8",
)
UPDATES = 48  # actor updates an arm
XLA_CACHE = ROOT / "build" / "credit_study_xla"  # the seeds' compiled programs (`seed_env`)
WINDOW = (16, 48)  # the batches sampled after this many updates, [first, last)
ARMS: dict[str, dict[str, Any]] = {
  "grpo": {"config": "configs/smollm2.yaml", "warmup": 0, "overrides": ()},
  "ppo": {
    "config": "configs/smollm2_ppo.yaml",
    "warmup": 8,  # critic-only steps before the first actor update
    "overrides": ("ppo.gae_lambda=0.5", "ppo.num_generations=1"),
  },
  "gigpo": {
    "config": "configs/smollm2.yaml",
    "warmup": 0,
    "overrides": ("ppo.advantage_estimator=gigpo",),
  },
}
STUDY = ("grpo", "ppo", "gigpo")  # the arms compared; `ppo_shadows` measures, on one seed
# PPO's arm with 2 secrets x 4 a batch, so that the group estimators have groups: on every
# batch the policy gradients' agreement (`shadow/<name>/grad_cosine`) of the learned
# critic's advantages and of GRPO's and GiGPO's on the same episodes
ARMS["ppo_shadows"] = {
  "config": "configs/smollm2_ppo.yaml",
  "warmup": 8,
  "updates": 24,
  "overrides": ("ppo.gae_lambda=0.5", "metrics.shadow_estimators=[grpo,gigpo]"),
}
SHADOWS = ("turn_gae", "grpo", "gigpo")


def finished(out: pathlib.Path, arm: str, rerun: bool = False) -> set[int]:
  """The seeds of `arm` with a result (a seed's `result.json`, or the gathered file unless
  `rerun`: its seeds, committed, run again)."""
  done = {int(p.parent.name[4:]) for p in (out / arm).glob("seed*/result.json")}
  gathered = out / arm / "results.json"
  if gathered.is_file() and not rerun:
    done |= {int(s) for s in json.loads(gathered.read_text())["seeds"]}
  return done


def available(arm: str) -> bool:
  """Whether the installed package knows the arm's estimator."""
  from tunix_ppo_ext.config import ConfigError, load_run_config

  spec = ARMS[arm]
  try:
    load_run_config(str(ROOT / spec["config"]), [*GAME, *spec["overrides"]])
  except ConfigError as err:
    print(f"arm {arm}: not available ({err}); skipped", flush=True)
    return False
  return True


def next_run(
  out: pathlib.Path, arms: list[str], seeds: int, rerun: bool = False
) -> tuple[str, int] | None:
  """The arm with the fewest finished seeds (ties: `arms`' order) and its lowest seed left
  (`rerun`: `finished`'s)."""
  left = [(len(finished(out, a, rerun)), i, a) for i, a in enumerate(arms)]
  for _, _, arm in sorted(left):
    todo = sorted(set(range(seeds)) - finished(out, arm, rerun))
    if todo:
      return arm, todo[0]
  return None


def run(args: argparse.Namespace) -> None:
  out = pathlib.Path(args.out)
  arms = [a for a in args.arms if available(a)]
  while (job := next_run(out, arms, args.seeds, args.rerun)) is not None:
    arm, seed = job
    spec = ARMS[arm]
    print(f"credit study: arm {arm}, seed {seed}", flush=True)
    command = [
      sys.executable,
      str(ROOT / "bench" / "real_model.py"),
      "--config",
      str(ROOT / spec["config"]),
      "--steps",
      str(spec["warmup"] + spec.get("updates", UPDATES)),
      "--baseline-steps",
      "0",
      "--seed-ids",
      str(seed),
      "--out",
      str(out / arm),
      *(["--rerun"] if args.rerun else []),
      *GAME,
      *spec["overrides"],
    ]
    train_seed(command)


def train_seed(command: list[str]) -> None:
  """Runs one seed's `real_model.py` command over `seed_env`. A SIGTERM to the study ends
  that process too (`subprocess.run` kills its child on the exception `_stopped` raises),
  so a rerun never finds the seed still training in an orphaned process."""
  previous = signal.signal(signal.SIGTERM, _stopped)
  try:
    subprocess.run(command, check=True, cwd=ROOT, env=seed_env(os.environ))
  finally:
    signal.signal(signal.SIGTERM, previous)


def seed_env(environ: dict[str, str] | os._Environ) -> dict[str, str]:
  """`environ` with JAX's persistent compilation cache in `XLA_CACHE`, every program kept,
  unless the caller chose a cache directory: the seeds of an arm compile the same
  programs, so each seed after the first loads them (as `tunix-ppo-ext train` keeps its
  own cache; `jobs.train`, which `real_model.py` calls, leaves JAX's settings to its
  caller)."""
  env = dict(environ)
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(XLA_CACHE))
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  return env


def _stopped(signum: int, frame: Any) -> None:
  raise SystemExit(f"credit study: stopped by signal {signum}; a rerun continues the seed")


def seed_success(curve: list[float], warmup: int) -> float:
  """Mean success over the actor's batches `WINDOW` (after `warmup` critic-only batches)."""
  window = curve[warmup + WINDOW[0] : warmup + WINDOW[1]]
  return statistics.fmean(window)


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
  """Welch's t statistic and two-sided p value of mean(a) - mean(b)."""
  from scipy import stats

  result = stats.ttest_ind(a, b, equal_var=False)
  return float(result.statistic), float(result.pvalue)


def difference(a: list[float], b: list[float]) -> tuple[float, float]:
  """mean(a) - mean(b) and its standard error (Welch's, unequal variances)."""
  se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
  return statistics.fmean(a) - statistics.fmean(b), se


def arm_results(out: pathlib.Path, arm: str) -> dict[int, dict[str, Any]]:
  """Each finished seed's trained summary (`real_model.py`'s), by seed."""
  seeds = {}
  gathered = out / arm / "results.json"
  if gathered.is_file():
    seeds |= {int(k): v["trained"] for k, v in json.loads(gathered.read_text())["seeds"].items()}
  for path in (out / arm).glob("seed*/result.json"):
    seeds[int(path.parent.name[4:])] = json.loads(path.read_text())["trained"]
  return dict(sorted(seeds.items()))


def report(args: argparse.Namespace) -> str:
  out = pathlib.Path(args.out)
  rows, per_arm = [], {}
  for arm in args.arms:
    seeds = arm_results(out, arm)
    full = {s: r for s, r in seeds.items() if len(r["success_curve"]) >= ARMS[arm]["warmup"] + 48}
    if not full:
      continue
    values = [seed_success(r["success_curve"], ARMS[arm]["warmup"]) for r in full.values()]
    per_arm[arm] = values
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    walls = [r.get("step_s_median") or 0.0 for r in full.values()]
    shown = ", ".join(f"{s}: {v:.3f}" for s, v in zip(full, values, strict=True))
    rows.append(
      f"| {arm} | {len(values)} | {statistics.fmean(values):.3f} ± "
      f"{'-' if math.isnan(se) else f'{se:.3f}'} | {shown} | "
      f"{statistics.median(walls):.1f} |"
    )
  lines = [
    f"Success over the actor's batches {WINDOW[0] + 1}-{WINDOW[1]} (the policy after "
    f"{WINDOW[0]} through {WINDOW[1] - 1} updates), per seed; mean ± standard error.",
    "",
    "| arm | seeds | success | per seed | step s (median) |",
    "| --- | --- | --- | --- | --- |",
    *rows,
    "",
    "| pair | difference ± SE | Welch t | p (two-sided) |",
    "| --- | --- | --- | --- |",
  ]
  for a, b in itertools.combinations(per_arm, 2):
    x, y = per_arm[a], per_arm[b]
    if len(x) < 2 or len(y) < 2:
      continue
    diff, se = difference(x, y)
    t, p = welch(x, y)
    lines.append(f"| {a} - {b} | {diff:+.3f} ± {se:.3f} | {t:.2f} | {p:.3f} |")
  lines += ["", *gain_table(per_arm)]
  lines += ["", *batch_table(out, list(per_arm))]
  lines += ["", *shadow_table(out)]
  text = "\n".join(lines) + "\n"
  (out / "report.md").write_text(text)
  _plot(out, args.arms)
  return text


PREDICTED_GAIN = 0.05  # the least gain over GRPO theory predicts here (issue 70)


def gain_table(per_arm: dict[str, list[float]]) -> list[str]:
  """For each arm against GRPO: Welch's one-sided p of "its success is `PREDICTED_GAIN`
  or more above GRPO's" (small: the data rule that gain out)."""
  from scipy import stats

  lines = [
    f"Is a gain of {PREDICTED_GAIN} or more over GRPO ruled out (the least gain the theory "
    "of issue 70 predicts for a perfect critic here)? Welch's one-sided test of that gain.",
    "",
    "| arm | difference to GRPO ± SE | p (gain >= predicted) |",
    "| --- | --- | --- |",
  ]
  grpo = per_arm.get("grpo", [])
  for arm, values in per_arm.items():
    if arm == "grpo" or len(values) < 2 or len(grpo) < 2:
      continue
    diff, se = difference(values, grpo)
    shifted = [v - PREDICTED_GAIN for v in values]
    p = stats.ttest_ind(shifted, grpo, equal_var=False, alternative="less").pvalue
    lines.append(f"| {arm} | {diff:+.3f} ± {se:.3f} | {float(p):.4f} |")
  return lines


# What each arm's own batches show over the same window (`actor/...` metrics, metrics guide):
# the advantages' noise per turn on one scale (each estimator's divided by its signal
# coefficient; raw, and as trained), GiGPO's step groups, the critic's explained variance
BATCH_METRICS = {
  "noise per turn": "actor/advantage_noise_turn",
  "noise per turn, as trained": "actor/advantage_noise_trained_turn",
  "GiGPO step group size": "actor/gigpo_step_group_size",
  "GiGPO singleton share": "actor/gigpo_step_singleton_frac",
  "critic explained variance": "critic/explained_variance",
}


def seed_batches(metrics: pathlib.Path, warmup: int) -> dict[str, float]:
  """Each `BATCH_METRICS` value's mean over the window's batches of one seed's
  `metrics.jsonl` (the steps after `warmup` + 16 through `warmup` + 48 updates' batches)."""
  from tunix_ppo_ext.metrics import read_jsonl

  first, last = warmup + WINDOW[0] + 1, warmup + WINDOW[1]
  rows = [r for r in read_jsonl(metrics) if first <= r.get("step", 0) <= last]
  means = {}
  for name, key in BATCH_METRICS.items():
    values = [r[key] for r in rows if key in r and math.isfinite(r[key])]
    if values:
      means[name] = statistics.fmean(values)
  return means


def batch_table(out: pathlib.Path, arms: list[str]) -> list[str]:
  """`BATCH_METRICS` per arm (mean ± standard error over seeds), from each seed's
  `metrics.jsonl` where this tree has it, kept in `DIR/batches.json` (committed: the seed
  directories are not) with the seeds measured before."""
  kept = out / "batches.json"
  found = json.loads(kept.read_text()) if kept.is_file() else {}
  for arm in arms:
    finished = {str(s) for s in arm_results(out, arm)}  # finished seeds only
    for metrics in sorted((out / arm).glob("seed*/trained/metrics.jsonl")):
      seed = metrics.parent.parent.name[4:]
      if seed in finished:
        found.setdefault(arm, {})[seed] = seed_batches(metrics, ARMS[arm]["warmup"])
  kept.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
  lines = [
    f"The arms' own batches {WINDOW[0] + 1}-{WINDOW[1]}: mean ± standard error over the "
    "seeds measured (`batches.json`); noise is E[(A/c)^2] per turn, c each estimator's "
    "signal coefficient.",
    "",
    f"| arm | seeds | {' | '.join(BATCH_METRICS)} |",
    f"| --- | --- |{' --- |' * len(BATCH_METRICS)}",
  ]
  for arm in arms:
    seeds = found.get(arm, {})
    cells = []
    for name in BATCH_METRICS:
      values = [v[name] for v in seeds.values() if name in v]
      if not values:
        cells.append("-")
        continue
      se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
      cells.append(f"{statistics.fmean(values):.4f} ± {se:.4f}")
    lines.append(f"| {arm} | {len(seeds)} ({', '.join(sorted(seeds))}) | {' | '.join(cells)} |")
  return lines


def shadow_table(out: pathlib.Path, skip: int = 8) -> list[str]:
  """`ppo_shadows`' gradient agreement per estimator on the same batches: the mean over the
  batches after `skip` updates of each `shadow/<name>/grad_cosine`, and each one's paired
  difference from GRPO's (mean ± standard error over batches), kept in
  `DIR/shadows.json` (committed: the seed directories are not)."""
  from tunix_ppo_ext.metrics import read_jsonl

  kept, spec = out / "shadows.json", ARMS["ppo_shadows"]
  found = json.loads(kept.read_text()) if kept.is_file() else {}
  for metrics in sorted((out / "ppo_shadows").glob("seed*/trained/metrics.jsonl")):
    first = spec["warmup"] + skip + 1
    rows = [r for r in read_jsonl(metrics) if r.get("step", 0) >= first]
    keys = [f"shadow/{name}/grad_cosine" for name in SHADOWS]
    rows = [r for r in rows if all(math.isfinite(r.get(k, math.nan)) for k in keys)]
    found[metrics.parent.parent.name[4:]] = {
      name: [r[k] for r in rows] for name, k in zip(SHADOWS, keys, strict=True)
    }
  if not found:
    return []
  kept.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
  cosines = {name: sum((seed[name] for seed in found.values()), []) for name in SHADOWS}
  lines = [
    f"PPO's arm with 2 secrets x 4 a batch (`ppo_shadows`, seeds {', '.join(sorted(found))}):"
    f" the policy gradients' agreement of the two halves of each batch after {skip} updates "
    f"({len(cosines['grpo'])} batches; `shadows.json`), every estimator on the same batches; "
    "a higher cosine is a cleaner gradient.",
    "",
    "| estimator | grad cosine, mean ± SE | minus GRPO's (paired) ± SE |",
    "| --- | --- | --- |",
  ]
  for name, values in cosines.items():
    paired = [a - b for a, b in zip(values, cosines["grpo"], strict=True)]
    cells = [_mean_se(values), "-" if name == "grpo" else _mean_se(paired, signed=True)]
    lines.append(f"| {name} | {' | '.join(cells)} |")
  return lines


def _mean_se(values: list[float], signed: bool = False) -> str:
  se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
  return f"{statistics.fmean(values):{'+' if signed else ''}.3f} ± {se:.3f}"


def _plot(out: pathlib.Path, arms: list[str]) -> None:
  from tunix_ppo_ext.metrics import plot_spread

  curves = {}
  for arm in arms:
    warm = ARMS[arm]["warmup"]
    seeds = arm_results(out, arm)
    curves[arm] = [r["success_curve"][warm:] for r in seeds.values()]
  curves = {arm: c for arm, c in curves.items() if c}
  if curves:
    plot_spread(curves, out / "report_success.png", "success rate (the actor's batches of 8)")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("command", choices=("run", "report"))
  parser.add_argument("--seeds", type=int, default=8)
  parser.add_argument("--arms", nargs="+", default=list(STUDY), choices=list(ARMS))
  parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "credit_study"))
  parser.add_argument(
    "--rerun",
    action="store_true",
    default=os.environ.get("BENCH_RERUN", "") not in ("", "0"),
    help="run again the seeds only the committed results.json files hold (BENCH_RERUN=1)",
  )
  args = parser.parse_args()
  if args.seeds < 1:
    parser.error(f"--seeds {args.seeds}: at least 1")
  if args.command == "run":
    run(args)
  else:
    print(report(args))


if __name__ == "__main__":
  main()
