"""Resume after a hard kill: SIGKILL a `tunix-ppo-ext train` run after a checkpoint, rerun it.

The killed run is, up to the kill, the uninterrupted run of the same command: the resumed
run must reproduce its metrics for the steps after the checkpoint (same weights, optimizer
state, KL controller and data position), and the finished `metrics.jsonl` must hold every
step exactly once. The helpers that make this work are tested directly as well.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import signal
import subprocess
import time

import numpy as np
import pytest

from tests.helpers.runs import SMOKE, common_checkpoints, smoke_args, subprocess_env, train_command
from tunix_ppo_ext import config as jobs_config
from tunix_ppo_ext import jobs
from tunix_ppo_ext._src.metrics.sinks import compact_jsonl, read_jsonl, truncate_jsonl
from tunix_ppo_ext._src.run import cli, resume

pytestmark = pytest.mark.tunix

STEPS = 14
CHECKPOINT_EVERY = 4  # the kill lands two steps after one, two steps before the next
OVERRIDES = [
  f"train.steps={STEPS}",
  f"train.checkpoint_every={CHECKPOINT_EVERY}",
  "train.eval_batches=0",
  "ppo.kl_ctrl=adaptive",  # the KL coefficient changes every step
  "ppo.kl_target=10.0",
  "ppo.kl_horizon=50",
]
KL_COEF = ("actor/kl_coef", "actor/train/kl_coef")  # published key, tunix's own layout
NOT_REPRODUCIBLE = ("timing", "per_s", "_time", "wall")  # wall-clock metrics


def logged_steps(out: pathlib.Path) -> list[int]:
  path = out / "metrics.jsonl"
  return [r["step"] for r in read_jsonl(path)] if path.exists() else []


def kill_after_checkpoint(out: pathlib.Path, env: dict[str, str], log: pathlib.Path) -> None:
  """Starts the run and SIGKILLs it once a checkpoint exists and two later steps are logged."""
  with log.open("w") as stderr:
    process = subprocess.Popen(
      train_command(out, *OVERRIDES), env=env, stdout=stderr, stderr=stderr
    )
  deadline = time.monotonic() + 600
  try:
    while time.monotonic() < deadline:
      saved, steps = common_checkpoints(out), logged_steps(out)
      # orbax also keeps the first step; wait for a periodic checkpoint and two later steps
      if saved and steps and max(saved) >= CHECKPOINT_EVERY and max(steps) >= max(saved) + 2:
        break
      assert process.poll() is None, f"run ended before the kill:\n{log.read_text()[-3000:]}"
      time.sleep(0.05)
    else:
      pytest.fail("no checkpoint within 600 s")
    assert process.poll() is None, "the run finished before it could be killed"
  finally:
    process.send_signal(signal.SIGKILL)
    process.wait()
  assert process.returncode == -signal.SIGKILL


def reproducible(row: dict) -> dict[str, float]:
  return {
    k: v
    for k, v in row.items()
    if k != "step" and v is not None and not any(word in k for word in NOT_REPRODUCIBLE)
  }


def first_key(rows: list[dict], names: tuple[str, ...]) -> str:
  return next(n for n in names if any(n in r for r in rows))


def test_sigkill_then_rerun_continues_from_the_checkpoint(tmp_path, capsys):
  out, env = tmp_path / "run", subprocess_env(tmp_path)
  kill_after_checkpoint(out, env, tmp_path / "killed.log")
  restored = max(common_checkpoints(out))  # what the rerun must resume from
  killed = {r["step"]: r for r in read_jsonl(out / "metrics.jsonl")}
  assert max(killed) < STEPS and max(killed) >= restored + 2

  capsys.readouterr()  # the same command again, in this process (the kill was the subprocess's)
  assert cli.main(smoke_args(out, *OVERRIDES)) == 0
  assert f"resuming from step {restored} " in capsys.readouterr().err

  # every step once, in order, in the file's lines (steps count from 0 or 1: either layout)
  lines = (out / "metrics.jsonl").read_text().splitlines()
  steps = [json.loads(line)["step"] for line in lines]
  assert steps[0] in (0, 1) and steps == list(range(steps[0], STEPS + 1))
  rows = {r["step"]: r for r in read_jsonl(out / "metrics.jsonl")}
  assert json.loads((out / "summary.json").read_text())["steps"] == STEPS
  assert max(common_checkpoints(out)) == STEPS

  # the steps the killed run logged after its checkpoint come out the same: restored weights,
  # optimizer state, KL controller and data position (any one missing changes them)
  compared = [s for s in killed if s >= restored]
  assert len(compared) >= 3
  for step in compared:
    expected, actual = reproducible(killed[step]), reproducible(rows[step])
    assert expected.keys() <= actual.keys(), (step, expected.keys() - actual.keys())
    for key, value in expected.items():
      np.testing.assert_allclose(actual[key], value, rtol=1e-6, atol=1e-7, err_msg=f"{step} {key}")
  kl_key = first_key(list(rows.values()), KL_COEF)
  coefs = [row[kl_key] for row in rows.values() if kl_key in row]
  assert len(coefs) == STEPS and len(set(coefs)) == STEPS  # it moved at every step
  assert coefs == sorted(coefs, reverse=True)  # kl_target=10: it shrinks, never restarts


def test_a_finished_run_extended_by_a_rerun_continues_its_steps_and_kl_controller(tmp_path):
  """5 steps with checkpoints every 2, then the same command with `train.steps=8`: the last
  step's checkpoint (off the schedule) carries the global step and the learner's state, as
  the scheduled ones do. It used to be tunix's save at close, without them: the extension's
  metrics restarted at step 1 over the old rows, with a fresh KL controller."""
  out = tmp_path / "run"
  args = smoke_args(out, *OVERRIDES[2:], "train.checkpoint_every=2", "train.eval_every=100")
  assert cli.main([*args, "train.steps=5"]) == 0
  assert common_checkpoints(out) == {4, 5}
  assert cli.main([*args, "train.steps=8"]) == 0
  rows = [r for r in read_jsonl(out / "metrics.jsonl") if any(k.startswith("train/") for k in r)]
  assert [r["step"] for r in rows] == list(range(1, 9))
  kl_key = first_key(rows, KL_COEF)
  coefs = [row[kl_key] for row in rows]
  assert coefs == sorted(coefs, reverse=True) and len(set(coefs)) == 8  # never restarts


@pytest.mark.tunix_facing  # tunix main closes and counts steps too (lane 2 of .ci/run)
def test_a_python_users_dataset_that_ends_early_resumes_exactly(tmp_path):
  """A cluster for 6 steps trained on a dataset of 3 batches: tunix's loop ends with the
  data and its trainers save step 3 as they close. That save carries the global step and
  the learner's state (it used to carry neither: the second run logged steps 1-3 again
  with a fresh KL controller); the second run, on the whole dataset, resumes at step 4."""
  out = tmp_path / "run"
  overrides = [*OVERRIDES[2:], "train.steps=6", "train.checkpoint_every=100"]
  run = jobs_config.load_run_config(str(SMOKE), [*overrides, f"output_dir={out}"])
  learner, batches, _, _ = jobs.build_run(run, out)
  learner.train(itertools.islice(batches, 3))
  assert max(common_checkpoints(out)) == 3  # orbax keeps the first step too
  learner, batches, _, _ = jobs.build_run(run, out)
  assert learner.rl_cluster.global_steps == 3  # restored from the save at close
  learner.train(batches)
  compact_jsonl(out / "metrics.jsonl")
  rows = [r for r in read_jsonl(out / "metrics.jsonl") if any(k.startswith("train/") for k in r)]
  assert [r["step"] for r in rows] == list(range(1, 7))
  kl_key = first_key(rows, KL_COEF)
  coefs = [row[kl_key] for row in rows]
  assert coefs == sorted(coefs, reverse=True) and len(set(coefs)) == 6  # never restarts


def test_truncate_keeps_rows_up_to_the_step_and_drops_a_cut_off_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  rows = [{"step": s, "a": float(s)} for s in range(5)] + [{"step": 2, "late": 1.0}]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "a": 5.')
  assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2, 3, 4]  # cut-off line skipped
  assert truncate_jsonl(path, 2) == 4  # atomic: before a sink opens the file
  with path.open("a") as writer:
    writer.write(json.dumps({"step": 3, "a": 30.0}) + "\n")
  assert read_jsonl(path) == [
    {"step": 0, "a": 0.0},
    {"step": 1, "a": 1.0},
    {"step": 2, "a": 2.0, "late": 1.0},
    {"step": 3, "a": 30.0},
  ]
  assert compact_jsonl(path) == 4
  assert len(path.read_text().splitlines()) == 4
  assert truncate_jsonl(path, -1) == 0 and read_jsonl(path) == []
  assert truncate_jsonl(tmp_path / "missing.jsonl", 3) == 0


def test_a_bad_line_before_the_last_is_an_error(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 0}\n{"step": 1, "a": \n{"step": 2}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line"):
    read_jsonl(path)


def test_unmatched_role_checkpoints_are_moved_aside(tmp_path):
  for role, steps in {"actor": (3, 6, 9), "critic": (3, 6)}.items():
    for step in steps:
      (tmp_path / role / str(step)).mkdir(parents=True)
  (tmp_path / "critic" / "9.orbax-checkpoint-tmp-123").mkdir()  # killed mid-save
  assert resume.align_role_checkpoints(tmp_path) == 6
  assert resume.finalized_steps(tmp_path / "actor") == {3, 6}
  assert (tmp_path / "incomplete" / "actor" / "9").is_dir()
  assert resume.align_role_checkpoints(tmp_path / "nothing") is None
