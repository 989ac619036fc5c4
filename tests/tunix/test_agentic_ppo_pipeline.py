"""`tunix-ppo-ext tunix-agentic`: tunix main's PPO pipeline with `training_mode: agentic_ppo`
(`AgenticPpoPipeline`): its YAML and `key=value` overrides as an `AgenticPpoConfig`, the
agent and environment classes by dotted path, the mode's dispatch, and the command's one
error line. No model is loaded (tunix's pipeline downloads its models)."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from tunix.rl import rl_cluster as rl_cluster_lib

from tunix_ppo_ext._src.run import cli

pytestmark = pytest.mark.tunix_facing  # also run on tunix main (.ci/run, lane 2)
MAIN = hasattr(rl_cluster_lib, "RLEngine")
needs_main = pytest.mark.skipif(not MAIN, reason="tunix's PPO pipeline is tunix main's")

MODEL = {
  "model_name": "qwen3-0.6b",
  "model_source": "huggingface",
  "model_id": "Qwen/Qwen3-0.6B",
  "intermediate_ckpt_dir": "/tmp/unused",
  "mesh": {"shape": "(1,1)", "axis_names": "('fsdp','tp')"},
}


def pipeline_yaml(directory: pathlib.Path, **section) -> pathlib.Path:
  """A tunix pipeline config for `training_mode: agentic_ppo` (tunix's keys, a local
  tokenizer path so tunix asks for no Hugging Face token)."""
  config = {
    "training_mode": "agentic_ppo",
    "model_config": MODEL,
    **{f"{role}_model_config": MODEL for role in ("actor", "reference", "rollout", "critic")},
    "tokenizer_config": {
      "tokenizer_path": str(directory / "tokenizer"),
      "tokenizer_type": "huggingface",
      "add_bos": False,
      "add_eos": False,
    },
    "rl_training_config": {"max_steps": 2},
    "rollout_config": {"total_generation_steps": 64, "max_prompt_length": 32},
    "agentic_ppo_config": section,
    "agent_class_path": "tunix.rl.agentic.agents.model_agent.ModelAgent",
    "env_class_path": "tunix.rl.agentic.environments.task_environment.TaskEnvironment",
    "env_kwargs": {"max_steps": 1},
  }
  path = directory / "agentic_ppo.yaml"
  path.write_text(yaml.safe_dump(config))
  return path


@needs_main
def test_the_section_and_overrides_are_an_agentic_ppo_config(tmp_path):
  from tunix.rl.agentic.agents import model_agent  # noqa: PLC0415
  from tunix.rl.agentic.environments import task_environment  # noqa: PLC0415

  from tunix_ppo_ext._src.tunix.learner import agentic_ppo_pipeline as pipeline  # noqa: PLC0415

  path = pipeline_yaml(tmp_path, gae_lambda=0.9, num_generations=2)
  argv = ["x", str(path), "agentic_ppo_config.advantage_estimator=turn_gae"]
  config = pipeline.AgenticPpoPipeline(argv).agentic_ppo_config()
  assert (config.advantage_estimator, config.gae_lambda, config.num_generations) == (
    "turn_gae",
    0.9,
    2,
  )
  assert config.max_response_length == 64  # the rollout's total_generation_steps
  kwargs = pipeline.AgenticPpoPipeline(argv).agent_and_env()
  assert kwargs["agent_class"] is model_agent.ModelAgent
  assert kwargs["env_class"] is task_environment.TaskEnvironment
  assert kwargs["env_kwargs"] == {"max_steps": 1} and kwargs["agent_kwargs"] == {}


@needs_main
def test_agentic_ppo_is_this_pipeline_s_and_the_rest_tunix_s(tmp_path):
  from tunix_ppo_ext._src.tunix.learner import agentic_ppo_pipeline as pipeline  # noqa: PLC0415

  class Recorded(pipeline.AgenticPpoPipeline):
    runs: list[str] = []

    def run_agentic_ppo(self):
      self.runs.append("agentic_ppo")

  Recorded(["x", str(pipeline_yaml(tmp_path))]).run_trainer()
  assert Recorded.runs == ["agentic_ppo"]


@needs_main
def test_a_bad_key_is_one_line_before_any_model_loads(tmp_path, capsys):
  path = pipeline_yaml(tmp_path)
  assert cli.main(["tunix-agentic", str(path), "agentic_ppo_config.gae_lambda=2"]) == 2
  assert "AgenticPpoConfig.gae_lambda=2 is invalid" in capsys.readouterr().err
  assert cli.main(["tunix-agentic", str(path), "agentic_ppo_config.gae_lamda=0.9"]) == 2
  err = capsys.readouterr().err.strip()
  key = "agentic_ppo_config.gae_lamda is not an AgenticPpoConfig key; did you mean 'gae_lambda'?"
  assert err.endswith(key)
  assert "\n" not in err


@pytest.mark.skipif(MAIN, reason="tunix main has the pipeline")
def test_on_tunix_0_1_7_the_command_says_it_needs_tunix_main(capsys):
  assert cli.main(["tunix-agentic", "agentic_ppo.yaml"]) == 2
  err = capsys.readouterr().err.strip()
  assert "tunix-agentic needs tunix main (google-tunix >= 0.1.8" in err and "\n" not in err


@needs_main
@pytest.mark.parametrize(
  ("write", "extra", "named"),
  [
    (None, [], "CONFIG '{path}': no such file"),
    ("rollout_config: [1, 2\n", [], "CONFIG '{path}': invalid YAML"),
    ("- 1\n", [], "CONFIG '{path}': expected a mapping"),
    ("ok", ["training_mode=agentic_ppoo"], "training_mode='agentic_ppoo' is invalid"),
    ("ok", ["env_class_path=no.such.Env"], "env_class_path='no.such.Env' names no class"),
    ("ok", ["agentic_ppo_config.max_response_length=32"], "must be rollout_config.total_gen"),
    ("ok", ["agentic_ppo_config=5"], "with agentic_ppo_config=5: tunix's config refused it"),
    ("ok", ["no_such_key=1"], "Key no_such_key was passed at the command line"),
    ("ok", ["gae_lambda"], "override 'gae_lambda' must look like key=value"),
  ],
)
def test_a_bad_file_mode_class_or_width_is_one_line_before_any_model(
  tmp_path, capsys, write, extra, named
):
  """Each was Python's or tunix's error (exit 1; a class path only once the tokenizer and
  models had loaded), or (a narrower max_response_length) episodes silently cut."""
  path = tmp_path / "agentic_ppo.yaml"
  if write == "ok":
    pipeline_yaml(tmp_path)  # its tokenizer path does not exist: nothing may load it
  elif write is not None:
    path.write_text(write)
  assert cli.main(["tunix-agentic", str(path), *extra]) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip()
  assert named.format(path=path) in err and "\n" not in err, err
