"""A run config resolved once: `resolve` works a checked `RunConfig` out into a frozen
`ResolvedRun` (the `PpoExtConfig`, the batch sizes, the rollout chunk, the environments
built once with their validation entries, the episode budget, the checkpointed roles, the
metric keys, the model plan, the optimizers, tunix's cluster settings), which every command
passes down; nothing downstream derives any of it again.

Reading and checking a config file needs no JAX (`tunix_ppo_ext._src.config.loader`:
sections, keys, types, bounds); what needs the tokenizer, the checkpoint, the environments
or tunix is checked here, once, before anything compiles: `ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import typing
import warnings
from typing import Any

from tunix_ppo_ext._src.checks import ConfigError, ConfigWarning, check_choice
from tunix_ppo_ext._src.config import ppo_section as ppo_keys
from tunix_ppo_ext._src.config.cluster_spec import ClusterSpec
from tunix_ppo_ext._src.config.loader import (
  check_run,
  read_run_config,
)
from tunix_ppo_ext._src.config.recipe_sections import EnvEntry
from tunix_ppo_ext._src.config.run_sections import (
  FUSED_HEAD_KEY,
  LORA_KEY,
  LoraSection,
  ModelSection,
  RunConfig,
)
from tunix_ppo_ext._src.data import gguf_files
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.envs import base as envs
from tunix_ppo_ext._src.metrics.keys import MetricKeys
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.ppo import advantage_step, shadow_step
from tunix_ppo_ext._src.run import recipe, resume
from tunix_ppo_ext._src.run.dapo_section import agent_token_budget, validate_dapo
from tunix_ppo_ext._src.tunix.learner.ppo_config import (
  PpoExtConfig,
  groups_of_one_problem,
)
from tunix_ppo_ext._src.tunix.models import hf_models, lora, toy_models
from tunix_ppo_ext._src.tunix.models.role_models import ModelPlan


def toy_config(model: ModelSection, vocab_size: int) -> Any:
  """The toy Qwen3 config of `model`'s sizes for a vocabulary of `vocab_size` (what `train`
  builds and `plan` plans without a checkpoint or `config_name`)."""
  sizes = {k: getattr(model, k) for k in hf_models.SIZE_KEYS}
  return toy_models.tiny_qwen3_config(vocab_size, **sizes)


def lora_spec(section: LoraSection) -> lora.LoraSpec:
  """The adapters' `LoraSpec` of a `model.lora` section."""
  return lora.LoraSpec(section.rank, section.alpha, section.target_modules)


def ppo_section(run: RunConfig) -> PpoExtConfig:
  """The `PpoExtConfig` of the `ppo` section's keys over its defaults, checked (its
  messages name the keys, `ppo.<key>`): log-probs at the sampling temperature
  (`train.temperature`) unless `ppo.logps_temperature` says otherwise, and the fused head
  and packing as `model.fused_head` and `model.packing` set them.

  Args:
    run: the checked run config.

  Returns:
    The `PpoExtConfig`.
  """
  return PpoExtConfig(
    **{"logps_temperature": run.train.temperature, **run.ppo},
    fused_head=run.model.fused_head,
    packing=run.model.packing,
    keys=ppo_keys.RUN_KEYS,
  )


