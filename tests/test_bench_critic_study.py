"""`bench/critic_study.py`: how each seed of a sweep ended, from its recorded metrics."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.helpers.bench import load_bench

pytestmark = pytest.mark.tunix


def _bench():
  return load_bench("critic_study")


def _seed(root: pathlib.Path, variant: str, seed: int, entropy: float, invalid: float) -> None:
  """A finished seed of 20 steps: entropy and invalid share constant over its last 2 steps."""
  run = root / variant / f"seed{seed}"
  run.mkdir(parents=True)
  rows = []
  for step in range(1, 21):
    late = step > 18
    rows.append(
      {
        "step": step,
        "train/success_rate": 0.25 if late else 0.0,
        "train/episode_return/mean": 0.25 if late else -1.0,
        "actor/entropy": entropy if late else 2.0,
        "train/env/invalid_action": invalid if late else 0.5,
      }
    )
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  summary = {"final_return": 0.25, "max_return": 1.0, "wall_s": 1.0}
  (run / "summary.json").write_text(json.dumps(summary))
  (run / "config.json").write_text(json.dumps({"metrics": {}}))


def test_each_seed_gets_its_last_tenth_and_the_variants_their_tallies(tmp_path):
  bench = _bench()
  _seed(tmp_path, "a", 0, entropy=0.001, invalid=0.0)
  _seed(tmp_path, "a", 1, entropy=0.001, invalid=1.0)
  _seed(tmp_path, "b", 0, entropy=0.5, invalid=0.0)
  text = bench.report(tmp_path, fixed=0.05)
  assert "| a | seed0 | 0.250 | 0.250 | 0.0010 | 0.000 |" in text  # the last 2 of 20 steps
  assert text.splitlines()[4].endswith("| fixed reply |")
  assert "| a | seed1 | 0.250 | 0.250 | 0.0010 | 1.000 |" in text
  assert "- a: 1 fixed invalid reply, 1 fixed reply" in text
  assert "- b: 1 still sampling" in text
  assert bench.verdict(0.05, 1.0, fixed=0.05) == "still sampling"  # the threshold is strict
  assert bench.short_name("advantage_estimator=rloo") == "rloo"
  assert bench.short_name("advantage_estimator=turn_gae_critic_lambda=1.0") == "turn_gae"
  assert bench._number(None) == "-" and bench._number(0.25) == "0.250"  # no success rate
  assert bench.short_name("steps=3_advantage_estimator=gae_keep_ratio=0.5_by=std") == "StarPO-S"
  curves = bench.success_curves([tmp_path])
  assert sorted(curves) == ["a", "b"] and len(curves["a"]) == 2
  assert len(curves["a"][0]) == 20 and curves["a"][0][-1] == 0.25  # window 1: the value
