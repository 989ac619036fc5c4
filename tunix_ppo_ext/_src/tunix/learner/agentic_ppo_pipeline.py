"""tunix main's command-line PPO pipeline with `training_mode: agentic_ppo` (tunix main only).

`AgenticPpoPipeline` is tunix's `PpoPipeline`: the same YAML config (`model_config`,
`*_model_config`, `tokenizer_config`, `rollout_config`, `rl_training_config`, the data
keys, `reward_functions`, `key=value` overrides, `T_` environment variables), tunix's
models, meshes, rollout engine and dataset; `training_mode: ppo` is tunix's own PPO.
`training_mode: agentic_ppo`, which tunix's pipeline refuses, trains `AgenticPpoLearner`
with the keys tunix's agentic GRPO pipeline reads (`chat_parser_config`,
`agent_class_path` / `agent_kwargs`, `env_class_path` / `env_kwargs`; `reward_functions`
optional) and the section `agentic_ppo_config`: `AgenticPpoConfig`'s fields (the PPO keys
of `PpoExtConfig` and tunix's agentic ones), `max_response_length` defaulting to
`rollout_config.total_generation_steps` as in tunix's agentic GRPO pipeline. A critic
needs `critic_model_config` (and `rl_training_config.critic_optimizer_config`).

`run(argv)` is the `tunix-ppo-ext tunix-agentic CONFIG.yaml [KEY=VALUE ...]` command;
`configure(argv)` its config stage, every check before a tokenizer, dataset or model loads.

A role's `model_source: local` (`model_path`: a Hugging Face directory, a `.gguf` file or a
GGUF short name), or tunix's `huggingface` whose `model_id` is a local directory, loads
with this package's loader and a local `huggingface` tokenizer with `local_files_only`: no
network call (`compat.cli_models`, `models.local_checkpoints`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from tunix.cli.utils import data as data_lib

from tunix_ppo_ext._src.checks import ConfigError, did_you_mean
from tunix_ppo_ext._src.config.yaml_files import load_yaml
from tunix_ppo_ext._src.metrics.keys import MetricKeys
from tunix_ppo_ext._src.tunix.compat import cli_hooks
from tunix_ppo_ext._src.tunix.learner.agentic_ppo import AgenticPpoLearner
from tunix_ppo_ext._src.tunix.learner.agentic_ppo_config import AgenticPpoConfig
from tunix_ppo_ext._src.tunix.models import local_checkpoints

SECTION = "agentic_ppo_config"
MODES = ("ppo", cli_hooks.AGENTIC_PPO)  # tunix's PPO, and this package's agentic PPO


def agentic_ppo_config(section: Mapping[str, Any], rollout: Mapping[str, Any]) -> AgenticPpoConfig:
  """The `AgenticPpoConfig` of the `agentic_ppo_config` section; `max_response_length`
  defaults to the rollout's `total_generation_steps` (and must equal it). An unknown key is
  a ConfigError."""
  keys = dict(section)
  fields = sorted(f.name for f in dataclasses.fields(AgenticPpoConfig))
  unknown = sorted(set(keys) - set(fields))
  if unknown:
    raise ConfigError(
      f"{SECTION}.{unknown[0]} is not an AgenticPpoConfig key{did_you_mean(unknown[0], fields)}"
    )
  steps = rollout.get("total_generation_steps")
  if "max_response_length" not in keys and steps is not None:
    keys["max_response_length"] = int(steps)
  elif steps is not None and keys["max_response_length"] != steps:
    raise ConfigError(
      f"{SECTION}.max_response_length={keys['max_response_length']!r} is invalid: must be "
      f"rollout_config.total_generation_steps={steps!r}, the width the rollout samples "
      "(episodes are cut at max_response_length); leave it out to take the rollout's"
    )
  return AgenticPpoConfig(**keys)


class AgenticPpoPipeline(cli_hooks.PipelineHooks):
  """tunix main's `PpoPipeline` that also trains `training_mode: agentic_ppo` with
  `AgenticPpoLearner` (the module docstring); `run_trainer()` runs the configured mode."""

  def run_agentic_ppo(self) -> None:
    """Builds the learner and trains it on the configured dataset."""
    learner, dataset = self.agentic_ppo_learner()
    learner.train(dataset)

  def load_local_model(
    self, model_config: Mapping[str, Any], tokenizer_config: Mapping[str, Any], mesh: Any
  ) -> tuple[Any, str]:
    """A role's local checkpoint (`model_source: local`) as tunix's `create_model` gives a
    model: `local_checkpoints.load_local_model`."""
    return local_checkpoints.load_local_model(model_config, tokenizer_config, mesh)

  def metric_keys(self, training_config: Mapping[str, Any]) -> MetricKeys | None:
    """For `agentic_ppo`, the `train` job's metric keys (`metrics.keys`), each training
    batch's keys at the first update that trains on it: tunix's agentic loop makes
    `num_iterations` passes of `batch_size // mini_batch_size` updates over a batch."""
    if self.config.get("training_mode", "ppo") != cli_hooks.AGENTIC_PPO:
      return None
    batch = int(self.config.get("batch_size", 1) or 1)
    mini_batch = int(training_config.get("mini_batch_size") or batch)
    iterations = int(cli_hooks.config_mapping(self, SECTION).get("num_iterations", 1) or 1)
    return MetricKeys(updates_per_batch=iterations * max(1, batch // mini_batch))

  def agentic_ppo_config(self) -> AgenticPpoConfig:
    """The `agentic_ppo_config` section as an `AgenticPpoConfig`."""
    rollout = cli_hooks.config_mapping(self, "rollout_config")
    return agentic_ppo_config(cli_hooks.config_mapping(self, SECTION), rollout)

  def agentic_ppo_learner(self) -> tuple[AgenticPpoLearner, Any]:
    """`(learner, dataset)`: tunix's engine, tokenizer, chat parser and dataset, the
    configured agent and environment classes, `AgenticPpoLearner` on them."""
    config = self.agentic_ppo_config()  # a bad key fails before any model loads
    classes = self.agent_and_env()  # so does a class path that names no class
    cli_hooks.setup_kubernetes(self)
    tokenizer = cli_hooks.tokenizer(self)
    dataset = self.agentic_dataset(tokenizer)
    engine = self.create_rl_engine(tokenizer)
    reward_fns = self.obtain_reward_fn() if self.config.get("reward_functions") else None
    learner = AgenticPpoLearner(
      rl_engine=engine,
      algo_config=config,
      reward_fns=reward_fns,
      chat_parser=cli_hooks.chat_parser(self, tokenizer),
      **classes,
    )
    return learner, dataset

  def agentic_dataset(self, tokenizer: Any) -> Any:
    """The batched training dataset, as tunix's pipelines batch it."""
    raw, batch_fn = cli_hooks.raw_dataset(self, tokenizer)
    self.compute_params(raw)
    dataset, _ = data_lib.post_init_dataset(
      raw,
      tokenizer,
      batch_size=self.config.get("batch_size", 1),
      num_batches=self.config.get("num_batches"),
      max_prompt_length=cli_hooks.config_mapping(self, "rollout_config").get("max_prompt_length"),
      fraction=self.config.get("train_fraction", 1.0),
      num_epochs=self.config.get("num_train_epochs", 1),
      prompt_key=self.config.get("prompt_key", "prompts"),
      custom_batch_fn=batch_fn,
    )
    return dataset

  def agent_and_env(self) -> dict[str, Any]:
    """`agent_class`/`agent_kwargs` and `env_class`/`env_kwargs` of the dotted paths
    `agent_class_path` and `env_class_path` (tunix's defaults where not set); a path that
    names no class is a ConfigError naming the key."""
    kwargs: dict[str, Any] = {}
    for role in ("agent", "env"):
      path = cli_hooks.config_string(self, f"{role}_class_path")
      if path:
        try:
          kwargs[f"{role}_class"] = cli_hooks.load_class(self, path)
        except (ImportError, AttributeError, ValueError) as err:  # no module, no class, no dot
          raise ConfigError(
            f"{role}_class_path={path!r} names no class ({type(err).__name__}: {err}); give "
            "module.path.ClassName"
          ) from None
        kwargs[f"{role}_kwargs"] = dict(self.config.get(f"{role}_kwargs") or {})
    return kwargs


