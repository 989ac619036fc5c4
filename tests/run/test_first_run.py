"""A newcomer's first hour (#61): what `tunix-ppo-ext train` says while it compiles, trains
and ends, and what a rerun does to a finished, a resumed and a damaged run directory.

One smoke run in a subprocess (3 steps, checkpoints at 2 and 3, W&B offline) is shared:
its stdout and stderr are what a person sees; the tests that change a run work on a copy.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
import shutil
import subprocess
import time

import pytest

from tests.helpers.runs import smoke_args, subprocess_env, train_command
from tunix_ppo_ext._src.metrics import sinks
from tunix_ppo_ext._src.run import cli

pytestmark = pytest.mark.tunix

STEPS = 3  # orbax keeps steps 2 and 3: an older checkpoint to fall back on
OVERRIDES = (f"train.steps={STEPS}", "train.checkpoint_every=2", "train.eval_every=2")
OFFLINE = "wandb=offline"  # a newcomer without a W&B key gets an offline run


def _train(out: pathlib.Path, *overrides: str) -> subprocess.CompletedProcess[str]:
  return subprocess.run(
    train_command(out, *overrides),
    env=subprocess_env(out),
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[pathlib.Path, subprocess.CompletedProcess[str]]:
  out = tmp_path_factory.mktemp("first") / "run"
  done = _train(out, *OVERRIDES, OFFLINE)
  assert done.returncode == 0, done.stderr[-3000:]
  return out, done


def _copy(first_run, tmp_path: pathlib.Path) -> pathlib.Path:
  out = tmp_path / "run"
  shutil.copytree(first_run[0], out)
  return out


def _renders(stream: str) -> list[str]:
  """Every line and progress-bar render of `stream` (tqdm redraws after a carriage return)."""
  return [r for r in re.split(r"[\r\n]", stream) if r.strip()]


def _snapshot(out: pathlib.Path) -> dict[str, tuple[int, int]]:
  return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in [out, *out.rglob("*")]}


def test_the_end_of_a_run_is_a_few_lines_with_its_figures_and_the_next_command(first_run):
  out, done = first_run
  summary = json.loads((out / "summary.json").read_text())
  lines = done.stdout.splitlines()
  done_in = f"{STEPS} updates ({STEPS} batches) in {summary['wall_s']} s"
  assert lines[0] == f"tunix-ppo-ext: {out}: {done_in}"
  final, best = summary["final_return"], summary["best_return"]
  assert lines[1].startswith(f"  episode return {final:.3f} at the end (mean of the last batch)")
  assert lines[1].endswith(f"best {best:.3f}, of 1.25 possible")
  assert lines[2].startswith("  success rate ") and ", best " in lines[2]
  assert lines[3].startswith("  last evaluation, after 2 updates: episode return ")
  assert lines[-1] == f"  next: tunix-ppo-ext plot {out}"
  assert len(lines) == 5 and not any("{" in line for line in lines)  # no JSON of byte counts
  assert summary["updates"] == STEPS and summary["memory"]["model_bytes"] > 0  # kept there


def test_the_bar_says_it_compiles_then_counts_updates_without_the_compile_s_eta(first_run):
  renders = _renders(first_run[1].stderr)
  compiling = [r for r in renders if r.startswith("compiling:")]
  assert compiling and all("<?, ?update/s" in r for r in compiling), compiling
  training = [r for r in renders if r.startswith("training (first step ")]
  assert training and f"/{STEPS} [00:00<?, ?update/s" in training[0], training[0]
  assert renders.index(compiling[-1]) < renders.index(training[0])


def test_the_bar_s_eta_comes_from_the_steps_after_the_compiling_one():
  """The real bar, fed as a run feeds it: 2 s before the first step ends, then 0.1 s
  steps. The ETA of the other 95 updates is the steps' own, ~10 s (timed with the first
  step, 45 s by the average and 60 s by tqdm's smoothed rate)."""
  file = io.StringIO()
  bar = sinks.ProgressBackend(100, {"timing_s/step": "step_s"}, "timing_s/step", file=file)
  bar.log_scalar("train/episode_return/mean", 0.0, step=1)  # the first rollout's metrics
  time.sleep(2.0)  # the first updates compile
  bar.log_scalar("timing_s/step", 2.0, step=1)  # the first step ends
  for step in range(2, 6):
    time.sleep(0.1)
    bar.log_scalar("actor/loss", 0.0, step=step)
  bar.close()
  renders = _renders(file.getvalue())
  assert renders[0].startswith("compiling:") and "<?" in renders[0]
  last = renders[-1]
  assert re.match(r"training \(first step 2 s\): +5%.* 5/100 \[", last), last
  minutes, seconds = re.search(r"<(\d+):(\d+),", last).groups()
  assert 60 * int(minutes) + int(seconds) < 30, last


def test_a_rerun_of_a_finished_run_says_so_in_one_line_and_changes_nothing(first_run):
  out = first_run[0]
  before, summary = _snapshot(out), (out / "summary.json").read_bytes()
  done = _train(out, *OVERRIDES, OFFLINE)
  assert done.returncode == 0, done.stderr[-3000:]
  (line,) = (done.stdout + done.stderr).splitlines()
  assert line.startswith(f"tunix-ppo-ext: {out} is already complete ({STEPS} updates in ")
  assert f"train.steps={2 * STEPS}" in line and "--output-dir" in line
  assert (out / "summary.json").read_bytes() == summary
  assert len(list((out / "wandb").glob("offline-run-*"))) == 1
  assert len(list((out / "tensorboard").iterdir())) == 1
  assert _snapshot(out) == before  # no checkpoint, lock, history or config written either


def test_a_resumed_run_s_summary_keeps_every_part_s_wall_time_and_its_resumes(first_run, tmp_path):
  out = _copy(first_run, tmp_path)
  first = json.loads((out / "summary.json").read_text())
  assert cli.main(smoke_args(out, *OVERRIDES[1:], f"train.steps={STEPS + 1}")) == 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["resumes"] == [STEPS] and summary["updates"] == STEPS + 1
  (before, after) = summary["parts"]
  assert before == {"from_step": 0, "wall_s": first["wall_s"]} and after["from_step"] == STEPS
  assert summary["wall_s"] == pytest.approx(first["wall_s"] + after["wall_s"], abs=0.11)


def test_a_resume_after_a_damaged_checkpoint_leaves_no_bar_or_sink_open(first_run, tmp_path):
  """The failed restore's sinks had stayed registered: its bar moved beside the new one,
  its TensorBoard file got every scalar again, and tqdm's `__del__` raised at exit."""
  out = _copy(first_run, tmp_path)
  for file in (out / "checkpoints" / "actor" / str(STEPS)).rglob("*"):
    if file.is_file():  # every file of the actor's newest step cut in half
      file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
  done = _train(out, *OVERRIDES[1:], f"train.steps={STEPS + 1}", OFFLINE)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"checkpoint step {STEPS} cannot be restored" in done.stderr
  assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
  losses = sinks.read_tensorboard(out / "tensorboard")["actor/loss"]
  assert [step for step, _ in losses].count(STEPS + 1) == 1  # one sink logged the new step
