"""The metrics taxonomy: keys, statistics against NumPy, and every sink read back after a run."""

from __future__ import annotations

import json
import math
import pathlib
import sys
import warnings

import numpy as np
import pytest

from tests.helpers.wandb_files import read_wandb_run
from tunix_ppo_ext._src.metrics import keys as metric_keys
from tunix_ppo_ext._src.metrics import sinks
from tunix_ppo_ext._src.metrics import stats as batch_stats
from tunix_ppo_ext._src.metrics.keys import MetricKeys
from tunix_ppo_ext._src.metrics.sinks import (
  JsonlBackend,
  KeyedBackend,
  WandbSink,
  read_jsonl,
  read_tensorboard,
)
from tunix_ppo_ext._src.run import cli
from tunix_ppo_ext._src.run.run_config import load_run_config

pytestmark = pytest.mark.tunix

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
STATS = ("min", "mean", "max")


# ----- the table -----


@pytest.mark.parametrize(
  "event, step, key, published_step",
  [
    ("actor/train/pg_loss", 1, "actor/pg_loss", 1),  # trainers count updates done
    ("actor/eval/pg_loss", 2, "eval/actor/pg_loss", 2),
    ("actor/train/learning_rate", 1, "actor/lr", 1),
    ("critic/train/learning_rate", 1, "critic/lr", 1),
    ("batch/train/advantage/max", 0, "train/advantage/max", 1),  # the learner's step + 1
    ("batch/eval/return/mean", 4, "eval/return/mean", 4),  # evaluated after 4 updates
    ("learner/train/kl_coef", 0, "actor/kl_coef", 1),
    ("learner/eval/explained_variance", 0, "eval/critic/explained_variance", 0),
    ("timing_s/train/step", 3, "timing_s/step", 4),
    ("custom/train/hits", 0, "custom/hits", 1),
    ("actor/train/perplexity", 1, None, None),  # exp(PPO loss): dropped by default
    ("/jax/compilation_time", 1, None, None),  # JAX's own events
  ],
)
def test_events_map_to_published_keys_and_steps(event, step, key, published_step):
  keys = MetricKeys()
  assert keys.key(event) == key
  if key is not None:
    assert keys.step(event, step) == published_step


@pytest.mark.parametrize(
  "event, step, published_step",
  [
    ("actor/train/pg_loss", 3, 3),  # the trainers count updates already
    ("batch/train/advantage/max", 0, 1),  # batch 0 is trained by updates 1..4
    ("batch/train/advantage/max", 2, 9),  # batch 2 by updates 9..12
    ("learner/train/kl_coef", 1, 5),
    ("batch/eval/return/mean", 2, 8),  # evaluated after 2 batches: 8 updates
  ],
)
def test_every_key_is_published_on_the_update_axis(event, step, published_step):
  keys = MetricKeys(updates_per_batch=4)  # e.g. 2 epochs of 2 mini-batches
  assert keys.step(event, step) == published_step


def test_a_run_with_two_epochs_puts_every_key_on_one_axis(tmp_path):
  out = tmp_path / "run"
  overrides = ["ppo.num_iterations=2", "train.steps=4", "train.eval_every=2"]
  argv = ["train", "--config", str(CONFIGS / "smoke.yaml"), "--output-dir", str(out)]
  assert cli.main([*argv, *overrides]) == 0
  steps: dict[str, set[int]] = {}
  for row in read_jsonl(out / "metrics.jsonl"):
    for key in row:
      steps.setdefault(key, set()).add(row["step"])
  assert steps["actor/pg_loss"] == {1, 2, 3, 4}  # four updates
  assert steps["train/episode_return/mean"] == {1, 3}  # two batches, at their first update
  assert steps["eval/return/mean"] == {0, 2}  # before training, after the first batch
  assert max(max(s) for s in steps.values()) == 4
  assert json.loads((out / "summary.json").read_text())["steps"] == 2  # batches