def config_dict(run: RunConfig) -> dict[str, Any]:
  """`run` as `config.json` saves it (W&B and metric sinks receive it too): every section
  as a mapping, `ppo` with the keys the config gave and `model.lora` with those that differ
  from `LoraSection`'s defaults (as `config.json` held it before `model.lora` was a section
  of its own, so such a run resumes: its other keys are not refused as new).

  Args:
    run: the run config.

  Returns:
    The JSON-ready mapping (loads back into the same run config).
  """
  data = dataclasses.asdict(run)
  if run.model.lora is not None:
    default = dataclasses.asdict(LoraSection())
    data["model"]["lora"] = {k: v for k, v in data["model"]["lora"].items() if v != default[k]}
  return data


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
  """A checked run config worked out once: what every consumer used to derive again."""

  run: RunConfig
  ppo: PpoExtConfig  # the `ppo` section over PpoExtConfig's defaults, validated
  models: ModelPlan  # the models of the run's roles, as `role_models.build_roles` builds them
  batch: recipe.BatchPlan  # every batch size in episodes, filled (`recipe.resolve_batch`)
  env_entries: tuple[EnvEntry, ...]  # the training environments with their groups
  validation_entries: tuple[EnvEntry, ...]  # validation's environments (or none)
  # the rollouts' `EnvSpec`s of `envs` and of `validation_entries` (empty: one environment)
  rollout_envs: tuple[envs.EnvSpec, ...]
  validation_envs: tuple[envs.EnvSpec, ...]
  episode_budget: int  # the most agent tokens an episode holds
  checkpoint_roles: tuple[str, ...]  # "actor", and "critic" when the estimator uses one
  # the `(actor, critic)` optax optimizers of the `optim` section (`recipe.optimizers`)
  optimizers: tuple[Any, Any]
  cluster: ClusterSpec  # tunix's trainer and rollout settings (`build_cluster`)
  config: dict[str, Any]  # `config_dict(run)`: what `config.json`, W&B and the sinks get
  tokenizer_dir: str | None  # `tokenizer_directory(run.model)` (None: the built-in one)
  max_return: float  # the best mean episode return of a batch (`env_max_return`)
  # the first training environment's first observation, which a Hugging Face tokenizer
  # must give back from `decode(encode(text))` (None: the built-in character tokenizer)
  first_observation: str | None
  # `(environment name, longest reply)` of each environment (training and validation) that
  # states one (`check_turn_tokens`: a Hugging Face tokenizer's count is checked when loaded)
  longest_replies: tuple[tuple[str, str], ...]
  # the published metric keys (`metrics.rename`, `.drop`) with the run's updates per batch
  metric_keys: MetricKeys
  # validation's single environment (`validation.env`/`kwargs`, else the training one's)
  validation_env: EnvEntry

  @property
  def num_generations(self) -> int:
    """Episodes per prompt (`ppo.num_generations`)."""
    return self.ppo.num_generations

  @property
  def updates_per_batch(self) -> int:
    """Optimizer updates per training batch: `ppo.num_iterations` epochs of its
    mini-batches (tunix's `train_steps` counts these; `train.steps` is their total)."""
    return self.ppo.num_iterations * self.batch.updates_per_epoch

  @property
  def prompts_per_batch(self) -> int:
    """Prompts per batch: `train.batch_size` episodes over `num_generations`."""
    return self.run.train.batch_size // self.ppo.num_generations


def load_run_config(
  path: str | None = None, overrides: typing.Sequence[str] = (), *, need_files: bool = True
) -> RunConfig:
  """`load_resolved(...).run`: the run config, checked in full (see `load_resolved`;
  `read_run_config` checks what the file alone can tell, without JAX).

  Args:
    path: the YAML config file; None: the embedded default.
    overrides: `KEY=VALUE` strings applied on top.
    need_files: check that `model.checkpoint` and `model.tokenizer` exist.

  Returns:
    The `RunConfig`.
  """
  return load_resolved(path, overrides, need_files=need_files).run


def load_resolved(
  path: str | None = None, overrides: typing.Sequence[str] = (), *, need_files: bool = True
) -> ResolvedRun:
  """Reads YAML `path` (the embedded default when None), applies `KEY=VALUE` overrides,
  checks every key and value (`read_run_config`), and resolves the run once (`resolve`).

  `need_files=False` (`tunix-ppo-ext plan`) leaves `model.checkpoint` and `model.tokenizer`
  unchecked: planning needs no weights and no tokenizer.

  Args:
    path: the YAML config file; None: the embedded default.
    overrides: `KEY=VALUE` strings applied on top, e.g. `train.steps=100`.
    need_files: check that `model.checkpoint` and `model.tokenizer` exist.

  Returns:
    The `ResolvedRun`.

  Raises:
    ConfigError: naming the key, the value and what is allowed (PluginError: a broken
      plugin).
  """
  return resolve(read_run_config(path, overrides), need_files=need_files)


