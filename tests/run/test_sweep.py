"""`tunix-ppo-ext sweep`: variants, the table's statistics, a 2-seed run (seed=3,4) of the smoke
config with a group estimator (no critic anywhere), resumed afterwards."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.runs import SMOKE, common_checkpoints, smoke_args, subprocess_env
from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.run import cli, sweep
from tunix_ppo_ext._src.run.run_config import config_dict, load_run_config
from tunix_ppo_ext.metrics import trailing_mean

pytestmark = pytest.mark.tunix


def test_overrides_with_commas_make_the_product_of_variants():
  study = sweep.variants(["train.steps=4", "ppo.advantage_estimator=gae,grpo", "train.lr=1,2"])
  assert [v.name for v in study] == [
    "advantage_estimator=gae_lr=1",
    "advantage_estimator=gae_lr=2",
    "advantage_estimator=grpo_lr=1",
    "advantage_estimator=grpo_lr=2",
  ]
  assert study[1].overrides == ("train.steps=4", "ppo.advantage_estimator=gae", "train.lr=2")
  assert sweep.variants([]) == [sweep.Variant("default", ())]
  assert sweep.split_values("[1,2],{a: 1, b: 2},x") == ["[1,2]", "{a: 1, b: 2}", "x"]
  with pytest.raises(ValueError, match=r"override 'steps' must look like section.key=value"):
    sweep.variants(["steps"])


@given(st.lists(st.floats(-10, 10), min_size=1, max_size=90))
def test_smoothing_is_a_trailing_mean(values):
  window = max(1, len(values) // 20)
  expected = [np.mean(values[max(0, t + 1 - window) : t + 1]) for t in range(len(values))]
  np.testing.assert_allclose(trailing_mean(values), expected, rtol=1e-9, atol=1e-9)


def test_variant_row_statistics():
  keys = ("final_return", "max_return", "steps_to_reach", "peak_drop", "echo_trap_step", "wall_s")
  keys += ("final_success",)
  rows = [(1.0, 1.25, 10, 0.2, None, 3, 0.25), (0.5, 1.25, None, 0.0, 7, 5, 0.5)]
  results = [dict(zip(keys, row, strict=True)) for row in rows]
  row = sweep.variant_row("x", results)
  assert row["final_mean"] == 0.75 and row["final_std"] == 0.25 and row["final_min"] == 0.5
  assert row["reached"] == 1 and row["steps_to_reach_mean"] == 10.0
  assert row["peak_drop_max"] == 0.2 and row["wall_s_mean"] == 4.0 and row["echo_trap"] == 1
  assert (row["success_mean"], row["success_min"], row["success_max"]) == (0.375, 0.25, 0.5)
  table = sweep.markdown_table([row])
  line = "| x | 2 | 0.750 | 0.250 | 0.500 | 0.375 [0.250, 0.500] | 1/2 | 10 | 0.200 | 1/2 | 4.0 |"
  assert line in table
  results[1]["final_success"] = None  # a seed without successes: no column, not a wrong mean
  assert "| 0.500 | - | 1/2 |" in sweep.markdown_table([sweep.variant_row("x", results)])


def test_final_success_is_the_mean_of_the_last_tenth_of_logged_steps():
  key = "train/success_rate"
  rows = [{key: v} for v in np.linspace(0, 1, 30)] + [{"other": 1.0}]
  assert np.isclose(sweep.last_tenth(rows, key), np.mean(np.linspace(0, 1, 30)[-3:]))
  assert sweep.last_tenth([{key: 0.5}], key) == 0.5  # at least one step
  assert sweep.last_tenth([{"other": 1.0}], key) is None


def test_a_seed_saved_before_a_key_existed_counts_as_the_same_config(tmp_path):
  """A later version adds `metrics.echo_trap`: a seed whose `config.json` predates it is the
  same run when the sweep wants the key's default, another run when it wants another value."""
  wanted = json.loads(json.dumps(config_dict(load_run_config(str(SMOKE)))))
  saved = json.loads(json.dumps(wanted))
  del saved["metrics"]["echo_trap"]
  sweep._compare(tmp_path, saved, wanted)  # no error
  wanted["metrics"]["echo_trap"]["window"] = 3
  with pytest.raises(ValueError, match=r"metrics\.echo_trap\.window: None -> 3"):
    sweep._compare(tmp_path, saved, wanted)
  saved["train"]["lr"] = 0.5  # a key both have still counts
  with pytest.raises(ValueError, match=r"train\.lr: 0\.5 -> 0\.001"):
    sweep._compare(
      tmp_path, saved, json.loads(json.dumps(config_dict(load_run_config(str(SMOKE)))))
    )


