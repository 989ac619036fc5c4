"""Inputs that used to get a cryptic answer (a traceback, Python's error without the file or
key, a silent oddity) answered in one line naming the culprit, exit 1 or 2."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.helpers.runs import smoke_args
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.run import cli
from tunix_ppo_ext._src.run.run_config import load_run_config

pytestmark = pytest.mark.tunix

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_a_yaml_merge_key_is_read_as_pyyaml_reads_it(tmp_path):
  """`<<: *anchor` (YAML 1.1's merge key, PyYAML's safe loader takes it) was "invalid
  YAML": the duplicate-key check constructed the `<<` key before the merge. A key of the
  mapping's own overrides the merged one, as in PyYAML."""
  file = tmp_path / "run.yaml"
  file.write_text(
    "optim:\n  actor: &opt\n    clip_grad_norm: 0.5\n    schedule: linear\n"
    "  critic:\n    <<: *opt\n    schedule: constant\n"
  )
  run = load_run_config(str(file), [])
  assert (run.optim.critic.clip_grad_norm, run.optim.critic.schedule) == (0.5, "constant")
  assert run.optim.actor.schedule == "linear"


def test_a_key_given_twice_beside_a_merge_key_is_still_refused(tmp_path):
  file = tmp_path / "run.yaml"
  file.write_text("a: &a\n  x: 1\nb:\n  <<: *a\n  y: 2\n  y: 3\n")
  with pytest.raises(ConfigError, match=r"invalid YAML: key 'y' given twice \(line 6"):
    load_run_config(str(file), [])


def test_a_directory_as_config_is_named_a_directory(tmp_path, capsys):
  """It said "no such file" for a directory that exists."""
  assert cli.main(["train", "--config", str(tmp_path)]) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip()
  assert f"--config {str(tmp_path)!r}: a directory, not a YAML file" in err, err
  assert "\n" not in err


@pytest.fixture
def x64():
  """JAX's 64-bit mode on, as `JAX_ENABLE_X64=1` turns it on; off again after the test."""
  import jax

  jax.config.update("jax_enable_x64", True)
  yield
  jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("command", ["train", "plan", "sweep"])