def check_config_file(path: str) -> None:
  """ConfigError naming `path` unless it is a YAML file holding a mapping (tunix's own
  loader would raise its parser's or Python's error from deep inside)."""
  file = pathlib.Path(path)
  if not file.is_file():
    what = "a directory" if file.is_dir() else "no such file"
    raise ConfigError(f"CONFIG {path!r}: {what} (tunix's pipeline YAML)")
  data = load_yaml(file, f"CONFIG {path!r}")
  if not isinstance(data, dict):
    raise ConfigError(f"CONFIG {path!r}: expected a mapping at the top level")


def _refused(argv: Sequence[str], what: str, err: Exception) -> ConfigError:
  """The one line for tunix's refusal (`err`) of `what` in the config of `argv`."""
  given = f" with {' '.join(argv[1:])}" if len(argv) > 1 else ""
  reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
  return ConfigError(f"CONFIG {argv[0]!r}{given}: tunix's {what} refused it ({reason})")


def configure(argv: Sequence[str]) -> AgenticPpoPipeline:
  """The launcher's config stage, before any tokenizer, dataset or model loads: the config
  file, tunix's parsing of it and of the overrides, `training_mode`, tunix's training
  config (`rl_training_config`, built as tunix builds it, its checks run), for
  `agentic_ppo` the `AgenticPpoConfig`, and local checkpoints (`model_source: local`)
  and tokenizers. ConfigError (one line) on the first problem."""
  check_config_file(argv[0])
  for override in argv[1:]:
    if "=" not in override:
      raise ConfigError(f"override {override!r} must look like key=value")
  try:  # tunix's parsing of the file and the overrides (an override of a section's type:
    # TypeError)
    pipeline = AgenticPpoPipeline(["tunix-agentic", *argv])
  except (ValueError, TypeError) as err:
    raise _refused(argv, "config", err) from None
  mode = pipeline.config.get("training_mode", "ppo")
  if mode not in MODES:
    raise ConfigError(f"training_mode={mode!r} is invalid: must be one of {MODES}")
  try:  # e.g. train_micro_batch_size without mini_batch_size, or no log_dir for metrics
    pipeline.create_rl_training_config()
  except (ValueError, TypeError) as err:
    raise _refused(argv, "rl_training_config", err) from None
  if mode == cli_hooks.AGENTIC_PPO:
    pipeline.agentic_ppo_config()
  local_checkpoints.check_local_models(pipeline.config)
  return pipeline


def run(argv: Sequence[str]) -> None:
  """tunix's `PpoPipeline` command line (`CONFIG.yaml [KEY=VALUE ...]`, as tunix's
  `python -m tunix.cli.ppo_main`) with `training_mode: agentic_ppo` trained here; the
  config checked first (`configure`)."""
  configure(argv).run_trainer()
