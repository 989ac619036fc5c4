"""Multi-turn rollout throughput and where a training step's time goes, on the default run.

Trains the embedded default (`tunix-ppo-ext train`'s model, environment and settings) for
`--steps` steps and prints, over the steps after `--warmup` (compilation excluded): agent
tokens per second of rollout, and the share of the step spent in the rollout, the old /
reference / value passes, the advantages, and the rest (actor and critic updates, metrics).

  python bench/step_phases.py [--steps 40 --warmup 8]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile

import jax
import numpy as np
from _timing import timed

from tunix_ppo_ext.config import load_run_config
from tunix_ppo_ext.jobs import build_run
from tunix_ppo_ext.metrics import read_jsonl

PHASES = ["rollout", "old_logp", "ref_logp", "values", "advantages"]


def main() -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--warmup", type=int, default=8)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    out = pathlib.Path(tmp)
    run = load_run_config(None, [f"train.steps={args.steps}", f"output_dir={tmp}"])
    learner, batches, _, _ = build_run(run, out)
    stamps: list[float] = []
    learner.train(timed(batches, stamps))
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "timing_s/rollout" in r]
  rows = rows[args.warmup : len(stamps) - 1]
  step_s = statistics.median(np.diff(stamps)[args.warmup :])
  phase_s = {p: statistics.median(r.get(f"timing_s/{p}", 0.0) for r in rows) for p in PHASES}
  tokens = statistics.median(r["train/response_length/mean"] * run.train.batch_size for r in rows)
  print(
    f"jax {jax.__version__} on {jax.default_backend()}; default run, batch "
    f"{run.train.batch_size}, medians over {len(rows)} steps after {args.warmup}"
  )
  print(
    f"rollout throughput: {tokens / phase_s['rollout']:.0f} agent tokens/s "
    f"({tokens:.0f} agent tokens per step)"
  )
  print(f"{'phase':12s} {'median s':>9s} {'share':>7s}")
  for phase, seconds in phase_s.items():
    print(f"{phase:12s} {seconds:9.4f} {seconds / step_s:7.1%}")
  rest = step_s - sum(phase_s.values())
  print(f"{'updates+rest':12s} {rest:9.4f} {rest / step_s:7.1%}")
  print(f"{'step':12s} {step_s:9.4f} {1:7.1%}")


if __name__ == "__main__":
  main()