def test_jax_s_64_bit_mode_is_refused_before_anything_runs(x64, command, tmp_path, capsys):
  """`JAX_ENABLE_X64=1` failed once the models were built, with tunix's sampler's
  `dynamic_update_slice` TypeError, having created the run's directory and files."""
  out = tmp_path / "run"
  argv = {"train": ["--output-dir", str(out)], "plan": [], "sweep": ["--seeds", "1"]}[command]
  if command == "sweep":
    argv += ["--output-dir", str(out)]
  assert cli.main([command, *argv, "wandb=disabled"]) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip()
  assert err.startswith("tunix-ppo-ext: error: JAX_ENABLE_X64 is on"), err
  assert "\n" not in err and not out.exists()


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback():
  """`tunix-ppo-ext plugins | head -1` printed a `BrokenPipeError` traceback (exit 1)."""
  command = [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", "plugins"]
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  with subprocess.Popen(
    command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO
  ) as process:
    # closed before the command writes anything, so its first write meets the closed pipe
    # whatever its output's size (`head -1` closes after its line, and a listing that fits
    # the command's buffer is then already written)
    process.stdout.close()
    err = process.stderr.read().decode()
  assert process.returncode == 1
  assert err == "", err


@pytest.mark.parametrize("given", ["configs/smoke.yaml", None, {"train": {"steps": 2}}])
def test_jobs_given_something_other_than_a_run_config_name_what_they_take(given):
  """`jobs.train('configs/smoke.yaml')` (a path) or `jobs.train(None)` was
  `AttributeError: 'str' object has no attribute 'ppo'`."""
  from tunix_ppo_ext import jobs

  expected = r"a RunConfig or a ResolvedRun \(config.load_run_config\(PATH, \[KEY=VALUE"
  for call in (jobs.train, jobs.plan):
    with pytest.raises(TypeError, match=rf"^{call.__name__}: expected {expected}.*got "):
      call(given)


def test_overrides_given_as_one_string_are_refused_naming_them():
  """`load_run_config(path, 'train.steps=2')` iterated the string's characters: "override
  't' must look like section.key=value"."""
  with pytest.raises(ConfigError, match=r"^overrides='train.steps=2' must be a list of"):
    load_run_config(str(REPO / "configs" / "smoke.yaml"), "train.steps=2")


@pytest.mark.parametrize(
  "overrides, named",
  [
    (["train.critic_lr=5e-324"], r"'train.critic_lr'=5e-324 is invalid: .* \(in float32: 0.0\)"),
    (["train.lr=1e-50"], r"'train.lr'=1e-50 is invalid"),
    (
      ["seed=18446744073709551616"],
      r"'seed'=18446744073709551616 is invalid: must be an integer in",
    ),
    (
      ["env.name=guess", "env.kwargs={valid_reward: 1e308}", "model.alphabet=null"],
      r"valid_reward=1e\+308 is invalid: .* \(in float32: inf\)",
    ),
    (
      ["env.name=guess", "env.kwargs={low: 1000000000000000000000, high: 1000000000000000000010}"],
      r"low=1000000000000000000000 is invalid: must be an integer in \[0, ",
    ),
    (
      ["ppo.advantage_estimator=gigpo", "ppo.num_generations=2", "ppo.gigpo_step_weight=1e308"],
      r"ppo.gigpo_step_weight.*\(in float32: inf\)",
    ),
  ],
)
def test_values_float32_or_int64_cannot_hold_are_refused_naming_the_key(overrides, named):
  """They were accepted at load and failed later without the key: a learning rate of 0 in
  float32, a reward of inf, a secret numpy cannot draw, a seed that overflows past the
  models' build."""
  with pytest.raises(ConfigError, match=named) as err:
    load_run_config(str(REPO / "configs" / "smoke.yaml"), overrides)
  assert "\n" not in str(err.value)


def test_ctrl_c_while_the_job_s_modules_load_is_one_line(monkeypatch, capsys, tmp_path):
  """Ctrl-C in the seconds JAX and tunix take to load printed an import's traceback (42-48
  lines); now it is the command's interrupted line, exit 130. The interrupt is raised where
  the job's modules are read, as a Ctrl-C there raises it."""
  import types

  class Loading(types.ModuleType):
    def __getattr__(self, name: str):
      raise KeyboardInterrupt

  monkeypatch.setitem(sys.modules, "tunix_ppo_ext._src.run.job", Loading("job"))
  argv = ["train", "--config", str(REPO / "configs" / "smoke.yaml"), "--output-dir", str(tmp_path)]
  assert cli.main(argv) == 130
  err = capsys.readouterr().err
  assert "interrupted" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("key", "value"), [("batch_size", -8), ("lr", float("nan"))])
def test_resolve_checks_a_config_changed_in_code_as_the_yaml_path_does(key, value):
  """`resolve` on a `RunConfig` changed in code accepted what loading the YAML refuses."""
  from tunix_ppo_ext._src.run.run_config import resolve

  run = load_run_config(str(REPO / "configs" / "smoke.yaml"), [])
  setattr(run.train, key, value)
  with pytest.raises(ConfigError, match=rf"'train.{key}'="):
    resolve(run)


def test_an_empty_output_dir_is_called_empty(capsys):
  """`--output-dir ""` said "config key 'output_dir' must be str, got None"."""
  smoke = str(REPO / "configs" / "smoke.yaml")
  assert cli.main(["train", "--config", smoke, "--output-dir", ""]) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip()
  assert "'output_dir' (--output-dir) is empty" in err and "None" not in err, err
  assert "\n" not in err
  argv = ["sweep", "--seeds", "1", "--config", smoke, "--output-dir", ""]
  assert cli.main(argv) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip()
  assert "--output-dir is empty" in err and "\n" not in err, err


@pytest.mark.parametrize("text", ["123", "yes", "~", "null", "a'b", "x: y", "[1]"])
def test_an_output_dir_option_is_read_as_text(text):
  """`--output-dir 123` (or `yes`, `~`) was read as YAML: "must be str, got 123"."""
  override = cli.string_override("output_dir", text)
  assert load_run_config(str(REPO / "configs" / "smoke.yaml"), [override]).output_dir == text