def resolve_model(run: RunConfig, need_files: bool = True) -> tuple[ModelPlan, str | None]:
  """The run's `ModelPlan` and tokenizer directory, the checkpoint's `config.json` read
  once: its family and sizes (a `model.<size>` or `model.config_name` given as well must
  agree), else `model.config_name`'s or the toy sizes' Qwen3, configured by `model.remat`,
  `.attention` and `.dtype`; `model.lora` (its targets matched on the policy's structure,
  without weights) and the value head's start.

  Args:
    run: the checked run config.
    need_files: check that `model.checkpoint` holds weights and `model.tokenizer` exists.

  Returns:
    `(plan, tokenizer directory)`: `model.tokenizer`, else the checkpoint's own directory
    when it saved a tokenizer, else None (the built-in character tokenizer).
  """
  model, section = run.model, run.model.lora
  directory = None if model.checkpoint is None else _checkpoint_directory(model.checkpoint)
  if need_files:
    _check_files(model, directory)
  if model.config_name is not None:
    names = toy_models.qwen3_config_names()
    check_choice("config key 'model.config_name'", model.config_name, names)
  checkpoint = _checkpoint_model(model, directory, need_files)
  config = checkpoint.config if checkpoint else _qwen3_config(model)
  if section is not None:  # the policy's modules, without weights
    kind = (checkpoint.family.model_class,) if checkpoint else ()  # a toy's: Qwen3
    _check_lora_targets(model, toy_models.abstract_model(config, *kind))
  plan = ModelPlan(
    spec=model.spec(),
    config=hf_models.configured(config, model.spec()),
    family=checkpoint.family if checkpoint else None,
    checkpoint=model.checkpoint,
    toy_vocab=not checkpoint and model.config_name is None,
    seed=run.seed,
    lora=None if section is None else lora_spec(section),
    critic_lora=section is not None and section.critic,
    head_init=model.value_head_init,
  )
  return plan, _tokenizer_directory(model, directory, checkpoint is not None)


def _check_files(model: ModelSection, directory: str | None) -> None:
  """`model.checkpoint`: a GGUF file or a `directory` of `*.safetensors`; `model.tokenizer`:
  a directory."""
  path = None if directory is None else pathlib.Path(directory)
  if path is not None and not gguf_files.is_gguf(model.checkpoint):
    if not path.is_dir() or not list(path.glob("*.safetensors")):
      raise ConfigError(
        f"config key 'model.checkpoint': {model.checkpoint!r} is not a directory holding "
        "*.safetensors files"
      )
  if model.tokenizer is not None and not pathlib.Path(model.tokenizer).is_dir():
    raise ConfigError(f"config key 'model.tokenizer': {model.tokenizer!r} is not a directory")


def _checkpoint_model(
  model: ModelSection, directory: str | None, need_files: bool
) -> hf_models.CheckpointModel | None:
  """The model of the checkpoint's `config.json` in `directory` (None: no checkpoint, or
  none saved), checked against the `model.<size>` keys the config set and
  `model.config_name` (without `need_files`, `plan`'s: the file's model, whatever they say)."""
  if directory is None:
    return None
  defaults = ModelSection()
  given = {
    k: getattr(model, k) for k in hf_models.SIZE_KEYS if getattr(model, k) != getattr(defaults, k)
  }
  name = model.config_name if need_files else None
  try:
    return hf_models.validate_checkpoint(directory, given if need_files else {}, name)
  except ValueError as err:
    raise ConfigError(f"config key 'model.checkpoint' ({model.checkpoint!r}): {err}") from None


def _check_lora_targets(model: ModelSection, policy: Any) -> None:
  """`model.lora.target_modules`: a regex that matches a projection of the `policy` (its
  modules without weights; and of the critic's backbone with `critic`), and leaves the
  LM head to the fused head."""
  section = model.lora
  paths = lora.projection_paths(policy)
  what = f"the {type(policy).__name__} policy"
  lora.check_targets(section.target_modules, paths, what)
  head = "lm_head" if "lm_head" in paths else "embedder"  # untied, or the tied embedding
  if model.fused_head and re.fullmatch(section.target_modules, head):
    raise ConfigError(
      f"config key '{FUSED_HEAD_KEY}'=True: {LORA_KEY}.target_modules adapts the LM head "
      f"{head!r}, which the fused head computes from its frozen weight; leave it out"
    )
  if section.critic:
    critic_paths = [f"backbone/{p}" for p in paths if not p.startswith("lm_head")]
    lora.check_targets(section.target_modules, critic_paths, f"{what}'s critic (lora.critic)")


def _qwen3_config(model: ModelSection) -> Any:
  """The base policy's tunix config without a checkpoint config: a Qwen3 of `config_name`
  or of the toy sizes (their vocabulary of 2 is the tokenizer's when built: the paths and
  the rest of the config do not depend on it)."""
  if model.config_name is not None:
    return toy_models.named_qwen3_config(model.config_name)
  return toy_config(model, 2)