def test_sweep_runs_seeds_without_a_critic_and_they_resume(tmp_path, monkeypatch, capsys):
  for key, value in subprocess_env(tmp_path).items():
    monkeypatch.setenv(key, value)
  out = tmp_path / "sweep"
  command = [
    sys.executable,
    "-m",
    "tunix_ppo_ext._src.run.cli",
    "sweep",
    "--jobs",
    "2",
  ]
  command += ["--config", str(SMOKE), "--output-dir", str(out), "ppo.advantage_estimator=grpo"]
  command += [
    "ppo.num_generations=2",
    "seed=3,4",
  ]  # the seeds themselves (not 0 .. N-1 under both names)
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "| advantage_estimator=grpo_num_generations=2 | 2 |" in done.stdout
  (row,) = json.loads((out / "table.json").read_text())
  assert row["seeds"] == 2 and row["max_return"] == 1.25
  assert (out / "table.md").read_text() == done.stdout and (out / "curves.png").is_file()
  seed0 = out / "advantage_estimator=grpo_num_generations=2" / "seed3"
  assert sorted(p.name for p in seed0.parent.iterdir()) == ["seed3", "seed4"]
  summaries = [json.loads((seed0.parent / f"seed{k}" / "summary.json").read_text()) for k in (3, 4)]
  finals = [s["final_return"] for s in summaries]
  assert row["final_min"] == min(finals) and np.isclose(row["final_mean"], np.mean(finals))
  assert [
    json.loads((seed0.parent / f"seed{k}" / "config.json").read_text())["seed"] for k in (3, 4)
  ] == [3, 4]
  # the same sweep again: its saved configs match, nothing is trained, the same table
  rerun = subprocess.run(command, capture_output=True, text=True, check=False)
  assert rerun.returncode == 0 and rerun.stdout == done.stdout, rerun.stderr[-2000:]
  assert "tunix-ppo-ext sweep: " not in rerun.stderr
  # another config into the same directory is refused, not reported as this one's results
  other = yaml.safe_load(SMOKE.read_text())
  other["train"]["lr"] = 0.01
  (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
  again = [str(tmp_path / "other.yaml") if arg == str(SMOKE) else arg for arg in command]
  refused = subprocess.run(again, capture_output=True, text=True, check=False)
  assert refused.returncode == 2 and refused.stdout == "", refused.stderr[-2000:]
  (line,) = refused.stderr.splitlines()
  assert f"{str(seed0)!r} holds a run of another config (train.lr: 0.001 -> 0.01)" in line
  # no critic: not built, checkpointed, timed or logged
  assert sorted(p.name for p in (seed0 / "checkpoints").iterdir()) == ["actor"]
  keys = set().union(*read_jsonl(seed0 / "metrics.jsonl"))
  assert "actor/pg_loss" in keys and "train/advantage/mean" in keys
  assert not [k for k in keys if k.startswith("critic/") or "old_value" in k or "values" in k]
  assert "timing_s/update_critic" not in keys
  # a run without critic resumes from its actor checkpoint
  assert common_checkpoints(seed0, roles=("actor",)) == {2, 4}
  capsys.readouterr()  # `train` in this process: what it checks needs no process of its own
  resumed = smoke_args(seed0, "ppo.advantage_estimator=grpo", "ppo.num_generations=2", "seed=3")
  resumed.append("train.steps=6")
  assert cli.main(resumed) == 0
  assert "resuming from step 4" in capsys.readouterr().err
  assert [r["step"] for r in read_jsonl(seed0 / "metrics.jsonl") if "actor/pg_loss" in r][-2:] == [
    5,
    6,
  ]


def test_variant_directories_are_unique():
  names = [v.name for v in sweep.variants(["model.alphabet=ab/,ab:"])]
  assert len(set(names)) == 2 and all(n.startswith("alphabet=ab--") for n in names)
  values = ",".join(f"{{a: {'x' * 130}{k}}}" for k in (1, 2))  # alike in the first 100
  names = [v.name for v in sweep.variants([f"env.kwargs={values}"])]
  assert len(set(names)) == 2 and all(len(n) <= 109 for n in names)
  assert len({v.name.casefold() for v in sweep.variants(["env.name=A,a"])}) == 2
  assert sweep.variants(["train.lr=0.1,0.2"])[0].name == "lr=0.1"  # lossless: no hash


def test_repeated_values_keys_and_seeds_are_refused(tmp_path):
  for overrides, message in [
    (["train.lr=0.001,0.001"], "override 'train.lr=0.001,0.001' lists '0.001' more than once"),
    (["train.lr=0.1", "train.lr=0.2,0.3"], "key 'train.lr' is given twice"),
    (["seed=3,03"], "override 'seed=3,03' lists a seed twice"),
    (["seed=-1"], "override 'seed=-1' must list seeds as integers >= 0"),
    (["train.lr=0.001,1e-3"], "variants 'lr=0.001' and 'lr=1e-3' resolve to the same config"),
    (["output_dir=elsewhere"], "override 'output_dir=elsewhere' is not the sweep's directory"),
    (["output_dir=a,b"], "override 'output_dir=a,b' is not the sweep's directory"),
  ]:
    with pytest.raises(ValueError, match=re.escape(message)):
      sweep.sweep(2, tmp_path, overrides, str(SMOKE))
  assert sweep.split_seeds(5, ["seed=3,4", "train.lr=1"]) == ([3, 4], ["train.lr=1"])
  assert sweep.split_seeds(2, []) == ([0, 1], [])
  assert list(tmp_path.iterdir()) == []


def _lock_holder(lock, process) -> int:
  """The pid written into a seed's `.lock` (waits for the file; fails if `process` exits)."""
  deadline = time.monotonic() + 600
  while process.poll() is None and time.monotonic() < deadline:
    text = lock.read_text().strip() if lock.is_file() else ""
    if text:
      return int(text)
    time.sleep(0.05)
  _, stderr = process.communicate(timeout=60)
  raise AssertionError(f"no {lock} before the sweep exited: {stderr[-2000:]}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_sweep_and_its_running_seed(tmp_path, signum):
  out = tmp_path / "sweep"
  command = [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", "sweep", "--config", str(SMOKE)]
  command += ["--output-dir", str(out), "seed=3,4"]
  process = subprocess.Popen(
    command, env=subprocess_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  child = _lock_holder(out / "default" / "seed3" / ".lock", process)
  process.send_signal(signum)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 130, stderr[-2000:]
  assert "interrupted" in stderr.splitlines()[-1]
  with pytest.raises(ProcessLookupError):  # the seed stopped with the sweep: no orphan
    os.kill(child, 0)
  assert not (out / "default" / "seed4").exists()  # and the next seed never started


def test_a_failed_variant_leaves_the_table_of_the_variants_that_finished(tmp_path, monkeypatch):
  """`model.remat=none,block` before remat could sample: block's seeds failed and the sweep
  wrote no table, not even none's."""
  keys = ("final_return", "max_return", "steps_to_reach", "peak_drop", "echo_trap_step")

  def run(self, out, overrides, seed):
    if "model.remat=block" in overrides:
      raise RuntimeError(f"seed {seed} failed (exit 1) in {out}")
    out.mkdir(parents=True)
    (out / "summary.json").write_text("{}")

  def result(run_dir):
    return dict(zip(keys, (0.5, 1.25, None, 0.0, None), strict=True)) | {
      "wall_s": 1.0,
      "curve": [0.1, 0.5],
    }

  monkeypatch.setattr(sweep.Seeds, "run", run)
  monkeypatch.setattr(sweep, "seed_result", result)
  with pytest.raises(RuntimeError, match="failed"):
    sweep.sweep(2, tmp_path, ["model.remat=none,block"], str(SMOKE), jobs=1)
  (row,) = json.loads((tmp_path / "table.json").read_text())
  assert row["variant"] == "remat=none" and row["seeds"] == 2
  assert (tmp_path / "curves.png").is_file()
