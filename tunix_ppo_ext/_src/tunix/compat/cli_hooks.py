"""tunix main's command-line PPO pipeline (`tunix.cli.ppo_main`, `tunix.cli.base_rl_pipeline`).

tunix 0.1.7 has no PPO pipeline (`ppo_main`): this part is imported only by the
`tunix-agentic` command (`learner.agentic_ppo_pipeline`), never with the rest of `compat`,
and its pins are checked on tunix main alone (tests/tunix/compat/test_compat.py). What tunix offers
no public way to do, each with its reason:

- `PipelineHooks`: `PpoPipeline` whose training hook `_run(mode)` (tunix's `PpoPipeline`
  raises for `training_mode: agentic_ppo`) hands that mode to the public
  `run_agentic_ppo()` of a subclass, and every other mode to tunix's own. Its
  `create_role_to_mesh()` is tunix's where the devices expose physical coordinates (TPUs);
  on devices that expose none (CPU, GPU), where tunix's allocator refuses every mesh (it
  builds only coordinate boxes), the same roles share the same meshes (tunix's
  `_resolve_mesh_owners`, owners in its `_ROLE_TO_MODEL_KEY` order), each owner's mesh of
  the next devices of `jax.devices()` (`role_meshes_without_coords`). Its
  `obtain_training_config_dict()` (the fields tunix's `create_rl_training_config` builds
  the training config from, once, so that tunix's checks see the YAML's values and not the
  ones they filled in, e.g. `gradient_accumulation_steps`) gives `metrics_logging_options`
  without `custom_backend` tunix's default backends with W&B's `WandbOnSharedRun`, which
  reads metrax's `WandbBackend` state (`wandb`, `_is_active`): tunix's own W&B fails a run
  with a critic as it closes.
- local checkpoints (`cli_models`): `create_rl_engine()` loads a model config of
  `model_source: local` (or `huggingface` naming a local directory) with this package's
  loader (a subclass's `load_local_model()`) and `_get_tokenizer()` a local `huggingface`
  tokenizer with `local_files_only`, with no network call; tunix's parse-time checks that
  refuse them (`_validate_model_source`, `check_supported_workflow`,
  `_validate_tokenizer`) are skipped for them.
- the pipeline's helpers an agentic run needs, which tunix's own agentic GRPO pipeline
  calls and `BasePipeline` keeps private: a config section as a mapping
  (`config_mapping`) or a string (`config_string`), the tokenizer (`tokenizer`), the chat
  parser of `chat_parser_config` (`chat_parser`), the raw dataset and its batch function of
  `data_module` (`raw_dataset`), a class by its dotted path (`load_class`), the
  `kubernetes_config` set-up (`setup_kubernetes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from absl import logging
from tunix.sft import metrics_logger
from tunix.utils import env_utils

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.metrics.keys import MetricKeys
from tunix_ppo_ext._src.metrics.sinks import KeyedBackend
from tunix_ppo_ext._src.tunix.compat import cli_models

try:
  from tunix.cli import ppo_main
  from tunix.utils import mesh as mesh_lib
except ImportError:  # tunix 0.1.7: no PPO pipeline
  ppo_main = mesh_lib = None

AGENTIC_PPO = "agentic_ppo"  # the `training_mode` tunix's PpoPipeline refuses

_PIPELINE_NAMES = (
  "_run",
  "_config_mapping",
  "_config_string",
  "_get_tokenizer",
  "_create_chat_parser",
  "_load_raw_dataset",
  "_load_class_from_path",
  "_setup_kubernetes",
  "_validate_model_source",
  "_validate_tokenizer",
  "_resolve_mesh_owners",
  "_ROLE_TO_MODEL_KEY",
)
PINNED: dict[str, tuple[Any, tuple[str, ...]]] = (
  {}
  if ppo_main is None
  else {"tunix.cli.ppo_main.PpoPipeline": (ppo_main.PpoPipeline, _PIPELINE_NAMES)}
)
PINNED_INSTANCE_ATTRIBUTES: dict[str, tuple[str, ...]] = {}


class PipelineHooks(object if ppo_main is None else ppo_main.PpoPipeline):
  """tunix's `PpoPipeline` that runs `training_mode: agentic_ppo` with a subclass's
  `run_agentic_ppo()` (tunix's own `ppo` and its error for other modes are kept)."""

  def _run(self, mode: str = "ppo") -> None:
    if mode == AGENTIC_PPO:
      self.run_agentic_ppo()
      return
    super()._run(mode)

  def run_agentic_ppo(self) -> None:
    raise NotImplementedError

  def _validate_model_source(self, raw_keys: Any) -> None:
    if not cli_models.is_local_model(raw_keys.get("model_config")):
      super()._validate_model_source(raw_keys)

  def check_supported_workflow(self) -> None:
    if not cli_models.is_local_model(self.config.get("model_config")):
      super().check_supported_workflow()

  def _validate_tokenizer(self) -> None:
    if cli_models.local_tokenizer_ref(self.config) is None:
      super()._validate_tokenizer()

  def _get_tokenizer(self) -> Any:
    local = cli_models.local_tokenizer(self.config)
    return super()._get_tokenizer() if local is None else local

  def load_local_model(
    self, model_config: Mapping[str, Any], tokenizer_config: Mapping[str, Any], mesh: Any
  ) -> tuple[Any, str]:
    """tunix's `create_model` for a local checkpoint (`cli_models`): a subclass's."""
    raise NotImplementedError

  def create_rl_engine(self, tokenizer: Any) -> Any:
    """tunix's `create_rl_engine`, local checkpoints loaded by `load_local_model`."""
    with cli_models.local_models_in(self.load_local_model):
      return super().create_rl_engine(tokenizer)

  def obtain_training_config_dict(self, key: str) -> dict[str, Any]:
    """tunix's training config's fields of section `key`, from which tunix's
    `create_rl_training_config` builds the config once (its checks run on the YAML's values,
    as in tunix's own CLI); `rl_training_config`'s `metrics_logging_options` get
    `shared_run_backends`."""
    values = super().obtain_training_config_dict(key)
    options = values.get("metrics_logging_options")
    if key == "rl_training_config" and isinstance(options, metrics_logger.MetricsLoggerOptions):
      values["metrics_logging_options"] = shared_run_backends(options, self.metric_keys(values))
    return values

  def metric_keys(self, training_config: Mapping[str, Any]) -> MetricKeys | None:
    """The taxonomy the default backends publish under (None: tunix's own event names);
    `training_config` is the training config's fields."""
    del training_config
    return None

  def create_role_to_mesh(self) -> dict[Any, jax.sharding.Mesh]:
    """tunix's meshes by role; on devices without physical coordinates (CPU, GPU), which
    tunix's allocator refuses, `role_meshes_without_coords`."""
    if any(mesh_lib.device_mesh_coords(device) is not None for device in jax.devices()):
      return super().create_role_to_mesh()
    return role_meshes_without_coords(self)


class WandbOnSharedRun(metrics_logger.WandbBackend):
  """tunix's W&B backend, one per trainer over W&B's one run in the process: the actor's
  trainer finishes that run when it closes, and the critic's, closing after it, logs its
  last metrics to no run, which W&B refuses (`wandb.Error`, the run's exit 1 after its last
  step); those are left out here (TensorBoard keeps them). A W&B that fails to start is
  skipped, as tunix's default backends skip it."""

  def __init__(self, project: str, name: str | None = None, **kwargs: Any) -> None:
    try:
      super().__init__(project, name, **kwargs)
    except Exception as err:  # tunix: `except (ImportError, Exception)`
      logging.info("WandbBackend skipped: %s", err)
      self.wandb, self._is_active = None, False

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    if self.wandb is not None and self.wandb.run is None:
      return
    super().log_scalar(event, value, **kwargs)


def shared_run_backends(
  options: metrics_logger.MetricsLoggerOptions, keys: MetricKeys | None = None
) -> metrics_logger.MetricsLoggerOptions:
  """`options` whose backends are tunix's default ones with W&B's `WandbOnSharedRun`
  (tunix's own W&B fails a run with a critic as it closes), each behind the metrics
  taxonomy `keys` when given (`KeyedBackend`: the `train` job's keys, e.g.
  `critic/explained_variance` for the event `learner/train/explained_variance`); options
  with a `custom_backend`, and tunix's internal environment, are left as they are."""
  if (options.backend_kwargs or {}).get("custom_backend") or env_utils.is_internal_env():
    return options
  factories = default_metrics_backends(options)
  if keys is not None:
    factories = [_keyed(factory, keys) for factory in factories]
  return dataclasses.replace(options, backend_kwargs={"custom_backend": factories})


def _keyed(factory: Any, keys: MetricKeys) -> Any:
  """`factory`'s backend behind `keys`, as a factory of the same name."""

  def build() -> KeyedBackend:
    return KeyedBackend(factory(), keys)

  build.__name__ = factory.__name__
  return build


def default_metrics_backends(options: metrics_logger.MetricsLoggerOptions) -> list[Any]:
  """tunix's default backends of `options` (TensorBoard in `log_dir`, W&B) as factories,
  W&B's `WandbOnSharedRun`."""
  kwargs = options.backend_kwargs or {}

  def tensorboard() -> metrics_logger.TensorboardBackend:
    return metrics_logger.TensorboardBackend(
      log_dir=options.log_dir,
      flush_every_n_steps=options.flush_every_n_steps,
      **kwargs.get("tensorboard", {}),
    )

  def wandb() -> WandbOnSharedRun:
    return WandbOnSharedRun(options.project_name, options.run_name, **kwargs.get("wandb", {}))

  return [tensorboard, wandb]


def role_meshes_without_coords(pipeline: Any) -> dict[Any, jax.sharding.Mesh]:
  """Each role's mesh as tunix resolves its owner (a role with its own `mesh`, one with
  `same_mesh_as`, the rest the actor's), each owner's mesh of the next devices of
  `jax.devices()` in tunix's role order; ConfigError when they are too few."""
  owners = pipeline._resolve_mesh_owners()
  devices = list(jax.devices())
  meshes: dict[Any, jax.sharding.Mesh] = {}
  for role in pipeline._ROLE_TO_MODEL_KEY:
    owner = owners.get(role)
    if owner is None or owner in meshes:
      continue
    owner_key = pipeline._ROLE_TO_MODEL_KEY[owner]
    shape, names = pipeline.parse_mesh_config(owner_key)
    count = int(np.prod(shape))
    if count > len(devices):
      raise ConfigError(
        f"{owner_key}.mesh shape={tuple(shape)} needs {count} devices, but only "
        f"{len(devices)} of jax.devices() are left (each role with its own mesh takes its own "
        "devices; `same_mesh_as: actor` or no `mesh` shares the actor's)"
      )
    meshes[owner] = mesh_lib.create_mesh(shape, names, devices=devices[:count])
    devices = devices[count:]
  return {role: meshes[owner] for role, owner in owners.items()}


def config_mapping(pipeline: Any, name: str) -> dict[str, Any]:
  """The config's section `name` as a plain dict (empty when absent); ConfigError naming it
  when it is not a mapping."""
  section = pipeline._config_mapping(name) or {}
  if not isinstance(section, Mapping):
    raise ConfigError(f"{name}={section!r} is invalid: must be a mapping of its keys")
  return dict(section)


def config_string(pipeline: Any, name: str) -> str | None:
  """The config's string `name` (None or '' when absent)."""
  return pipeline._config_string(name)


def tokenizer(pipeline: Any) -> Any:
  """The tokenizer of `tokenizer_config`."""
  return pipeline._get_tokenizer()


def chat_parser(pipeline: Any, tokenizer: Any) -> Any:
  """tunix's chat parser of `chat_parser_config.type` (`default`, `qwen`, `gemma4`)."""
  return pipeline._create_chat_parser(tokenizer)


def raw_dataset(pipeline: Any, tokenizer: Any) -> tuple[Any, Any]:
  """`(dataset, batch function or None)` of the config's data source or `data_module`."""
  return pipeline._load_raw_dataset(tokenizer)


def load_class(pipeline: Any, dotted_path: str) -> type:
  """The class at `module.path.ClassName`."""
  return pipeline._load_class_from_path(dotted_path)


def setup_kubernetes(pipeline: Any) -> None:
  """tunix's `kubernetes_config` set-up (nothing without that section)."""
  pipeline._setup_kubernetes()