def tokenizer_directory(model: ModelSection) -> str | None:
  """`model.tokenizer`, else the checkpoint's own directory when it has `config.json` and a
  saved tokenizer, else None (the built-in character tokenizer)."""
  directory = None if model.checkpoint is None else _checkpoint_directory(model.checkpoint)
  has_config = directory is not None and hf_models.read_hf_config(directory) is not None
  return _tokenizer_directory(model, directory, has_config)


def _tokenizer_directory(
  model: ModelSection, directory: str | None, has_config: bool
) -> str | None:
  """`tokenizer_directory` of a checkpoint in `directory` (its own or a GGUF file's
  converted one) whose `config.json` was read already (`has_config`)."""
  if model.tokenizer is not None or directory is None:
    return model.tokenizer
  return directory if has_config and hf_models.has_tokenizer(directory) else None


def _checkpoint_directory(checkpoint: str) -> str:
  """`model.checkpoint` itself, or for a GGUF file (or short name) the Hugging Face
  directory it is converted into (config and tokenizer; the weights when loaded)."""
  try:
    return gguf_files.resolve(checkpoint)
  except ValueError as err:  # gguf_files names the file, not the key
    raise ConfigError(f"config key 'model.checkpoint': {err}") from None


def check_turn_tokens(
  max_tokens_per_turn: int,
  replies: typing.Iterable[tuple[str, str]],
  count: typing.Callable[[str], int] = len,
  tokenizer: str = "the built-in tokenizer",
) -> None:
  """Refuses a turn too short for an environment's longest reply (`replies`: `(environment
  name, reply)`, `longest_replies`): the agent could never type it (the rollout cuts each
  turn at `env.max_tokens_per_turn`). `count`: the reply's tokens (the built-in tokenizer:
  one per character, checked as the run resolves; a Hugging Face one's when it is loaded,
  `job`)."""
  for name, reply in replies:
    if count(reply) > max_tokens_per_turn:
      raise ConfigError(
        f"config key 'env.max_tokens_per_turn'={max_tokens_per_turn} is below the {name!r} "
        f"environment's longest reply, {reply!r} ({count(reply)} tokens with {tokenizer}): "
        f"the agent could not type it; raise it to at least {count(reply)}"
      )


def longest_replies(built: typing.Iterable[Any]) -> tuple[tuple[str, str], ...]:
  """`(environment name, longest reply)` of each environment that states its longest reply
  (an optional attribute, `longest_reply`: `guess`'s largest number)."""
  replies = [(envs.env_name(env), getattr(env, "longest_reply", None)) for env in built]
  return tuple((name, reply) for name, reply in replies if isinstance(reply, str))


def _check_lengths(run: RunConfig, env: Any, tokenizer_dir: str | None) -> None:
  """Lengths that cannot work, refused before anything compiles: a `max_prompt_length`
  below the first observation (built-in tokenizer: one token per character, plus BOS), a
  turn too short for the environment's longest reply (`check_turn_tokens`), and a KV cache
  for the toy model larger than this machine's memory (`tokenizer_dir`: the run's
  tokenizer directory, None: the built-in one)."""
  if tokenizer_dir is None:
    firsts = [env.reset(seed)[0] for seed in range(8)]
    alphabet = {} if run.model.alphabet is None else {"alphabet": run.model.alphabet}
    for text in firsts:  # the rollout's first encode would refuse it, after the build
      try:
        CharTokenizer(**alphabet).encode(text)
      except ValueError as err:
        raise ConfigError(
          f"config key 'model.alphabet': the {envs.env_name(env)!r} environment's first "
          f"observation cannot be tokenised: {err}"
        ) from None
    first = max(firsts, key=len)
    if len(first) + 1 > run.train.max_prompt_length:
      raise ConfigError(
        f"config key 'train.max_prompt_length'={run.train.max_prompt_length} is below the "
        f"first observation's {len(first) + 1} tokens (with BOS): {first!r}"
      )
    check_turn_tokens(run.env.max_tokens_per_turn, longest_replies([env]))
  own_turns = getattr(env, "max_turns", None)  # a game's own limit (guess: its guesses)
  if isinstance(own_turns, int) and own_turns > run.env.max_turns:
    raise ConfigError(
      f"config key 'env.max_turns'={run.env.max_turns} is below the {envs.env_name(env)!r} "
      f"environment's own max_turns={own_turns} (env.kwargs.max_turns): every episode would be "
      f"cut after {run.env.max_turns} turns, before the game ends; set both to one number"
    )
  model, cache = run.model, run.train.max_prompt_length + run.env.max_completion_len
  cache += 2 * run.env.max_tokens_per_turn
  kv_bytes = run.train.batch_size * model.num_layers * 2 * model.num_kv_heads * model.head_dim
  kv_bytes *= cache * 4  # float32 keys and values
  memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  if model.config_name is None and model.checkpoint is None and kv_bytes > memory:
    raise ConfigError(
      f"config key 'env.max_completion_len'={run.env.max_completion_len} needs a KV cache of "
      f"{kv_bytes / 2**30:.1f} GiB (batch {run.train.batch_size}, {model.num_layers} layers, "
      f"cache length {cache}), more than this machine's {memory / 2**30:.1f} GiB"
    )


