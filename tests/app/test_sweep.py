"""`tunix-ppo-ext sweep`: variants, the table's statistics, and a 2-seed run of the smoke
config with a group estimator (no critic anywhere), resumed afterwards."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import SMOKE, common_checkpoints, subprocess_env, train_command
from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.run import sweep


def test_overrides_with_commas_make_the_product_of_variants():
  study = sweep.variants(["train.steps=4", "ppo.advantage_estimator=gae,grpo", "seed=1,2"])
  assert [v.name for v in study] == [
    "advantage_estimator=gae_seed=1",
    "advantage_estimator=gae_seed=2",
    "advantage_estimator=grpo_seed=1",
    "advantage_estimator=grpo_seed=2",
  ]
  assert study[1].overrides == ("train.steps=4", "ppo.advantage_estimator=gae", "seed=2")
  assert sweep.variants([]) == [sweep.Variant("default", ())]
  assert sweep.split_values("[1,2],{a: 1, b: 2},x") == ["[1,2]", "{a: 1, b: 2}", "x"]
  with pytest.raises(ValueError, match=r"override 'steps' must look like section.key=value"):
    sweep.variants(["steps"])


@given(st.lists(st.floats(-10, 10), min_size=1, max_size=90))
def test_smoothing_is_a_trailing_mean(values):
  window = max(1, len(values) // 20)
  expected = [np.mean(values[max(0, t + 1 - window) : t + 1]) for t in range(len(values))]
  np.testing.assert_allclose(sweep.smoothed(values), expected, rtol=1e-9, atol=1e-9)


def test_variant_row_statistics():
  keys = ("final_return", "max_return", "steps_to_reach", "peak_drop", "wall_s")
  rows = [(1.0, 1.25, 10, 0.2, 3), (0.5, 1.25, None, 0.0, 5)]
  results = [dict(zip(keys, row, strict=True)) for row in rows]
  row = sweep.variant_row("x", results)
  assert row["final_mean"] == 0.75 and row["final_std"] == 0.25 and row["final_min"] == 0.5
  assert row["reached"] == 1 and row["steps_to_reach_mean"] == 10.0
  assert row["peak_drop_max"] == 0.2 and row["wall_s_mean"] == 4.0
  assert "| x | 2 | 0.750 | 0.250 | 0.500 | 1/2 | 10 | 0.200 | 4.0 |" in sweep.markdown_table([row])


def test_sweep_runs_seeds_without_a_critic_and_they_resume(tmp_path, monkeypatch):
  for key, value in subprocess_env(tmp_path).items():
    monkeypatch.setenv(key, value)
  out = tmp_path / "sweep"
  command = [
    sys.executable,
    "-m",
    "tunix_ppo_ext._src.run.cli",
    "sweep",
    "--seeds",
    "2",
    "--jobs",
    "2",
  ]
  command += ["--config", str(SMOKE), "--output-dir", str(out), "ppo.advantage_estimator=grpo"]
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "| advantage_estimator=grpo | 2 |" in done.stdout
  (row,) = json.loads((out / "table.json").read_text())
  assert row["seeds"] == 2 and row["max_return"] == 1.25
  assert (out / "table.md").read_text() == done.stdout and (out / "curves.png").is_file()
  seed0 = out / "advantage_estimator=grpo" / "seed0"
  summaries = [json.loads((seed0.parent / f"seed{k}" / "summary.json").read_text()) for k in (0, 1)]
  finals = [s["final_return"] for s in summaries]
  assert row["final_min"] == min(finals) and np.isclose(row["final_mean"], np.mean(finals))
  assert json.loads((seed0.parent / "seed1" / "config.json").read_text())["seed"] == 1
  # no critic: not built, checkpointed, timed or logged
  assert sorted(p.name for p in (seed0 / "checkpoints").iterdir()) == ["actor"]
  keys = set().union(*read_jsonl(seed0 / "metrics.jsonl"))
  assert "actor/pg_loss" in keys and "train/advantage/mean" in keys
  assert not [k for k in keys if k.startswith("critic/") or "old_value" in k or "values" in k]
  assert "timing_s/update_critic" not in keys
  # a run without critic resumes from its actor checkpoint
  assert common_checkpoints(seed0, roles=("actor",)) == {2, 4}
  resumed = subprocess.run(
    train_command(seed0, "ppo.advantage_estimator=grpo", "train.steps=6"),
    capture_output=True,
    text=True,
    check=False,
    env=subprocess_env(tmp_path),
  )
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "resuming from step 4" in resumed.stderr
  assert [r["step"] for r in read_jsonl(seed0 / "metrics.jsonl") if "actor/pg_loss" in r][-2:] == [
    5,
    6,
  ]
