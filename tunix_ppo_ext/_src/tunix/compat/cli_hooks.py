"""tunix main's command-line PPO pipeline (`tunix.cli.ppo_main`, `tunix.cli.base_rl_pipeline`).

tunix 0.1.7 has no PPO pipeline (`ppo_main`): this part is imported only by the
`tunix-agentic` command (`learner.agentic_ppo_pipeline`), never with the rest of `compat`,
and its pins are checked on tunix main alone (tests/tunix/test_compat.py). What tunix offers
no public way to do, each with its reason:

- `PipelineHooks`: `PpoPipeline` whose training hook `_run(mode)` (tunix's `PpoPipeline`
  raises for `training_mode: agentic_ppo`) hands that mode to the public
  `run_agentic_ppo()` of a subclass, and every other mode to tunix's own.
- the pipeline's helpers an agentic run needs, which tunix's own agentic GRPO pipeline
  calls and `BasePipeline` keeps private: a config section as a mapping
  (`config_mapping`) or a string (`config_string`), the tokenizer (`tokenizer`), the chat
  parser of `chat_parser_config` (`chat_parser`), the raw dataset and its batch function of
  `data_module` (`raw_dataset`), a class by its dotted path (`load_class`), the
  `kubernetes_config` set-up (`setup_kubernetes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tunix_ppo_ext._src.checks import ConfigError

try:
  from tunix.cli import ppo_main
except ImportError:  # tunix 0.1.7: no PPO pipeline
  ppo_main = None

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