def test_taxonomy_covers_the_documented_keys():
  known = set(metric_keys.known_keys())
  families = [f"train/{f}/{s}" for f in metric_keys.BATCH_FAMILIES for s in STATS]
  documented = {
    *families,
    "train/truncated_frac",
    "train/episode_return_std",
    "train/in_group_return_std",
    "train/echo_trap",
    "eval/return/mean",
    *(f"actor/{n}" for n in ("pg_loss", "entropy", "entropy_coef", "pg_clipfrac", "kl_coef")),
    *(f"actor/{n}" for n in ("pg_clipfrac_lower", "ppo_kl", "kl", "kl_loss", "grad_norm", "lr")),
    *(f"critic/{n}" for n in ("vf_loss", "vf_clipfrac", "vpred_mean", "explained_variance")),
    "critic/grad_norm",
    "critic/lr",
    "rollout/logprob_diff",
    "rollout/tokens_per_s",
    "rollout/completion_tokens_per_s",
    *(f"timing_s/{n}" for n in ("rollout", "old_logp", "ref_logp", "values", "advantages")),
    *(f"timing_s/{n}" for n in ("update_actor", "update_critic", "step")),
  }
  assert documented <= known, documented - known


def test_renames_and_drops_apply_to_published_keys():
  keys = MetricKeys(rename={"actor/pg_loss": "policy/loss"}, drop=["timing_s/*", "eval/*"])
  assert keys.key("actor/train/pg_loss") == "policy/loss"
  assert keys.key("timing_s/train/rollout") is None
  assert keys.key("batch/eval/return/mean") is None
  assert keys.key("batch/train/return/mean") == "train/return/mean"


@pytest.mark.parametrize(
  "rename, drop, message",
  [
    ({"actor/pg_los": "x"}, (), r"unknown metric 'actor/pg_los'; did you mean 'actor/pg_loss'"),
    ({"actor/pg_loss": ""}, (), r"must be a non-empty key"),
    ({"actor/pg_loss": "/x"}, (), r"not starting with '/'"),
    ({}, ("timing/*",), r"'timing/\*' matches no metric"),
    ({}, ("",), r"non-empty strings"),
    ({"actor/pg_loss": "actor/kl"}, (), r"'actor/kl': that key is already published"),
    ({"actor/pg_loss": "x", "actor/kl": "x"}, (), r"two metrics renamed to 'x'"),
  ],
)
def test_bad_renames_and_drops_are_rejected(rename, drop, message):
  with pytest.raises(ValueError, match=message):
    MetricKeys(rename=rename, drop=drop)


def test_a_swap_of_two_keys_is_allowed():
  keys = MetricKeys(rename={"actor/pg_loss": "actor/kl", "actor/kl": "actor/pg_loss"})
  assert keys.key("actor/train/pg_loss") == "actor/kl"


def test_run_config_checks_the_metrics_section_before_anything_compiles():
  with pytest.raises(ValueError, match="unknown metric 'actor/pgloss'"):
    load_run_config(None, ["metrics.rename={actor/pgloss: x}"])
  with pytest.raises(ValueError, match="must keep 'train/episode_return/mean'"):
    load_run_config(None, ["metrics.drop=[train/*]"])
  with pytest.raises(ValueError, match=r"'metrics.drop\[0\]' must be str"):
    load_run_config(None, ["metrics.drop=[3]"])


def test_user_metrics_land_in_custom_unless_they_name_a_section():
  assert metric_keys.custom_name("hits") == "custom/hits"
  assert metric_keys.custom_name("game/hits") == "game/hits"


# ----- the statistics, against NumPy -----


# the per-token `[B, T]` inputs of `batch_statistics` besides the loss mask, in this order
PER_TOKEN = ("token_rewards", "rewards", "values", "advantages", "returns")