def run_env_entries(run: RunConfig, num_generations: int) -> list[EnvEntry]:
  """The run's training environments: `envs`, else `env.name` / `env.kwargs` with every
  group."""
  if run.envs:
    return list(run.envs)
  groups = run.train.batch_size // num_generations
  return [EnvEntry(run.env.name, dict(run.env.kwargs), max(1, groups))]


def resolve(run: RunConfig, *, need_files: bool = True) -> ResolvedRun:
  """Works `run` out once: its `PpoExtConfig`, the environments (each built once), the
  batch arithmetic, the environment mix and the recipe sections checked against each
  other (`run.recipe`, `run.dapo_section`), and what a consumer reads of them.

  Args:
    run: the run config (`read_run_config`'s, or built in Python: checked again first).
    need_files: check that `model.checkpoint` and `model.tokenizer` exist (`plan`: no).

  Returns:
    The `ResolvedRun`.

  Raises:
    ConfigError: naming the key, the value and what is allowed (PluginError: a broken
      plugin).
  """
  check_run(run)  # a config built or changed in code was never read
  try:
    return _resolve(run, need_files)
  except (ConfigError, registry.PluginError):
    raise
  except ValueError as err:  # PpoExtConfig's and the environments' checks: bad input here
    raise ConfigError(str(err)) from err


def _resolve(run: RunConfig, need_files: bool) -> ResolvedRun:
  models, tokenizer_dir = resolve_model(run, need_files)
  _check_sinks(run.sinks)
  ppo = ppo_section(run)
  _warn_unread_ppo_keys(ppo, run.ppo, run.metrics.shadow_estimators)
  entries = run_env_entries(run, ppo.num_generations)
  recipe_plan = _check_sections(run, ppo, tokenizer_dir)
  validation_env = _validation_env(run)
  built = _built_envs(run, validation_env)
  for env in built.values():
    _check_lengths(run, env, tokenizer_dir)
  budget = episode_budget(run)
  validate_dapo(run.dapo, budget, ppo.num_generations)
  first = next(iter(built.values()))  # the first training environment
  batch = recipe_plan.batch
  return ResolvedRun(
    run=run,
    ppo=ppo,
    models=models,
    batch=batch,
    env_entries=tuple(entries),
    validation_entries=recipe_plan.validation_entries,
    rollout_envs=recipe_plan.rollout_envs,
    validation_envs=recipe_plan.validation_envs,
    episode_budget=budget,
    checkpoint_roles=resume.ROLES if ppo.uses_critic else ("actor",),
    optimizers=recipe_plan.optimizers,
    cluster=_cluster_spec(run, recipe_plan, ppo.num_generations),
    config=config_dict(run),
    tokenizer_dir=tokenizer_dir,
    max_return=env_max_return(entries, [built[_where(run, i)] for i in range(len(entries))]),
    first_observation=None if tokenizer_dir is None else first.reset(0)[0],
    longest_replies=longest_replies(built.values()),
    metric_keys=dataclasses.replace(
      run.metrics.keys(), updates_per_batch=ppo.num_iterations * batch.updates_per_epoch
    ),
    validation_env=validation_env,
  )


def _where(run: RunConfig, i: int) -> str:
  """The key of the run's `i`-th training environment: `envs[i]`, or `env`."""
  return f"envs[{i}]" if run.envs else "env"


def _validation_env(run: RunConfig) -> EnvEntry:
  """Validation's single environment: `validation.env` / `.kwargs`, else the training
  environment's name with its kwargs (another name: no kwargs)."""
  val = run.validation
  kwargs = val.kwargs if val.kwargs is not None else (run.env.kwargs if val.env is None else {})
  return EnvEntry(val.env or run.env.name, dict(kwargs))


