"""`tunix-ppo-ext tunix-agentic`: tunix main's PPO pipeline with `training_mode: agentic_ppo`
(`AgenticPpoPipeline`): its YAML and `key=value` overrides as an `AgenticPpoConfig`, the
agent and environment classes by dotted path, the mode's dispatch, and the command's one
error line. No model is loaded (tunix's pipeline downloads its models)."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from tunix.rl import rl_cluster as rl_cluster_lib

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.run import cli

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]
MAIN = hasattr(rl_cluster_lib, "RLEngine")
needs_main = pytest.mark.skipif(not MAIN, reason="tunix's PPO pipeline is tunix main's")

MODEL = {
  "model_name": "qwen3-0.6b",
  "model_source": "huggingface",
  "model_id": "Qwen/Qwen3-0.6B",
  "intermediate_ckpt_dir": "/tmp/unused",
  "mesh": {"shape": "(1,1)", "axis_names": "('fsdp','tp')"},
}


def pipeline_yaml(
  directory: pathlib.Path, *, training: dict | None = None, **section
) -> pathlib.Path:
  """A tunix pipeline config for `training_mode: agentic_ppo` (tunix's keys, a local
  tokenizer path so tunix asks for no Hugging Face token); `training`: the
  `rl_training_config` (default: 2 steps of Adam)."""
  optimizer = {"opt_type": "adamw", "learning_rate": 1e-5}
  default = {"max_steps": 2, "eval_every_n_steps": 10, "actor_optimizer_config": optimizer}
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
    "rl_training_config": default if training is None else training,
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
  from tunix.rl.agentic.agents import model_agent
  from tunix.rl.agentic.environments import task_environment

  from tunix_ppo_ext._src.tunix.learner import agentic_ppo_pipeline as pipeline

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
  from tunix_ppo_ext._src.tunix.learner import agentic_ppo_pipeline as pipeline

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
    ("a: 1\nb: 2\na: 3\n", [], "CONFIG '{path}': invalid YAML: key 'a' given twice (line 3"),
    ("ok", ["training_mode=agentic_ppoo"], "training_mode='agentic_ppoo' is invalid"),
    ("ok", ["env_class_path=no.such.Env"], "env_class_path='no.such.Env' names no class"),
    ("ok", ["agentic_ppo_config.max_response_length=32"], "must be rollout_config.total_gen"),
    ("ok", ["agentic_ppo_config.off_policy_steps=-1"], "Config.off_policy_steps=-1 is invalid"),
    ("ok", ["agentic_ppo_config.max_concurrency=0"], "Config.max_concurrency=0 is invalid"),
    ("ok", ["agentic_ppo_config=5"], "with agentic_ppo_config=5: tunix's config refused it"),
    ("ok", ["no_such_key=1"], "Key no_such_key was passed at the command line"),
    ("ok", ["gae_lambda"], "override 'gae_lambda' must look like key=value"),
  ],
)
def test_a_bad_file_mode_class_or_width_is_one_line_before_any_model(
  tmp_path, capsys, write, extra, named
):
  """Each was Python's or tunix's error (exit 1; a class path only once the tokenizer and
  models had loaded), or (a narrower max_response_length) episodes silently cut, or (a
  negative off_policy_steps) a run that waited forever once its models had compiled."""
  path = tmp_path / "agentic_ppo.yaml"
  if write == "ok":
    pipeline_yaml(tmp_path)  # its tokenizer path does not exist: nothing may load it
  elif write is not None:
    path.write_text(write)
  assert cli.main(["tunix-agentic", str(path), *extra]) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip()
  assert named.format(path=path) in err and "\n" not in err, err


# The `rl_training_config` of tunix's own agentic example (examples/frozenlake/configs/
# gemma4_e2b.yaml at the pinned commit, c7d8950f; tunix's wheel ships no example YAML):
# micro-batches accumulated into a mini-batch, and metrics options
FROZENLAKE_TRAINING = {
  "mini_batch_size": 64,
  "train_micro_batch_size": 2,
  "actor_optimizer_config": {
    "opt_type": "adamw",
    "peak_value": 1e-6,
    "schedule_type": "warmup_cosine_decay_schedule",
    "init_value": 0.0,
    "end_value": 0.0,
    "warmup_ratio": 0.1,
    "warmup_steps": 0,
    "decay_steps": 9,
    "b1": 0.9,
    "b2": 0.95,
    "weight_decay": 0.0,
    "max_grad_norm": 100.0,
  },
  "eval_every_n_steps": 10,
  "max_steps": 5,
  "metrics_logging_options": {"log_dir": "/tmp/logging", "flush_every_n_steps": 1},
  "checkpointing_options": {"save_interval_steps": 50, "max_to_keep": 4},
  "profiler_options": {},
  "compute_logps_chunk_size": 2048,
}


@needs_main
@pytest.mark.parametrize(
  ("keys", "accumulated"),
  [({}, 32), ({"train_micro_batch_size": 16}, 4), ({"gradient_accumulation_steps": None}, 32)],
  ids=["tunix_s", "other_micro_batches", "accumulation_null"],
)
def test_tunix_s_own_training_config_passes_the_config_stage(tmp_path, keys, accumulated):
  """tunix's example's training config failed the launcher with tunix's `ValueError: For
  RL training, gradient_accumulation_steps should be None` (`null` in the YAML too): the
  launcher rebuilt tunix's config (`dataclasses.replace`), whose check then saw the
  accumulation steps tunix had filled in. It is built once, as tunix's CLI builds it, with
  the launcher's W&B backend in its metrics options."""
  from tunix_ppo_ext._src.tunix.learner import agentic_ppo_pipeline as pipeline

  metrics = {"log_dir": str(tmp_path / "metrics"), "flush_every_n_steps": 1}
  training = {**FROZENLAKE_TRAINING, "metrics_logging_options": metrics, **keys}
  path = pipeline_yaml(tmp_path, training=training, num_generations=8)
  configured = pipeline.configure([str(path)])
  config = configured.create_rl_training_config()
  assert config.gradient_accumulation_steps == accumulated  # mini_batch_size // micro, tunix's
  backends = config.metrics_logging_options.backend_kwargs["custom_backend"]
  assert [backend.__name__ for backend in backends] == ["tensorboard", "wandb"]
  assert configured.agentic_ppo_config().num_generations == 8
  tensorboard = backends[0]()  # behind the `train` job's keys (the metrics guide's)
  assert tensorboard._keys.key("learner/train/explained_variance") == "critic/explained_variance"
  assert tensorboard._keys.key("batch/train/advantage/mean") == "train/advantage/mean"
  assert tensorboard._keys.updates_per_batch == 1  # one update per batch of 1 prompt
  tensorboard.close()


@needs_main
def test_a_training_config_tunix_refuses_is_one_line_before_any_model(tmp_path, capsys):
  training = {key: v for key, v in FROZENLAKE_TRAINING.items() if key != "mini_batch_size"}
  path = pipeline_yaml(tmp_path, training=training)
  assert cli.main(["tunix-agentic", str(path)]) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip()
  refused = "tunix's rl_training_config refused it (ValueError: For RL training, `mini_batch_size`"
  assert refused in err and "\n" not in err, err


@needs_main
def test_without_device_coordinates_the_roles_get_tunix_s_meshes(tmp_path):
  """tunix's allocator refuses every mesh on devices without physical coordinates (CPU,
  GPU); the launcher's meshes are tunix's owners on the next devices: the actor's mesh alone
  is every role's, and a second role with its own mesh needs a second device."""
  import jax
  from tunix.utils import mesh as mesh_lib

  from tunix_ppo_ext._src.tunix.learner import agentic_ppo_pipeline as pipeline

  assert all(mesh_lib.device_mesh_coords(d) is None for d in jax.devices())
  config = yaml.safe_load(pipeline_yaml(tmp_path).read_text())
  alone = {key: dict(value) for key, value in config.items() if key.endswith("model_config")}
  for key in alone:  # `model_config`'s keys are every role's: the actor's mesh alone
    if key != "actor_model_config":
      alone[key].pop("mesh")
  (tmp_path / "alone.yaml").write_text(yaml.safe_dump({**config, **alone}))
  meshes = pipeline.AgenticPpoPipeline(["x", str(tmp_path / "alone.yaml")]).create_role_to_mesh()
  assert {role.value for role in meshes} == {"actor", "critic", "reference", "rollout"}
  assert len({id(mesh) for mesh in meshes.values()}) == 1
  assert list(meshes.values())[0].devices.shape == (1, 1)
  each = pipeline.AgenticPpoPipeline(["x", str(pipeline_yaml(tmp_path))])  # every role a mesh
  if len(jax.devices()) < 4:
    with pytest.raises(ConfigError, match=r"needs 1 devices, but only \d of jax.devices\(\)"):
      each.create_role_to_mesh()


def test_a_trainer_s_metrics_after_another_closed_w_and_b_are_left_out(monkeypatch, tmp_path):
  """Each of tunix's trainers starts a W&B backend on W&B's one run; the actor's closes it,
  then the critic's last metrics failed the run (tunix's backend raises). The launcher's
  backend leaves them out; its TensorBoard backend is tunix's."""
  import wandb
  from tunix.sft import metrics_logger

  from tunix_ppo_ext._src.tunix.compat import cli_hooks

  monkeypatch.setenv("WANDB_MODE", "disabled")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path))
  # W&B reads its settings once a process (`wandb.setup`): an earlier test's W&B run in
  # this worker kept its own, and W&B then asked for an API key instead
  wandb.teardown()
  options = metrics_logger.MetricsLoggerOptions(log_dir=str(tmp_path / "tb"))
  tensorboard, make_wandb = cli_hooks.default_metrics_backends(options)
  assert isinstance(tensorboard(), metrics_logger.TensorboardBackend)
  actor, critic = make_wandb(), make_wandb()
  assert actor.wandb is not None and critic.wandb is not None  # both started W&B
  tunix_s = metrics_logger.WandbBackend(project="tunix")
  actor.close()  # the actor's trainer closes first: W&B's run is finished
  critic.log_scalar("critic/train/vf_loss", 0.5, step=1)
  with pytest.raises(wandb.Error, match=r"wandb\.init\(\) before wandb\.log\(\)"):
    tunix_s.log_scalar("critic/train/vf_loss", 0.5, step=1)
