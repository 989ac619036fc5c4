"""`tunix-ppo-ext tunix-agentic` on local checkpoints, with no network call (tunix main).

A Hugging Face directory written here (a tiny random Llama with SmolLM2's tokenizer), and
SmolLM2's GGUF conversion, named by `model_source: local` + `model_path` (or a
`huggingface` `model_id` that is a local directory): the launcher's config stage, its model
stage (`create_rl_engine`) and a PPO step, with `HF_HUB_OFFLINE=1` and every internet
socket connect refused. The compat route's tunix pins (`compat.cli_models`) are here too."""

from __future__ import annotations

import inspect
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import yaml

from tests.helpers import hf_fixtures
from tests.helpers.launch import (
  FROZENLAKE_TRAINING,
  REPO,
  launch_config,
  needs_main,
  needs_smollm2,
)

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]
ROLE_KEYS = (
  "model_config",
  *(f"{role}_model_config" for role in ("actor", "reference", "rollout", "critic")),
)
MESH = {"shape": "(1,1)", "axis_names": "('fsdp','tp')"}
# Installed before the launcher runs in a subprocess: any internet connect fails the run.
GUARD = """\
import socket, sys

def refuse(self, address, *args):
  if self.family in (socket.AF_INET, socket.AF_INET6):
    raise OSError(f"network call in an offline run: {address!r}")
  return CONNECT(self, address, *args)

CONNECT = socket.socket.connect
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
from tunix_ppo_ext._src.run.cli import main
sys.exit(main())
"""


def smollm2_directory() -> pathlib.Path:
  """SmolLM2's converted directory (config and tokenizer; weights on first load)."""
  from tunix_ppo_ext._src.data import gguf_files

  return pathlib.Path(gguf_files.resolve("smollm2"))


def tiny_checkpoint(directory: pathlib.Path) -> pathlib.Path:
  """A tiny random Llama (width 32) in Hugging Face layout, with SmolLM2's tokenizer files
  and its vocabulary size: config.json, model.safetensors, tokenizer.json, ..."""
  import transformers

  tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_directory(), local_files_only=True)
  hf_fixtures.write_checkpoint(
    directory, "llama", vocab_size=len(tokenizer), tie_word_embeddings=True
  )
  tokenizer.save_pretrained(directory)
  return directory


def local_config(
  directory: pathlib.Path, model: dict, tokenizer: str = "", steps: int = 1, **training: Any
) -> pathlib.Path:
  """`launch_config`'s YAML (two 8-token episodes of one prompt a step, a critic) with every
  role's model config `model`, the tokenizer's path `tokenizer` (none: the model's),
  `steps` steps (epochs of the one prompt) and the `rl_training_config` keys `training`."""
  path = launch_config(directory, tokenizer)
  config = yaml.safe_load(path.read_text())
  config["rl_training_config"].update(training)
  config["rl_training_config"]["max_steps"] = config["num_train_epochs"] = steps
  for key in ROLE_KEYS:
    config[key] = {**model, **({"mesh": MESH} if key == "actor_model_config" else {})}
  path.write_text(yaml.safe_dump(config))
  return path


@pytest.fixture
def offline(monkeypatch):
  """HF_HUB_OFFLINE=1, no HF_TOKEN, and every internet socket connect raising."""
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.delenv("HF_TOKEN", raising=False)
  connect = socket.socket.connect

  def refuse(self, address, *args):
    if self.family in (socket.AF_INET, socket.AF_INET6):
      raise AssertionError(f"network call in an offline run: {address!r}")
    return connect(self, address, *args)

  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@needs_main