def _built_envs(run: RunConfig, validation_env: EnvEntry) -> dict[str, Any]:
  """Every environment the run names, each built once, by its key (`env` or `envs[i]`,
  then `validation.envs[i]` or `validation`); unknown names and bad kwargs fail here,
  naming the keys."""
  named = [(_where(run, 0), run.env.name, run.env.kwargs)] if not run.envs else []
  named += [(f"envs[{i}]", e.name, e.kwargs) for i, e in enumerate(run.envs)]
  val = run.validation
  named += [(f"validation.envs[{i}]", e.name, e.kwargs) for i, e in enumerate(val.envs)]
  if val.env is not None or val.kwargs is not None:
    named.append(("validation", validation_env.name, validation_env.kwargs))
  built = {}
  for where, name, kwargs in named:
    keys = f"'{where}.name'/'{where}.kwargs'"
    if where == "validation":
      keys = "'validation.env'/'validation.kwargs'"
    try:
      built[where] = envs.make_env(name, **kwargs)
    except (TypeError, ValueError) as err:
      raise ConfigError(f"config keys {keys} ({name!r}, {kwargs!r}): {err}") from None
  return built


def _check_sinks(sinks: list[str]) -> None:
  """Each of `sinks` a metric sink of a plugin (`tunix_ppo_ext.metric_sinks` entry points,
  loaded here)."""
  for sink in sinks:
    try:
      registry.get(registry.METRIC_SINKS, sink)
    except ValueError as err:
      raise ConfigError(f"config key 'sinks' ({sink!r}): {err}") from None


def _check_sections(
  run: RunConfig, ppo: PpoExtConfig, tokenizer_dir: str | None
) -> recipe.RecipePlan:
  """The checks across sections (`resolve`'s): the batch in groups, chat templates,
  attention blocks, shadow estimators, then the recipe sections, worked out
  (`recipe.resolve_recipe`)."""
  num_generations = ppo.num_generations  # groups of one: refused by PpoExtConfig itself
  if run.train.batch_size % num_generations:
    raise ConfigError(
      f"config key 'train.batch_size'={run.train.batch_size} must be a multiple of "
      f"ppo.num_generations={num_generations}"
    )
  if run.env.chat_template and tokenizer_dir is None:
    raise ConfigError(
      "config key 'env.chat_template'=True needs a Hugging Face tokenizer with a chat template "
      "(model.tokenizer or a checkpoint's own); the built-in character tokenizer has none"
    )
  _check_attention_rows(run)
  _check_shadows(run, ppo)
  plan = recipe.resolve_recipe(run, num_generations)
  _warn_long_warmup(ppo, run.train.steps, ppo.num_iterations * plan.batch.updates_per_epoch)
  return plan


def _check_shadows(run: RunConfig, ppo: PpoExtConfig) -> None:
  """`metrics.shadow_estimators`: known, not the run's own, each fed by the run's groups."""
  shadow_key = "config key 'metrics.shadow_estimators'"
  for name in shadow_step.check_shadow_estimators(
    run.metrics.shadow_estimators, ppo.uses_critic, shadow_key
  ):
    problem = groups_of_one_problem(name, ppo.num_generations)
    if problem:  # its advantages would be the raw scores
      raise ConfigError(f"{shadow_key}: {name!r} needs ppo.num_generations {problem}")


def env_max_return(entries: list[EnvEntry], built: list[Any]) -> float:
  """The best mean episode return of a batch: the environments' `max_return`, weighted by
  their groups.

  Args:
    entries: the training environments with their groups.
    built: their environments, built.

  Returns:
    The weighted mean of their `max_return`.
  """
  total = sum(e.groups * env.max_return for e, env in zip(entries, built, strict=True))
  return total / sum(e.groups for e in entries)


