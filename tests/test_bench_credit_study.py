"""`bench/credit_study.py`'s scheduling: which seed of which arm runs next."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.helpers.bench import load_bench

pytestmark = pytest.mark.tunix


@pytest.mark.parametrize("how", ["option", "environment"])
def test_committed_seeds_rerun_with_rerun_or_bench_rerun(how, tmp_path, monkeypatch):
  """A fresh clone holds each arm's committed `results.json` and no seed directories: every
  seed counted as done and `run` trained nothing. With `--rerun` (or `BENCH_RERUN=1`) the
  committed seeds run again, each once, `real_model.py` told to rerun them too."""
  bench = load_bench("credit_study")
  for arm in ("grpo", "ppo"):
    (tmp_path / arm).mkdir()
    seeds = {"0": {"trained": {}}, "1": {"trained": {}}}
    (tmp_path / arm / "results.json").write_text(json.dumps({"seeds": seeds}))
  commands = []

  def run(command, check, cwd, env):
    assert env == bench.seed_env(os.environ)  # the study's compilation cache settings
    commands.append(command)
    out, seed = command[command.index("--out") + 1], command[command.index("--seed-ids") + 1]
    (tmp_path / out / f"seed{seed}").mkdir(parents=True)
    (tmp_path / out / f"seed{seed}" / "result.json").write_text("{}")

  monkeypatch.setattr(bench.subprocess, "run", run)
  monkeypatch.setattr(bench, "available", lambda arm: True)
  argv = ["credit_study.py", "run", "--seeds", "2", "--arms", "grpo", "ppo"]
  monkeypatch.setattr("sys.argv", [*argv, "--out", str(tmp_path)])
  bench.main()  # as committed: nothing runs
  assert commands == []
  if how == "option":
    monkeypatch.setattr("sys.argv", [*argv, "--out", str(tmp_path), "--rerun"])
  else:
    monkeypatch.setenv("BENCH_RERUN", "1")
  bench.main()
  ran = [(c[c.index("--out") + 1][-4:], c[c.index("--seed-ids") + 1]) for c in commands]
  assert ran == [("grpo", "0"), ("/ppo", "0"), ("grpo", "1"), ("/ppo", "1")]
  assert all("--rerun" in command for command in commands)


def test_a_sigterm_to_the_study_ends_the_seed_s_training_process(tmp_path):
  """`run` trains each seed in a child process; a SIGTERM to the study (as `kill` sends)
  ended the study but left the child training, orphaned, beside whatever ran next. Now
  the child is killed with it and the study says why it stopped."""
  script = tmp_path / "study.py"
  script.write_text(
    textwrap.dedent(
      f"""\
      import sys
      sys.path.insert(0, {str(pathlib.Path(__file__).resolve().parents[1])!r})
      from tests.helpers.bench import load_bench
      child = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
      load_bench("credit_study").train_seed([sys.executable, "-c", child])
      """
    )
  )
  study = subprocess.Popen(
    [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  child = int(study.stdout.readline())  # the child is up: it printed its pid
  study.send_signal(signal.SIGTERM)
  _, err = study.communicate(timeout=60)
  assert study.returncode == 1 and "stopped by signal 15" in err, err
  with pytest.raises(ProcessLookupError):
    os.kill(child, 0)


def test_the_seeds_share_a_compilation_cache_unless_the_caller_chose_one():
  """Each seed's process keeps every program in the study's persistent compilation cache,
  so the next seeds of an arm load what the first compiled; a caller's own settings win."""
  bench = load_bench("credit_study")
  env = bench.seed_env({"PATH": "/bin"})
  assert env == {
    "PATH": "/bin",
    "JAX_COMPILATION_CACHE_DIR": str(bench.XLA_CACHE),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
  }
  mine = {"JAX_COMPILATION_CACHE_DIR": "/mine", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1"}
  assert bench.seed_env(mine) == mine


def test_the_batch_table_averages_each_seed_s_window_and_keeps_the_seeds_measured(tmp_path):
  """`report`'s second table: per seed, each metric's mean over the window's batches (for
  PPO after its critic-only steps), kept in `batches.json` for a clone without the seed
  directories; per arm, the mean ± standard error over seeds."""
  bench = load_bench("credit_study")
  for seed, level in (("0", 1.0), ("1", 3.0)):
    trained = tmp_path / "ppo" / f"seed{seed}" / "trained"
    trained.mkdir(parents=True)
    rows = [
      {"step": step, "actor/advantage_noise_turn": level if step > 24 else 100.0}
      for step in range(1, 57)
    ]
    rows.append({"step": 30, "critic/explained_variance": float("nan")})
    (trained / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (trained.parent / "result.json").write_text(json.dumps({"trained": {}}))
  lines = bench.batch_table(tmp_path, ["ppo"])
  assert json.loads((tmp_path / "batches.json").read_text()) == {
    "ppo": {"0": {"noise per turn": 1.0}, "1": {"noise per turn": 3.0}}
  }
  assert lines[-1].startswith("| ppo | 2 (0, 1) | 2.0000 ± 1.0000 | - |"), lines[-1]
  for seed in ("0", "1"):  # a clone: the seed directories gone, the kept file read
    (tmp_path / "ppo" / f"seed{seed}" / "trained" / "metrics.jsonl").unlink()
  assert bench.batch_table(tmp_path, ["ppo"])[-1] == lines[-1]


def test_the_gain_table_is_welch_s_one_sided_test_of_the_predicted_gain():
  """p of "the arm's success is 0.05 or more above GRPO's", against Welch's t written out
  (Welch-Satterthwaite degrees of freedom)."""
  from scipy import stats

  bench = load_bench("credit_study")
  grpo, ppo = [0.20, 0.23, 0.25, 0.21], [0.15, 0.19, 0.16]
  (row,) = [line for line in bench.gain_table({"grpo": grpo, "ppo": ppo}) if "| ppo |" in line]
  va, vb = np.var(ppo, ddof=1) / 3, np.var(grpo, ddof=1) / 4
  t = (np.mean(ppo) - 0.05 - np.mean(grpo)) / np.sqrt(va + vb)
  df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
  diff = np.mean(ppo) - np.mean(grpo)
  assert row == f"| ppo | {diff:+.3f} ± {np.sqrt(va + vb):.3f} | {stats.t.cdf(t, df):.4f} |"


def test_the_shadow_table_pairs_each_estimator_s_cosine_with_grpo_s_on_the_same_batches(
  tmp_path,
):
  """`ppo_shadows`: each estimator's `grad_cosine` over the batches after 8 critic-only
  steps and 8 updates, and its difference from GRPO's batch by batch (a paired standard
  error), kept in `shadows.json`; a batch without every cosine (a shadow that failed to
  give one) is left out, not half counted; the study's arms stay the default."""
  bench = load_bench("credit_study")
  trained = tmp_path / "ppo_shadows" / "seed0" / "trained"
  trained.mkdir(parents=True)
  rng = np.random.default_rng(0)
  rows, grpo, gae = [], [], []
  for step in range(1, 33):
    cos = {name: float(rng.uniform(-0.2, 0.6)) for name in bench.SHADOWS}
    rows.append({"step": step, **{f"shadow/{n}/grad_cosine": v for n, v in cos.items()}})
    if step >= 17 and step != 20:  # step 20's GRPO cosine is NaN below
      grpo.append(cos["grpo"])
      gae.append(cos["turn_gae"])
  rows.append({"step": 20, "shadow/grpo/grad_cosine": float("nan")})  # read with step 20's
  (trained / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  lines = bench.shadow_table(tmp_path)
  assert json.loads((tmp_path / "shadows.json").read_text())["0"]["grpo"] == grpo
  paired = np.subtract(gae, grpo)
  se = np.std(paired, ddof=1) / np.sqrt(len(paired))
  (row,) = [line for line in lines if line.startswith("| turn_gae |")]
  assert row.endswith(f"| {np.mean(paired):+.3f} ± {se:.3f} |"), row
  assert "(15 batches" in lines[0] and "ppo_shadows" not in bench.STUDY