def _reference_stats(mask, token_rewards, rewards, values, advantages, returns):
  """Written from the definitions, one row at a time."""
  out = {}
  for name, per_token in (("old_value", values), ("advantage", advantages), ("return", returns)):
    selected = [
      per_token[i, j] for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j]
    ]
    if selected:
      out |= {f"batch/{name}/min": min(selected), f"batch/{name}/max": max(selected)}
      out[f"batch/{name}/mean"] = sum(selected) / len(selected)
  per_row = {
    "score": [sum(r) for r in token_rewards],
    "reward": [sum(r) for r in rewards],
    "episode_return": [sum(r) for r in token_rewards],
    "response_length": [int(sum(m)) for m in mask],
    "num_turns": [1.0] * mask.shape[0],
  }
  for name, column in per_row.items():
    out |= {f"batch/{name}/min": min(column), f"batch/{name}/max": max(column)}
    out[f"batch/{name}/mean"] = sum(column) / len(column)
  returns = per_row["episode_return"]
  mean = sum(returns) / len(returns)
  out["batch/episode_return_std"] = (sum((r - mean) ** 2 for r in returns) / len(returns)) ** 0.5
  return out


@pytest.mark.parametrize("empty_rows", [(), (1,), (0, 2)])
def test_batch_statistics_match_numpy_with_empty_mask_rows(empty_rows):
  rng = np.random.default_rng(len(empty_rows))
  b, t = 3, 5
  mask = (rng.random((b, t)) < 0.6).astype(np.int32)
  mask[0, 0] = mask[1, 1] = mask[2, 2] = 1
  mask[list(empty_rows)] = 0
  arrays = {n: rng.normal(size=(b, t)) for n in PER_TOKEN}
  got = batch_stats.batch_statistics(loss_mask=mask, **arrays)
  want = _reference_stats(mask, *arrays.values())
  assert got.keys() == want.keys()
  for key, value in want.items():
    assert got[key] == pytest.approx(value, rel=1e-12), key


def test_an_all_empty_loss_mask_skips_per_token_statistics():
  zeros = np.zeros((2, 4))
  got = batch_stats.batch_statistics(loss_mask=zeros, **dict.fromkeys(PER_TOKEN, zeros))
  assert not any(k.startswith(("batch/old_value", "batch/advantage", "batch/return/")) for k in got)
  assert got["batch/response_length/max"] == 0 and all(math.isfinite(v) for v in got.values())


def test_episode_outcomes_of_a_multi_turn_source_are_used():
  mask = np.ones((2, 3))
  got = batch_stats.batch_statistics(
    loss_mask=mask,
    **dict.fromkeys(PER_TOKEN, np.zeros((2, 3))),
    episode_returns=np.array([1.0, 0.25]),
    num_turns=np.array([2, 3]),
    truncated=np.array([True, False]),
    turn_limited=np.array([False, False]),
    group_ids=np.array([4, 4]),
  )
  assert got["batch/episode_return/mean"] == 0.625 and got["batch/num_turns/max"] == 3
  assert got["batch/episode_return_std"] == got["batch/in_group_return_std"] == 0.375
  assert got["batch/truncated_frac"] == 0.5 and got["batch/turn_limit_frac"] == 0.0


def test_explained_variance_matches_its_formula_and_is_skipped_when_undefined():
  rng = np.random.default_rng(0)
  values, returns = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
  mask = np.ones((3, 4))
  mask[2] = 0
  r, v = returns[:2].ravel(), values[:2].ravel()
  want = 1 - np.var(r - v) / np.var(r)
  assert batch_stats.explained_variance(values, returns, mask) == pytest.approx(want)
  assert batch_stats.explained_variance(values, np.ones((3, 4)), mask) is None  # Var = 0
  nearly = 1.25 + 1e-6 * np.arange(12.0).reshape(3, 4)  # a solved task: rounding noise only
  assert batch_stats.explained_variance(values, nearly, mask) is None
  assert batch_stats.explained_variance(values, 1e-3 * returns, mask) is not None  # small scale
  assert batch_stats.explained_variance(values, returns, np.zeros((3, 4))) is None


# ----- sinks -----