@needs_smollm2
@pytest.mark.parametrize("spelling", ["local", "huggingface"])
def test_a_local_checkpoint_goes_through_the_model_stage_offline(tmp_path, offline, spelling):
  """`model_source: local` + `model_path`, or tunix's `huggingface` with a `model_id` that
  is a directory: the config stage, the tokenizer (`local_files_only`) and the model stage
  (actor, reference, critic with tunix's score head) load it with no network call."""
  from tunix.models.llama3 import model as llama3
  from tunix.rl import utils as rl_utils

  from tunix_ppo_ext._src.tunix.compat import cli_hooks
  from tunix_ppo_ext._src.tunix.learner import agentic_ppo_pipeline as launcher

  ckpt = tiny_checkpoint(tmp_path / "tiny")
  if spelling == "local":
    model = {"model_source": "local", "model_path": str(ckpt)}
  else:  # tunix's own spelling; no `intermediate_ckpt_dir` asked for
    model = {"model_name": "llama-3.2-1b", "model_source": "huggingface", "model_id": str(ckpt)}
  pipeline = launcher.configure([str(local_config(tmp_path, model))])
  tokenizer = cli_hooks.tokenizer(pipeline)
  assert tokenizer.encode("Say a") == transformers_ids(ckpt, "Say a")
  engine = pipeline.create_rl_engine(tokenizer)
  actor = engine.actor_trainer.model
  assert isinstance(actor, llama3.Llama3) and actor.config.embed_dim == 32
  assert isinstance(engine.critic_trainer.model, rl_utils.TransformerWithScoreHead)


def transformers_ids(directory: pathlib.Path, text: str) -> list[int]:
  """`transformers`' own ids of `text` (no special tokens added: SmolLM2 adds none)."""
  import transformers

  return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True).encode(text)


@needs_main
def test_a_local_model_source_without_a_checkpoint_is_one_config_error(tmp_path):
  """`model_source: local` with no `model_path`, with a directory that does not exist or
  one with no config.json: one ConfigError at the config stage, naming the key."""
  from tunix_ppo_ext._src.checks import ConfigError
  from tunix_ppo_ext._src.tunix.learner import agentic_ppo_pipeline as launcher

  (tmp_path / "empty").mkdir()
  cases = {
    "": "needs model_config.model_path",
    str(tmp_path / "nowhere"): "is no local checkpoint",
    str(tmp_path / "empty"): "has no config.json",
  }
  for ref, message in cases.items():
    model = {"model_source": "local", "model_path": ref}
    config = local_config(tmp_path, model, tokenizer=str(REPO))
    with pytest.raises(ConfigError, match=message):
      launcher.configure([str(config)])


@pytest.mark.slow  # a tiny model trains in a subprocess (20-30 s on 2 cores)
@needs_main
@needs_smollm2
def test_a_local_checkpoint_trains_a_ppo_step_offline_through_the_launcher(tmp_path):
  """The command in a subprocess with `HF_HUB_OFFLINE=1`, no `HF_TOKEN` and every internet
  connect refused: the tiny directory trains one PPO step with a critic; exit 0."""
  from tunix_ppo_ext._src.metrics.sinks import read_tensorboard

  ckpt = tiny_checkpoint(tmp_path / "tiny")
  config = local_config(tmp_path, {"model_source": "local", "model_path": str(ckpt)})
  done = launch_offline(tmp_path, config)
  assert done.returncode == 0, done.stderr[-3000:]
  metrics = read_tensorboard(tmp_path / "metrics")
  for name in ("actor/pg_loss", "critic/vf_loss"):
    assert {step for step, _ in metrics[name]} == {1}, (name, metrics[name])
    assert all(np.isfinite(value) for _, value in metrics[name]), (name, metrics[name])


@pytest.mark.slow  # SmolLM2 135m trains two steps in a subprocess (2-4 min on 2 cores)
@needs_main
@needs_smollm2
def test_smollm2_trains_two_ppo_steps_offline_through_the_launcher(tmp_path):
  """SmolLM2 by its GGUF short name (`model_path: smollm2`; tokenizer: its directory), two
  PPO steps through `tunix-ppo-ext tunix-agentic CONFIG.yaml`, offline, under the
  `rl_training_config` of tunix's own frozenlake example (its warm-up cosine schedule, its
  checkpointing, profiler and log-prob chunk options, micro-batches of one prompt
  accumulated into its mini-batch: two prompts of one episode a step here, where it has 64)."""
  from tunix_ppo_ext._src.metrics.sinks import read_tensorboard

  smollm2_directory()  # converted once here, outside the guarded run
  metrics = {"log_dir": str(tmp_path / "metrics"), "flush_every_n_steps": 1}
  example = {**FROZENLAKE_TRAINING, "metrics_logging_options": metrics}
  example.update(mini_batch_size=2, train_micro_batch_size=1)  # 2 accumulated micro-batches
  example["critic_optimizer_config"] = example["actor_optimizer_config"]
  model = {"model_source": "local", "model_path": "smollm2"}
  config = local_config(tmp_path, model, steps=2, **example)
  data = yaml.safe_load(config.read_text())
  data["batch_size"] = 2  # two prompts a step (the example's `mini_batch_size` of them)
  data["agentic_ppo_config"]["num_generations"] = 1  # two episodes a step, as the test above
  config.write_text(yaml.safe_dump(data))
  prompts = '[{"prompts": "Say a"}, {"prompts": "Say b"}]'
  source = "import grain\n\ndef create_dataset(**kwargs):\n"
  source += f"  return grain.MapDataset.source({prompts})\n"
  (tmp_path / "launch_data.py").write_text(source)
  done = launch_offline(tmp_path, config)
  assert done.returncode == 0, done.stderr[-3000:]
  metrics = read_tensorboard(tmp_path / "metrics")
  assert {step for step, _ in metrics["actor/pg_loss"]} == {1, 2}, metrics["actor/pg_loss"]
  assert all(np.isfinite(value) for _, value in metrics["critic/vf_loss"]), metrics


