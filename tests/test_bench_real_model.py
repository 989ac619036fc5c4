"""`bench/real_model.py`'s arithmetic: per-seed summaries and the side-by-side report."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.helpers.bench import load_bench

pytestmark = pytest.mark.tunix


def _bench():
  return load_bench("real_model")


def _rows(success: list[float], returns: list[float]) -> list[dict]:
  return [
    {"step": k + 1, "train/success_rate": s, "train/episode_return/mean": r}
    | {"train/response_length/mean": 10.0 + k, "timing_s/rollout": 2.0, "timing_s/step": 4.0 + k}
    for k, (s, r) in enumerate(zip(success, returns, strict=True))
  ]


def test_summarize_takes_the_last_quarter_and_counts_tokens_per_second_of_the_batch():
  bench = _bench()
  success = [0.0, 0.0, 0.125, 0.25, 0.5, 0.25, 0.375, 0.5]
  returns = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
  summary = bench.summarize(_rows(success, returns), 0.25, batch=8)
  assert summary["batches"] == 8
  assert summary["success"] == (0.375 + 0.5) / 2  # a quarter of 8 batches: the last 2
  assert abs(summary["return"] - 0.75) < 1e-12
  tokens = 8 * sum(10.0 + k for k in range(8))
  assert summary["rollout_tokens_per_s"] == tokens / (2.0 * 8)
  assert summary["step_tokens_per_s"] == tokens / sum(4.0 + k for k in range(8))
  assert summary["step_s_median"] == 7.5
  whole = bench.summarize(_rows(success[:1], returns[:1]), 0.25, batch=8)
  assert whole["success"] == 0.0 and whole["return"] == 0.1  # at least one batch is kept


def test_report_pools_the_baseline_batches_and_spreads_the_trained_seeds():
  bench = _bench()
  seeds = {}
  for seed, (base, done) in enumerate([([0.0, 0.25], 0.5), ([0.125, 0.0], 0.25), ([0.5], 1.0)]):
    seeds[str(seed)] = {
      "baseline": bench.summarize(_rows(base, base), 1.0, batch=8),
      "trained": bench.summarize(_rows([0.0, done], [0.0, done]), 0.5, batch=8),
    }
  results = {
    "args": {
      "config": "configs/smoke.yaml",
      "overrides": ["ppo.advantage_estimator=rloo", "ppo.num_generations=2"],
    },
    "seeds": seeds,
  }
  (row,) = bench.report([results]).splitlines()[2:]
  cells = [c.strip() for c in row.strip("|").split("|")]
  pooled = [0.0, 0.25, 0.125, 0.0, 0.5]
  trained = [0.5, 0.25, 1.0]

  def spread(values):
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return f"{mean:.3f} ± {sd:.3f} [{min(values):.3f}, {max(values):.3f}]"

  assert cells[:4] == ["smoke: rloo ppo.num_generations=2", "3", spread(pooled), spread(trained)]
  assert cells[4:6] == [spread(pooled), spread(trained)]  # returns: the same values here
  assert cells[6] == "-"  # no critic: no explained variance
  assert cells[7] == "-"  # rows without the advantage noise (runs from before it was logged)
  assert cells[8] == f"{statistics.median([4.5, 4.5, 4.5]):.1f}"


def test_the_advantage_noise_is_the_seeds_mean_over_their_last_quarter():
  bench = _bench()
  done = []
  for token in ([1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 8.0]):
    rows = _rows([0.0] * 4, [0.0] * 4)
    for row, value in zip(rows, token, strict=True):
      row["actor/advantage_sq_mean"] = value
      row["actor/advantage_sq_mean_turn"] = value / 2
    done.append(bench.summarize(rows, 0.25, batch=8))
  assert [d["advantage_sq_mean"] for d in done] == [4.0, 8.0]
  assert bench._noise(done) == "6.0000 (3.0000)"


def test_the_critic_s_explained_variance_is_summarized_and_seeds_gather_from_their_files(
  tmp_path,
):
  bench = _bench()
  rows = _rows([0.0] * 4, [0.0] * 4)
  for row, explained in zip(rows, [-1.0, 0.0, 0.5, 0.7], strict=True):
    row["critic/explained_variance"] = explained
  summary = bench.summarize(rows, 0.5, batch=8)
  assert summary["explained_variance"] == 0.6 and summary["explained_variance_curve"][0] == -1.0
  assert bench.summarize(_rows([0.0], [0.0]), 0.5, batch=8)["explained_variance"] is None
  for seed in (2, 0, 10):  # written by separate processes, in any order
    (tmp_path / f"seed{seed}").mkdir()
    (tmp_path / f"seed{seed}" / "result.json").write_text(f'{{"trained": {seed}}}')
  args = bench.argparse.Namespace(config="c.yaml", overrides=[], seed_ids=[2])
  results = bench.gather(args, tmp_path)
  assert list(results["seeds"]) == ["0", "2", "10"] and results["seeds"]["10"] == {"trained": 10}
  assert results["args"] == {"config": "c.yaml", "overrides": []}
  assert (tmp_path / "results.json").is_file()
  for seed in (0, 2, 10):  # a fresh clone: results.json committed, no seed directories
    (tmp_path / f"seed{seed}" / "result.json").unlink()
  (tmp_path / "seed3").mkdir()
  (tmp_path / "seed3" / "result.json").write_text('{"trained": 3}')
  again = bench.gather(args, tmp_path)
  assert list(again["seeds"]) == ["0", "2", "3", "10"]  # the earlier seeds kept


def test_a_baseline_is_reused_from_another_bench_and_a_missing_one_is_named(tmp_path):
  bench = _bench()
  baseline = {"success": 0.125, "success_curve": [0.0, 0.25]}
  (tmp_path / "seed1").mkdir()
  (tmp_path / "seed1" / "result.json").write_text(json.dumps({"baseline": baseline}))
  assert bench._reused_baseline(tmp_path, 1) == baseline
  with pytest.raises(SystemExit, match=r"--baseline-from: no .*seed2/result.json nor seed 2"):
    bench._reused_baseline(tmp_path, 2)
  other = {"success": 0.5, "success_curve": [0.5]}  # a clone: results.json, no seed directory
  (tmp_path / "results.json").write_text(json.dumps({"seeds": {"2": {"baseline": other}}}))
  assert bench._reused_baseline(tmp_path, 2) == other


@pytest.mark.parametrize(
  ("argv", "named"),
  [
    (["--seeds", "0"], "--seeds 0: no seed to run"),
    (["--steps", "0"], "the trained run of seed 0: config key 'train.steps'=0 is invalid"),
    (["--baseline-steps", "-1"], "--baseline-steps -1: 0 (no baseline run) or more"),
    (["--seed-ids", "-1"], "config key 'seed'=-1 is invalid"),
    (["ppo.gae_lamda=0.5"], "unknown config key 'ppo.gae_lamda'"),
    (["--config", "no/such.yaml"], "--config 'no/such.yaml': no such file"),
    (["--baseline-from", "no/such/dir", "--seed-ids", "0"], "--baseline-from: no no/such/dir"),
  ],
)
def test_bad_arguments_are_one_line_before_any_run(argv, named, tmp_path, monkeypatch, capsys):
  """Each was a traceback (--seeds 0: UnboundLocalError), or came after the baseline's
  minutes of training (--steps 0), or exited 1."""
  bench = _bench()
  monkeypatch.setattr(bench, "run_seed", lambda *a: pytest.fail("a run started"))
  argv = ["--config", "configs/smoke.yaml", "--out", str(tmp_path), *argv]
  monkeypatch.setattr("sys.argv", ["real_model.py", *argv])
  with pytest.raises(SystemExit) as exit_:
    bench.main()
  assert exit_.value.code == 2
  assert named in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_report_of_an_unreadable_results_json_is_one_line(tmp_path, monkeypatch, capsys):
  bench = _bench()
  (tmp_path / "results.json").write_text('{"seeds": {')  # cut short
  monkeypatch.setattr("sys.argv", ["real_model.py", "--report", str(tmp_path)])
  with pytest.raises(SystemExit) as exit_:
    bench.main()
  assert exit_.value.code == 2
  assert "results.json is not readable JSON" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["option", "environment"])
def test_committed_seeds_rerun_with_rerun_or_bench_rerun(how, tmp_path, monkeypatch, capsys):
  """A fresh clone has `results.json` (committed) and no seed directories: its seeds counted
  as done, so the study scripts trained nothing and printed the committed tables. With
  `--rerun` (or `BENCH_RERUN=1`, which the study scripts pass on) a seed only the committed
  file holds runs again; one with its own `seed<N>/result.json` here is still kept."""
  bench = _bench()
  trained = bench.summarize(_rows([0.0] * 4, [0.0] * 4), 0.25, batch=8)
  committed = {"trained": trained, "baseline": None, "wall_s": [0.0, 1.0]}
  (tmp_path / "results.json").write_text(json.dumps({"seeds": {"0": committed, "1": committed}}))
  (tmp_path / "seed1").mkdir()
  (tmp_path / "seed1" / "result.json").write_text(json.dumps(committed))
  ran = []

  def run_once(config, out, overrides):
    ran.append(out.parent.name)
    out.mkdir(parents=True)
    return _rows([0.5] * 4, [1.0] * 4)

  monkeypatch.setattr(bench, "run_once", run_once)
  monkeypatch.setattr(bench, "_batch_size", lambda *a: 8)
  monkeypatch.setattr(bench, "plot", lambda *a: None)
  argv = ["--config", "configs/smoke.yaml", "--out", str(tmp_path), "--seeds", "2"]
  argv += ["--baseline-steps", "0"]
  monkeypatch.setattr("sys.argv", ["real_model.py", *argv])
  bench.main()  # as committed: nothing runs
  assert ran == [] and "seed 0: finished already" in capsys.readouterr().out
  if how == "option":
    monkeypatch.setattr("sys.argv", ["real_model.py", *argv, "--rerun"])
  else:
    monkeypatch.setenv("BENCH_RERUN", "1")
  bench.main()
  assert ran == ["seed0"]
  seeds = json.loads((tmp_path / "results.json").read_text())["seeds"]
  assert seeds["0"]["trained"]["success"] == 0.5 and seeds["1"] == committed