def test_keyed_backend_renames_and_drops_before_the_sink(tmp_path):
  keys = MetricKeys(rename={"actor/pg_loss": "policy/loss"}, drop=["timing_s/*"])
  sink = KeyedBackend(JsonlBackend(tmp_path / "m.jsonl"), keys)
  sink.log_scalar("actor/train/pg_loss", np.float32(0.5), step=1)
  sink.log_scalar("timing_s/train/step", 2.0, step=0)
  sink.log_scalar("batch/train/return/mean", 0.25, step=0)
  sink.log_scalar("/jax/internal", 1.0, step=0)
  sink.close()
  assert read_jsonl(tmp_path / "m.jsonl") == [
    {"step": 1, "policy/loss": 0.5, "train/return/mean": 0.25}
  ]


def test_wandb_not_installed_gives_one_warning_and_a_silent_sink(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sink = WandbSink("offline", tmp_path, {})
    for step in range(3):
      sink.log_scalar("actor/pg_loss", 1.0, step=step)
    sink.close()
  assert not sink.active
  assert [str(w.message) for w in caught] == ["W&B disabled for this run: wandb is not installed"]


def test_wandb_failing_at_init_gives_one_warning(tmp_path, monkeypatch):
  import wandb

  def failing_init(**kwargs):
    raise wandb.errors.CommError("no route to api.wandb.ai")

  monkeypatch.setattr(wandb, "init", failing_init)
  with pytest.warns(UserWarning, match="W&B disabled for this run: CommError") as caught:
    sink = WandbSink("online", tmp_path, {})
    sink.log_scalar("actor/pg_loss", 1.0, step=1)
    sink.close()
  assert len(caught) == 1 and not sink.active


def test_a_wandb_mode_w_and_b_refuses_is_one_line_naming_it(tmp_path, monkeypatch):
  """`WANDB_MODE=bogus` turned W&B off with pydantic's 5-line ValidationError as the
  warning (glued to the progress bar in `train`)."""
  monkeypatch.setenv("WANDB_MODE", "bogus")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sink = WandbSink("offline", tmp_path, {})
    sink.log_scalar("actor/pg_loss", 1.0, step=1)
    sink.close()
  assert not sink.active
  (message,) = [str(w.message) for w in caught]
  assert message.startswith("W&B disabled for this run: WANDB_MODE='bogus' is not a W&B mode")
  assert "\n" not in message and "'offline'" in message


def test_train_says_once_before_the_bar_that_w_and_b_is_off(tmp_path, monkeypatch, capsys):
  from tunix_ppo_ext._src.run import job

  monkeypatch.setenv("WANDB_MODE", "bogus")
  monkeypatch.setattr(job, "train", lambda resolved, meshes: None)  # the run: not under test
  out = str(tmp_path / "run")
  assert cli.main(["train", "--debug", "--output-dir", out, "wandb=offline"]) == 0
  err = capsys.readouterr().err
  line = "tunix-ppo-ext: warning: W&B is off for this run: WANDB_MODE='bogus' is not a W&B mode"
  assert err.count(line) == 1, err


# ----- one real run, read back from every sink -----

RENAMED = ("actor/pg_loss", "policy/pg_loss")
DROPPED = "timing_s/values"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  """The smoke config from a relative output dir, W&B offline, one rename and one drop."""
  root = tmp_path_factory.mktemp("smoke")
  args = ["train", "--config", str(CONFIGS / "smoke.yaml"), "--output-dir", "run"]
  args += ["wandb=offline", f"metrics.rename={{{RENAMED[0]}: {RENAMED[1]}}}"]
  args += [f"metrics.drop=[{DROPPED}]"]
  with pytest.MonkeyPatch.context() as patch:
    patch.chdir(root)  # relative, as the default `runs/default`
    assert cli.main(args) == 0
  return root / "run", load_run_config(str(CONFIGS / "smoke.yaml"))


def _expected_train_keys() -> set[str]:
  keys = {metric_keys.published_key(n, "train") for n in metric_keys.TAXONOMY}
  keys = {k for k in keys if k is not None and not k.startswith("eval/")}
  keys -= metric_keys.CONDITIONAL_KEYS  # rollout correction is off in the smoke config
  keys -= {"rollout/chat_template_mismatch"}  # only with env.chat_template (test_chat.py)
  keys -= {"train/echo_trap"}  # once, where the Echo Trap rule fires (test_collapse.py)
  keys -= {"train/in_group_return_std"}  # only with groups: the smoke config has groups of one
  return (keys - {RENAMED[0], DROPPED}) | {RENAMED[1]}


def _check_taxonomy(series: dict[str, list[tuple[int, float]]], steps: int, where: str) -> None:
  """`series`: key -> [(step, value)] as one sink recorded it."""
  every_step = list(range(1, steps + 1))
  for key in _expected_train_keys():
    points = series.get(key, [])
    assert all(math.isfinite(v) for _, v in points), (where, key)
    if key == "critic/explained_variance":  # undefined (skipped) when returns are constant
      assert {s for s, _ in points} <= set(every_step), (where, key)
    else:
      assert [s for s, _ in points] == every_step, (where, key, points)
  assert RENAMED[0] not in series and DROPPED not in series, where
  assert "eval/return/mean" in series and "eval/actor/entropy" in series, where
  eval_steps = {s for s, _ in series["eval/return/mean"]}  # after 0, 2, ... updates
  assert eval_steps == {s for s, _ in series["eval/actor/entropy"]}, where
  assert eval_steps and eval_steps <= {0, *every_step}, where


def _series_of_rows(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
  series: dict[str, list[tuple[int, float]]] = {}
  for row in rows:
    for key, value in row.items():
      if key != "step" and value is not None:
        series.setdefault(key, []).append((row["step"], value))
  return series


def test_jsonl_holds_the_taxonomy_at_every_step(smoke_run):
  out, run = smoke_run
  _check_taxonomy(_series_of_rows(read_jsonl(out / "metrics.jsonl")), run.train.steps, "jsonl")
  summary = json.loads((out / "summary.json").read_text())
  returns = ("first_return", "final_return", "best_return", "max_return")
  counts = ("steps", "updates", "wall_s", "parts", "resumes", "memory")
  assert set(summary) == {*returns, *counts}
  assert summary["updates"] == run.train.steps and summary["resumes"] == []
  assert summary["steps"] == run.train.steps
  memory = summary["memory"]  # full fine-tuning: all trained, the reference a separate copy
  assert memory["actor"]["params"]["trainable"] == memory["actor"]["params"]["total"]
  assert memory["model_bytes"] == memory["model_bytes_if_separate"]
  assert 0 <= summary["final_return"] <= summary["max_return"]
  assert list((out / "checkpoints" / "actor").iterdir())


def test_tensorboard_holds_the_taxonomy(smoke_run):
  out, run = smoke_run
  _check_taxonomy(read_tensorboard(out / "tensorboard"), run.train.steps, "tensorboard")


def test_wandb_offline_run_holds_the_taxonomy_and_the_config(smoke_run):
  out, run = smoke_run
  (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
  history, config = read_wandb_run(run_file)
  series: dict[str, list[tuple[int, float]]] = {}
  for row in history:
    for key, value in row.items():
      if not key.startswith("_") and key != WandbSink.STEP_KEY:
        series.setdefault(key, []).append((row[WandbSink.STEP_KEY], value))
  series = {k: sorted(v) for k, v in series.items()}
  _check_taxonomy(series, run.train.steps, "wandb")
  assert config["train"]["steps"] == run.train.steps and config["wandb"] == "offline"


def test_user_metric_keys_the_rollout_sampler_and_timing_are_sensible(smoke_run):
  out, run = smoke_run
  rows = [r for r in read_jsonl(out / "metrics.jsonl") if "train/return/mean" in r]
  assert len(rows) == run.train.steps
  # sampler vs trainer log-probs on agent tokens; they differ only after an agent-sampled
  # pad id, which tunix's sampler masks out of its own context
  assert max(r["rollout/logprob_diff"] for r in rows) < 0.1
  for row in rows:
    phases = sum(row[f"timing_s/{p}"] for p in ("rollout", "old_logp", "ref_logp", "advantages"))
    assert 0 < phases <= row["timing_s/step"]
    assert row["timing_s/update_actor"] > 0 and row["timing_s/update_critic"] > 0
    assert 0 < row["rollout/tokens_per_s"] <= row["rollout/completion_tokens_per_s"]
    # per second of rollout: the batch's agent tokens (loss mask) and every real completion
    # token (attention mask), the totals of the batch statistics' per-row means
    tokens = {
      "rollout/tokens_per_s": row["train/response_length/mean"],
      "rollout/completion_tokens_per_s": row["generation/completions/mean_length"],
    }
    for key, mean_length in tokens.items():
      assert row[key] * row["timing_s/rollout"] == pytest.approx(
        mean_length * run.train.batch_size, rel=1e-4
      ), key
  # the default actor schedule: cosine from train.lr down to a tenth of it
  lrs = [r["actor/lr"] for r in rows]
  assert lrs[0] <= run.train.lr and lrs == sorted(lrs, reverse=True)  # logged after an update
  assert lrs[-1] >= 0.1 * run.train.lr * (1 - 1e-6)


def test_plot_command_draws_the_curves(smoke_run, capsys):
  out, _ = smoke_run
  assert cli.main(["plot", str(out)]) == 0
  png = pathlib.Path(capsys.readouterr().out.strip())
  assert png == out / "curves.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert cli.main(["plot", str(out / "nowhere")]) == 2


def test_wandb_online_without_network_falls_back_to_an_offline_run(tmp_path, monkeypatch):
  import wandb

  from tunix_ppo_ext._src.metrics import sinks

  real_init = wandb.init

  def init_without_network(**kwargs):
    if kwargs["mode"] == "online":
      raise wandb.errors.CommError("no route to api.wandb.ai")
    return real_init(**kwargs)

  monkeypatch.setattr(sinks, "has_wandb_key", lambda: True)
  monkeypatch.setattr(wandb, "init", init_without_network)
  with pytest.warns(UserWarning, match=r"W&B online failed \(CommError.*\); offline"):
    sink = WandbSink("online", tmp_path, {"seed": 0})
  sink.log_scalar("actor/pg_loss", 0.5, step=1)
  sink.close()
  (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
  history, config = read_wandb_run(run_file)
  assert [row["actor/pg_loss"] for row in history if "actor/pg_loss" in row] == [0.5]
  assert config["seed"] == 0


@pytest.mark.parametrize("bad", ["metrics.jsonl", "samples.jsonl"])
def test_a_rerun_s_cut_names_a_file_that_is_not_utf8_and_rewrites_neither(tmp_path, bad):
  """A rerun cuts `metrics.jsonl` and `samples.jsonl` back to its checkpoint; a byte that
  is not UTF-8 in either was Python's `UnicodeDecodeError` naming no file, after the other
  file had been rewritten."""
  files = [tmp_path / "metrics.jsonl", tmp_path / "samples.jsonl"]
  for file in files:
    file.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n')
  (tmp_path / bad).write_bytes((tmp_path / bad).read_bytes() + b'{"step": 3, "a": "\xff"}\n')
  before = {file: file.read_bytes() for file in files}
  with pytest.raises(ValueError, match=rf"^{tmp_path / bad}: not UTF-8 text \(byte \d+"):
    sinks.truncate_jsonl_files(files, 1)
  assert {file: file.read_bytes() for file in files} == before
  with pytest.raises(ValueError, match=rf"^{tmp_path / bad}: not UTF-8 text"):
    sinks.truncate_jsonl(tmp_path / bad, 1)


def test_a_rerun_s_cut_keeps_the_steps_up_to_the_checkpoint(tmp_path):
  files = [tmp_path / "metrics.jsonl", tmp_path / "samples.jsonl", tmp_path / "missing.jsonl"]
  for file in files[:2]:
    file.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n')
  assert sinks.truncate_jsonl_files(files, 1) == [1, 1, 0]
  assert not files[2].exists()
  assert files[1].read_text() == '{"step": 1, "a": 1}\n'