def _warn_unread_ppo_keys(ppo: PpoExtConfig, given: dict[str, Any], shadows: list[str]) -> None:
  """A one-line warning for each estimator key the config sets (`given`: the `ppo` keys of
  the YAML and the overrides, not the defaults) to a value other than its default that
  neither the advantage estimator nor a shadow one reads (`advantage_step.fields_read`):
  `ppo.gigpo_step_weight` with `gae`, `ppo.gae_lambda` with `grpo`. Not refused: a config
  may keep one for a later switch. A normalization turned off (`whiten_advantages`,
  `norm_adv_by_std` false) where the estimator has none is what it asks for: no warning."""
  names = [ppo.advantage_estimator, *shadows]
  read = [advantage_step.fields_read(ppo, name) for name in names]
  if any(fields is None for fields in read):  # one of them may read anything
    return
  fields = {field.name: field for field in dataclasses.fields(PpoExtConfig)}
  for key in sorted(set(given) & set(advantage_step.ESTIMATOR_FIELDS)):
    value = getattr(ppo, key)
    if value == fields[key].default or (key in _OFF_SWITCHES and value is False):
      continue
    if not any(key in fields for fields in read):
      which = f"advantage_estimator={ppo.advantage_estimator!r}"
      which += f" (nor metrics.shadow_estimators={shadows})" if shadows else ""
      warnings.warn(
        f"config key 'ppo.{key}'={given[key]!r} has no effect: {which} does not read it",
        ConfigWarning,
        stacklevel=2,
      )


# normalizations an estimator may lack: turned off, they ask for what it does anyway
_OFF_SWITCHES = ("whiten_advantages", "norm_adv_by_std")


def _warn_long_warmup(ppo: PpoExtConfig, steps: int, updates_per_batch: int) -> None:
  """A warning when the critic warm-up lasts the whole run (its batches, `train.steps`
  updates of `updates_per_batch` each): the actor never trains (a critic-only run)."""
  batches = -(-steps // updates_per_batch)
  if ppo.critic_warmup_steps >= batches:
    warnings.warn(
      f"ppo.critic_warmup_steps={ppo.critic_warmup_steps} is not below the run's {batches} "
      f"batches (train.steps={steps}): the actor never trains, only the critic",
      ConfigWarning,
      stacklevel=4,
    )


def _cluster_spec(run: RunConfig, plan: recipe.RecipePlan, num_generations: int) -> ClusterSpec:
  """The run's tunix cluster settings: steps, lengths, learning rates, tunix's batch sizes
  in prompts (those the config set), checkpoint and evaluation cadence, sampling."""
  train = run.train
  return ClusterSpec(
    max_steps=train.steps,
    batch=train.batch_size // num_generations,
    max_prompt_length=train.max_prompt_length,
    max_tokens_to_generate=run.env.max_completion_len + run.env.max_tokens_per_turn,
    lr=train.lr,
    critic_lr=train.critic_lr,
    **plan.batch.tunix_sizes,
    checkpoint_every=train.checkpoint_every,
    eval_every=train.eval_every,
    temperature=train.temperature,
    seed=run.seed,
    return_logprobs=True,  # the rollout's own log-probs (`rollout/is_*`, reuse when on-policy)
    sampling=plan.sampling,
    eval_sampling=plan.eval_sampling,
  )


def _check_attention_rows(run: RunConfig) -> None:
  """With `model.attention: splash`, a training row (`train.max_prompt_length +
  env.max_completion_len` tokens) must be whole blocks of `model.attention_block_size`."""
  model, row = run.model, run.train.max_prompt_length + run.env.max_completion_len
  if model.attention == "splash" and row % model.attention_block_size:
    raise ConfigError(
      f"config key 'model.attention_block_size'={model.attention_block_size} must divide the "
      f"training row of train.max_prompt_length + env.max_completion_len = {row} tokens "
      "(splash attends in whole blocks)"
    )


def as_resolved(
  run: ResolvedRun | RunConfig, caller: str = "as_resolved", need_files: bool = True
) -> ResolvedRun:
  """`run` itself when resolved already, else `resolve(run, need_files=need_files)` (for
  Python callers); a TypeError naming `caller` for anything else (a config file's path,
  None)."""
  if isinstance(run, ResolvedRun):
    return run
  if not isinstance(run, RunConfig):
    raise TypeError(
      f"{caller}: expected a RunConfig or a ResolvedRun (config.load_run_config(PATH, "
      f"[KEY=VALUE, ...]) or config.load_resolved), got {type(run).__name__} {run!r:.60}"
    )
  return resolve(run, need_files=need_files)


def episode_budget(run: RunConfig) -> int:
  """The most agent tokens an episode of `run` can hold (`dapo_section.agent_token_budget`)."""
  env = run.env
  return agent_token_budget(env.max_completion_len, env.max_turns, env.max_tokens_per_turn)