def launch_offline(directory: pathlib.Path, config: pathlib.Path, *overrides: str):
  """`tunix-ppo-ext tunix-agentic CONFIG [KEY=VALUE ...]` in a subprocess (JAX on the CPU),
  behind `GUARD`, with `HF_HUB_OFFLINE=1` and no `HF_TOKEN`."""
  (directory / "offline_launch.py").write_text(textwrap.dedent(GUARD))
  path = os.pathsep.join([str(REPO), str(directory), os.environ.get("PYTHONPATH", "")])
  env = {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu", "WANDB_MODE": "disabled"}
  env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
  env.pop("HF_TOKEN", None)
  command = [sys.executable, "offline_launch.py", "tunix-agentic", str(config), *overrides]
  return subprocess.run(
    command, env=env, cwd=directory, capture_output=True, text=True, timeout=900
  )


@needs_main
def test_cli_models_pins_tunix_main_s_model_and_tokenizer_layout(tmp_path):
  """What `compat.cli_models` relies on: `create_rl_engine` calls `create_model` through
  `tunix.cli.utils.model`; tunix's `Tokenizer.__init__` sets `tokenizer_type` and then
  `TokenizerAdapter.__init__` (a `LocalTokenizer` has the same attributes and ids as
  tunix's on the same directory); tunix's `RematConfig` values are `REMAT_BY_VALUE`'s;
  tunix's score head calls its backbone with `output_hidden_states`, which tunix's Llama 3
  lacks (`HiddenStatesLlama3` adds it to the same parameters); tunix's own checks refuse
  `model_source: local` (the reason they are skipped)."""
  from tunix.cli import base_rl_pipeline, config
  from tunix.cli.utils import model as model_lib
  from tunix.generate import tokenizer_adapter
  from tunix.models.llama3 import model as llama3
  from tunix.rl import utils as rl_utils

  from tunix_ppo_ext._src.tunix.compat import cli_models
  from tunix_ppo_ext._src.tunix.models import local_checkpoints

  assert base_rl_pipeline.model_lib is model_lib
  assert "model_lib.create_model(" in inspect.getsource(
    base_rl_pipeline.BasePipeline.create_rl_engine
  )
  directory = str(tiny_checkpoint(tmp_path / "tiny"))
  theirs = tokenizer_adapter.Tokenizer("huggingface", directory, False, False)
  ours = cli_models.LocalTokenizer(directory, False, False)
  assert vars(ours).keys() == vars(theirs).keys()
  assert ours.tokenize("Say a").tolist() == theirs.tokenize("Say a").tolist()
  assert {m.value: m.name.lower() for m in llama3.RematConfig} == local_checkpoints.REMAT_BY_VALUE
  head = inspect.getsource(rl_utils.TransformerWithScoreHead.__call__)
  assert "output_hidden_states=True" in head and "'all_hidden_states'" in head
  tunix_params = list(inspect.signature(llama3.Llama3.__call__).parameters)
  assert "output_hidden_states" not in tunix_params
  ours_params = list(inspect.signature(cli_models.HiddenStatesLlama3.__call__).parameters)
  assert ours_params == [*tunix_params, "output_hidden_states"]
  assert "local" not in config._SUPPORTED_MODEL_SOURCES