@pytest.mark.skipif(not pathlib.Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_dir_where_no_directory_can_be_made_names_the_option(capsys):
  """`--output-dir /proc/x` exited 1 with Python's `FileNotFoundError` naming the path."""
  smoke = str(REPO / "configs" / "smoke.yaml")
  out = f"/proc/tunix-ppo-ext-{os.getpid()}"
  assert cli.main(["train", "--config", smoke, "--output-dir", out]) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert f"'output_dir' (--output-dir) {out!r} cannot be written" in err, err
  assert "FileNotFoundError" not in err


@pytest.mark.parametrize(
  "overrides, key",
  [
    (["ppo.gigpo_step_weight=0.5"], "ppo.gigpo_step_weight'=0.5"),
    (["ppo.gigpo_norm_by_std=false"], "ppo.gigpo_norm_by_std'=False"),
    (
      ["ppo.advantage_estimator=grpo", "ppo.num_generations=2", "ppo.gae_lambda=0.5"],
      "ppo.gae_lambda'=0.5",
    ),
    (["ppo.advantage_estimator=reinforce_plus_plus", "ppo.gamma_turn=0.9"], "ppo.gamma_turn'=0.9"),
  ],
)
def test_a_ppo_key_the_estimator_does_not_read_is_warned_about_in_one_line(overrides, key):
  """G15, G16, C31 of the 2026-12-07 probes: a key of another estimator was accepted without
  a word (the run trains as if it were not set)."""
  from tunix_ppo_ext._src.checks import ConfigWarning

  with pytest.warns(ConfigWarning, match=rf"^config key '{key} has no effect: ") as caught:
    load_run_config(str(REPO / "configs" / "smoke.yaml"), overrides)
  assert len([w for w in caught if issubclass(w.category, ConfigWarning)]) == 1
  assert "\n" not in str(caught[0].message)


@pytest.mark.parametrize(
  "overrides",
  [
    ["ppo.gae_lambda=0.5"],  # gae reads it
    ["ppo.gigpo_step_weight=1.0"],  # the default: asks for nothing
    ["ppo.advantage_estimator=grpo", "ppo.num_generations=2", "ppo.whiten_advantages=false"],
    ["ppo.num_generations=2", "metrics.shadow_estimators=[gigpo]", "ppo.gigpo_step_weight=0.5"],
  ],
)
def test_a_ppo_key_some_estimator_of_the_run_reads_is_not_warned_about(overrides):
  import warnings

  from tunix_ppo_ext._src.checks import ConfigWarning

  with warnings.catch_warnings():
    warnings.simplefilter("error", ConfigWarning)
    load_run_config(str(REPO / "configs" / "smoke.yaml"), overrides)


def test_the_command_line_prints_a_config_warning_as_one_line(tmp_path, capsys):
  """Not Python's two lines (the file, `ConfigWarning`, the source line). The run stops
  after the config's load: its directory cannot be made (a file in its path)."""
  (tmp_path / "afile").write_text("x")
  argv = smoke_args(tmp_path / "afile" / "run", "ppo.gigpo_step_weight=0.5")
  assert cli.main(argv) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip().splitlines()
  warned = [line for line in err if "gigpo_step_weight" in line]
  assert warned == [
    "tunix-ppo-ext: warning: config key 'ppo.gigpo_step_weight'=0.5 has no effect: "
    "advantage_estimator='gae' does not read it"
  ], err
  assert not any("Warning" in line for line in err), err


def test_a_turn_too_short_to_type_the_range_s_numbers_is_refused_naming_the_key():
  """`env.max_tokens_per_turn=2` with `high=1000` was accepted: no guess above 99 could be
  typed (the rollout cuts each turn at 2 characters), so the secret often never could."""
  from tunix_ppo_ext._src.run.run_config import load_resolved

  smoke = str(REPO / "configs" / "smoke.yaml")
  game = ["env.name=guess", "model.alphabet=null", "train.max_prompt_length=128"]
  with pytest.raises(ConfigError, match=r"^config key 'env.max_tokens_per_turn'=2 is below") as e:
    load_resolved(smoke, [*game, "env.kwargs={high: 1000}", "env.max_tokens_per_turn=2"])
  assert "'1000' (4 tokens" in str(e.value) and "\n" not in str(e.value)
  resolved = load_resolved(smoke, [*game, "env.kwargs={high: 1000}", "env.max_tokens_per_turn=4"])
  assert resolved.run.env.max_tokens_per_turn == 4
  assert load_resolved(smoke, [*game, "env.kwargs={high: 99}", "env.max_tokens_per_turn=2"])
