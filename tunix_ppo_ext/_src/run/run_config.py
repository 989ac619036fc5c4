"""The main job's configuration: YAML file + dotted `KEY=VALUE` overrides, checked eagerly.

Sections: `model`, `env` (or several: `envs`), `train`, `metrics`, `mesh`, `optim`, `batch`,
`sampling`, `shaping`, `filter`, `validation` (`run.recipe`), `dapo` (`run.dapo_section`), `ppo`
(fields of `PpoExtConfig`; a key left out keeps `PpoExtConfig`'s default) and top-level `seed`,
`output_dir`, `wandb`, `sinks`. With no file, the embedded default (`default.yaml` beside this
module, the same file as the repository's `configs/default.yaml`) is the base.

`load_resolved` reads and checks a config and works it out once into a frozen `ResolvedRun`
(the `PpoExtConfig`, the batch sizes, the rollout chunk, the environment and validation
entries, the episode budget, the checkpointed roles), which every command passes down.
Unknown keys, wrong types and impossible values raise `ConfigError` naming the key (with
the closest valid names) before any compilation.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import os
import pathlib
import re
import types
import typing
import warnings
from typing import Any

from tunix_ppo_ext._src.checks import (
  ConfigError,
  ConfigWarning,
  FieldKeys,
  check_choice,
  check_integer,
  check_number,
  did_you_mean,
)
from tunix_ppo_ext._src.config.cluster_spec import ClusterSpec
from tunix_ppo_ext._src.config.model_spec import ModelSpec
from tunix_ppo_ext._src.config.rollout_sections import FilterSection, ShapingSection
from tunix_ppo_ext._src.config.yaml_files import load_yaml
from tunix_ppo_ext._src.data import gguf_files
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.envs import base as envs
from tunix_ppo_ext._src.metrics.collapse import EchoTrapRule
from tunix_ppo_ext._src.metrics.keys import SUMMARY_KEY, MetricKeys
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.ppo import advantage_step, shadow_step
from tunix_ppo_ext._src.run import recipe, resume
from tunix_ppo_ext._src.run.dapo_section import DapoSection, agent_token_budget, validate_dapo
from tunix_ppo_ext._src.tunix.cluster.mesh import MESH_ROLES, check_mesh_spec
from tunix_ppo_ext._src.tunix.compat import FUSED_HEAD_KEY
from tunix_ppo_ext._src.tunix.learner.ppo_config import (
  PpoExtConfig,
  check_groups,
  groups_of_one_problem,
)
from tunix_ppo_ext._src.tunix.models import hf_models, lora, toy_models
from tunix_ppo_ext._src.tunix.models.role_models import ModelPlan


@dataclasses.dataclass
class ModelSection:
  """The policy: tunix's Qwen3, random init at toy size or loaded from a checkpoint.

  `alphabet`: the built-in character tokenizer's characters (`None`: letters, digits,
  punctuation); a small alphabet makes the action space small. `checkpoint`: a directory
  of Hugging Face-layout `*.safetensors`. With its `config.json` (Qwen2/2.5, Qwen3, Llama 3,
  Gemma 3: `tunix.hf_models`) the family and sizes come from the file (a `model.<size>`
  given as well must agree) and its tokenizer, if saved there, is the default; without one
  it is a Qwen3 of `ModelConfig.<config_name>()` (e.g. `qwen3_0p6b`) or of the toy sizes
  below. The critic starts from the policy's backbone either way. `tokenizer`: a Hugging
  Face tokenizer directory, used instead of the built-in character tokenizer. `lora`: train
  LoRA adapters instead of the weights (`LoraSection`; None: full fine-tuning). `fused_head`:
  every pass (actor's loss, old and reference log-probs) computes its log-probs and entropy
  from the final hidden states and the LM head's weight `ppo.logits_chunk_size` positions at
  a time, so no `[batch, tokens, vocabulary]` logits exist (`ops.fused_logps_and_entropy`,
  and `ops.fused_full_kl_divergence` for `ppo.kl_method: full`; needs
  `ppo.logits_chunk_size > 0`). `remat`:
  tunix's activation rematerialisation of the policy and the critic (their decoder layers),
  honoured by `train` and `plan`: `none` keeps every activation for the backward, `block`
  recomputes each attention and MLP block, `decoder` each whole decoder layer.
  `attention`: how the training passes (actor, critic, reference) attend: `dense` (tunix's
  `[T, T]` scores, every family), `splash` (tunix's TPU splash kernel, Qwen3 and Qwen2: no
  `[T, T]` scores, padding kept out by segment ids; TPU only, in blocks of
  `attention_block_size` tokens, which must divide `train.max_prompt_length +
  env.max_completion_len`) or `blockwise` (`ops.segment_attention`, the same masked result
  without `[T, T]` scores on any backend, `attention_block_size` keys at a time; Qwen3).
  The rollout's sampler always attends densely over its KV cache.
  `packing`: every training pass (log-probs, values, the actor's and critic's updates) runs
  on the batch's episodes packed into fewer rows (`ops.plan_packing`), each attending only
  to itself: the results of the padded rows with less compute spent on padding.
  `dtype`: the weights' dtype, `bfloat16` or `float32` (`null`: as the checkpoint stores
  them; a toy model's are float32) for every checkpoint kind (GGUF, Hugging Face, toy):
  the frozen weights are held and computed in it while what the run trains (the LoRA
  adapters, a critic's value head, a critic trained whole) stays float32, so `bfloat16`
  needs `model.lora` (`tunix_ppo_ext.models.cast_params`).
  `value_head_init`: the critic's value head starts `normal` (small random weights, so its
  first values are random in scale) or `zero` (every first value 0: close to the returns
  of a task whose returns are near 0, and no random offset for the critic to unlearn).
  """

  alphabet: str | None = "abcehikstw!?. "
  tokenizer: str | None = None
  checkpoint: str | None = None
  config_name: str | None = None
  num_layers: int = 2
  embed_dim: int = 64
  hidden_dim: int = 128
  num_heads: int = 2
  head_dim: int = 32
  num_kv_heads: int = 1
  lora: dict[str, Any] | None = None  # a LoraSection's keys
  fused_head: bool = False
  remat: str = "none"  # one of none, block, decoder (tunix's RematConfig)
  value_head_init: str = "normal"  # the value head kernel at start: normal or zero
  attention: str = "dense"  # dense ([T, T] scores), splash (tunix's TPU kernel), blockwise
  attention_block_size: int = 512  # splash's or blockwise's block, in tokens
  packing: bool = False  # training passes on packed rows
  dtype: str | None = None  # the frozen weights': bfloat16 or float32 (None: the checkpoint's)

  def spec(self) -> ModelSpec:
    """The checked `ModelSpec` of `remat`, `attention`, `attention_block_size` and `dtype`."""
    return ModelSpec(self.remat, self.attention, self.attention_block_size, self.dtype)


def toy_config(model: ModelSection, vocab_size: int) -> Any:
  """The toy Qwen3 config of `model`'s sizes for a vocabulary of `vocab_size` (what `train`
  builds and `plan` plans without a checkpoint or `config_name`)."""
  sizes = {k: getattr(model, k) for k in hf_models.SIZE_KEYS}
  return toy_models.tiny_qwen3_config(vocab_size, **sizes)


@dataclasses.dataclass
class LoraSection:
  """`model.lora`: qwix LoRA adapters of rank `rank` on the policy's modules whose path
  (`layers/0/attn/q_proj`, `/`-joined) fully matches the regex `target_modules`, scaled by
  `alpha / rank` (`tunix_ppo_ext.models.apply_lora`). The frozen base weights serve as the reference
  model too (no copy). `critic: true` adapts the critic's backbone the same way (its paths
  start with `backbone/`) and shares the base weights too, training only its adapters and
  value head; false: the critic is a full copy of the backbone, trained whole.
  """

  rank: int = 8
  alpha: float = 16.0
  target_modules: str = lora.DEFAULT_TARGET_MODULES
  critic: bool = False

  def spec(self) -> lora.LoraSpec:
    """The adapters' `LoraSpec`."""
    return lora.LoraSpec(self.rank, self.alpha, self.target_modules)


def lora_section(model: ModelSection) -> LoraSection | None:
  """The validated `model.lora` section (None: no LoRA)."""
  if model.lora is None:
    return None
  return _build(LoraSection, model.lora, prefix=f"{lora.KEY}.")


WANDB_MODES = ("disabled", "offline", "online")  # `wandb`
KV_CACHE_MODES = ("continue", "reencode")  # `env.kv_cache`


@dataclasses.dataclass
class EnvSection:
  """The environment by name, its keyword arguments and the trajectory limits.

  `kv_cache` is `continue` (each turn continues from the previous turn's KV cache) or
  `reencode` (each turn prefills the whole history, the old path). `chat_template=True`
  formats episodes with the Hugging Face tokenizer's own chat template
  (`tunix_ppo_ext._src.data.chat`). `loss_on_observations=True` is an ablation that puts the
  environment's tokens under the loss mask too (what a learner that conflates the two masks
  does).
  """

  name: str = "memory"
  kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
  max_turns: int = 4
  max_completion_len: int = 16
  max_tokens_per_turn: int = 2
  loss_on_observations: bool = False  # ablation: train on environment tokens too
  chat_template: bool = False  # format episodes with the tokenizer's chat template
  kv_cache: str = "continue"  # each turn continues from the KV cache; "reencode": old path

  def __post_init__(self):
    check_choice("config key 'env.kv_cache'", self.kv_cache, KV_CACHE_MODES)


@dataclasses.dataclass
class TrainSection:
  """Steps, batch, optimiser and sampling settings of the run."""

  steps: int = 600
  batch_size: int = 32
  lr: float = 1e-3
  critic_lr: float = 3e-3
  temperature: float = 1.0
  max_prompt_length: int = 8
  checkpoint_every: int = 100  # updates between saves; orbax also saves update 1 and the last
  eval_every: int = 100
  eval_batches: int = 1
  eval_samples: int = 4  # conversations per evaluation to samples.jsonl and W&B


@dataclasses.dataclass
class MetricsSection:
  """Changes to the published metric keys (see `tunix_ppo_ext._src.metrics.keys`).

  `rename`: published key -> the key to use instead (e.g. to keep existing dashboards);
  `drop`: keys or glob patterns (`timing_s/*`) that no sink receives; `echo_trap`: the
  thresholds of the Echo Trap warning (`early`, `window`, `std_frac`, `entropy_frac`,
  `grad_spike`); `shadow_estimators`: advantage estimators measured beside the run's own
  on every training batch (`shadow/<name>/*`: their noise on one scale and how well two
  halves of the batch agree on the policy gradient; `tunix_ppo_ext._src.ppo.shadow_step`).
  """

  rename: dict[str, str] = dataclasses.field(default_factory=dict)
  drop: list[str] = dataclasses.field(default_factory=list)
  # the Echo Trap rule every run watches with (`tunix_ppo_ext._src.metrics.collapse`)
  echo_trap: EchoTrapRule = dataclasses.field(default_factory=EchoTrapRule)
  shadow_estimators: list[str] = dataclasses.field(default_factory=list)

  def keys(self) -> MetricKeys:
    """The validated `MetricKeys` of this section."""
    return MetricKeys(rename=dict(self.rename), drop=tuple(self.drop))


@dataclasses.dataclass
class MeshSection:
  """The device mesh every role shares, and optional own meshes for some roles.

  `shape`: axis sizes (None: all devices on the first axis, `(n, 1)`; one entry may be -1
  for the remaining devices); `axis_names` must include `fsdp` and `tp`. `roles` maps any
  of tunix's roles `actor`, `critic`, `reference`, `rollout` to its own
  `{shape, axis_names}`; unlisted roles use the shared mesh (tunix's
  `ClusterConfig.role_to_mesh`). Device counts are checked when the run is built.
  """

  shape: list[int] | None = None
  axis_names: list[str] = dataclasses.field(default_factory=lambda: ["fsdp", "tp"])
  roles: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RoleMeshSection:
  """One role's own mesh in `mesh.roles` (axis names default to the shared mesh's)."""

  shape: list[int] | None = None
  axis_names: list[str] | None = None


INTERNAL = "internal"  # a RunConfig field's metadata key: no config key of its own


@dataclasses.dataclass
class RunConfig:
  """A whole run: seed, output directory, W&B mode and the four sections."""

  seed: int = 0
  output_dir: str = "runs/default"
  wandb: str = "online"  # without an API key or network: offline; "disabled": none
  sinks: list[str] = dataclasses.field(default_factory=list)  # extra metric sinks, by name
  model: ModelSection = dataclasses.field(default_factory=ModelSection)
  env: EnvSection = dataclasses.field(default_factory=EnvSection)
  envs: list[recipe.EnvEntry] = dataclasses.field(default_factory=list)  # mixed environments
  train: TrainSection = dataclasses.field(default_factory=TrainSection)
  metrics: MetricsSection = dataclasses.field(default_factory=MetricsSection)
  mesh: MeshSection = dataclasses.field(default_factory=MeshSection)
  optim: recipe.OptimSection = dataclasses.field(default_factory=recipe.OptimSection)
  batch: recipe.BatchSection = dataclasses.field(default_factory=recipe.BatchSection)
  sampling: recipe.SamplingSection = dataclasses.field(default_factory=recipe.SamplingSection)
  shaping: ShapingSection = dataclasses.field(default_factory=ShapingSection)
  filter: FilterSection = dataclasses.field(default_factory=FilterSection)
  validation: recipe.ValidationSection = dataclasses.field(default_factory=recipe.ValidationSection)
  dapo: DapoSection = dataclasses.field(default_factory=DapoSection)
  # the `ppo` section, checked as it is read (`ppo_section`)
  ppo: PpoExtConfig = dataclasses.field(default_factory=lambda: ppo_section({}))
  # the `ppo` keys the config gave, as given: what `config_dict` writes back (not a key);
  # None (a RunConfig built in Python): the keys whose values differ from the defaults
  ppo_given: dict[str, Any] | None = dataclasses.field(
    default=None, repr=False, compare=False, metadata={INTERNAL: True}
  )

  def __post_init__(self):
    check_choice("config key 'wandb'", self.wandb, WANDB_MODES)


def ppo_section(
  given: dict[str, Any], train: TrainSection | None = None, model: ModelSection | None = None
) -> PpoExtConfig:
  """The `PpoExtConfig` of the `ppo` section's `given` keys over its defaults, checked (its
  messages name the keys, `PPO_KEYS`): log-probs at the sampling temperature
  (`train.temperature`) unless `ppo.logps_temperature` says otherwise, and the fused head
  and packing as `model.fused_head` and `model.packing` set them.

  Args:
    given: the section's keys (checked names: `_check_ppo`).
    train: the `train` section (None: its defaults).
    model: the `model` section (None: its defaults).

  Returns:
    The `PpoExtConfig`.
  """
  train, model = train or TrainSection(), model or ModelSection()
  return PpoExtConfig(
    **{"logps_temperature": train.temperature, **given},
    fused_head=model.fused_head,
    packing=model.packing,
    keys=PPO_KEYS,
  )


def config_dict(run: RunConfig) -> dict[str, Any]:
  """`run` as `config.json` saves it (W&B and metric sinks receive it too): every section
  as a mapping, `ppo` with the keys the config gave (`ppo_given`).

  Args:
    run: the run config.

  Returns:
    The JSON-ready mapping (loads back into the same run config).
  """
  data = dataclasses.asdict(dataclasses.replace(run, ppo=None, ppo_given=None))
  del data["ppo_given"]
  data["ppo"] = dict(run.ppo_given if run.ppo_given is not None else _ppo_changes(run))
  return data


def _ppo_changes(run: RunConfig) -> dict[str, Any]:
  """The `ppo` keys whose values in `run.ppo` differ from the section's defaults."""
  default = ppo_section({}, run.train, run.model)
  names = ppo_keys()
  return {k: getattr(run.ppo, k) for k in names if getattr(run.ppo, k) != getattr(default, k)}


EMBEDDED_DEFAULT = pathlib.Path(__file__).with_name("default.yaml")


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
  """A checked run config worked out once: what every consumer used to derive again."""

  run: RunConfig
  ppo: PpoExtConfig  # the `ppo` section over PpoExtConfig's defaults, validated
  models: ModelPlan  # the models of the run's roles, as `role_models.build_roles` builds them
  batch: recipe.BatchPlan  # every batch size in episodes, filled (`recipe.resolve_batch`)
  env_entries: tuple[recipe.EnvEntry, ...]  # the training environments with their groups
  validation_entries: tuple[recipe.EnvEntry, ...]  # validation's environments (or none)
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
  """`load_resolved(...).run`: the checked run config (see `load_resolved`).

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
  checks every key and value, and resolves the run once.

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
  if isinstance(overrides, str | bytes):  # its characters would be taken as overrides
    raise ConfigError(
      f"overrides={overrides!r} must be a list of KEY=VALUE strings, e.g. [{overrides!r}]"
    )
  token = _NEED_FILES.set(need_files)
  try:
    return resolve(_load_run_config(path, overrides))
  except (ConfigError, registry.PluginError):
    raise
  except ValueError as err:  # PpoExtConfig's and the environments' checks: bad input here
    raise ConfigError(str(err)) from err
  finally:
    _NEED_FILES.reset(token)


_NEED_FILES = contextvars.ContextVar("need_files", default=True)


def _load_run_config(path: str | None, overrides: typing.Sequence[str]) -> RunConfig:
  file = EMBEDDED_DEFAULT if path is None else pathlib.Path(path)
  if not file.is_file():
    what = "a directory, not a YAML file" if file.is_dir() else "no such file"
    raise ConfigError(f"--config {path!r}: {what}")
  data = load_yaml(file, f"--config {path!r}") or {}
  if not isinstance(data, dict):
    raise ConfigError(f"--config {path!r}: expected a mapping at the top level")
  for override in overrides:
    key, sep, raw = override.partition("=")
    if not sep or not key:
      raise ConfigError(f"override {override!r} must look like section.key=value")
    _set_dotted(data, key.split("."), load_yaml(raw, f"override {override!r}"))
  return _build(RunConfig, data, prefix="")


def _set_dotted(data: dict[str, Any], keys: list[str], value: Any) -> None:
  for key in keys[:-1]:
    data = data.setdefault(key, {})
    if not isinstance(data, dict):
      raise ConfigError(f"override path {'.'.join(keys)!r} goes through a non-mapping")
  data[keys[-1]] = value


def _build(cls: type, data: dict[str, Any], prefix: str, default: Any = None) -> Any:
  """Instantiates dataclass `cls` from `data`, checking keys and types recursively.

  Keys `data` leaves out keep `default`'s values (a section's own default, e.g. the
  actor's cosine schedule in `optim.actor`, not the field type's), also inside nested
  sections: `optim.actor.clip_grad_norm=1.0` changes that one key."""
  if not isinstance(data, dict):
    raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
  fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get(INTERNAL)}
  hints = typing.get_type_hints(cls)
  kwargs, data = {}, dict(data)
  ppo = _check_ppo(data.pop("ppo", {})) if cls is RunConfig else None
  for key, value in data.items():
    if key not in fields:
      hint = did_you_mean(key, fields, n=3)
      raise ConfigError(f"unknown config key {prefix + key!r}{hint} (valid: {sorted(fields)})")
    nested = getattr(default, key) if default is not None else _field_default(fields[key])
    kwargs[key] = _check_type(prefix + key, value, hints[key], nested)
  if ppo is not None:
    kwargs["ppo"] = None  # read after the sections it takes values from, checked
  if "keys" in inspect.signature(cls).parameters:  # a section checking its own fields
    kwargs["keys"] = FieldKeys(prefix=prefix)  # names them by their keys (`sampling.top_p`)
  instance = cls(**kwargs) if default is None else dataclasses.replace(default, **kwargs)
  if cls is RunConfig:
    _validate_run(instance)  # train.temperature, model.fused_head, ... first: `ppo` takes them
    instance.ppo = ppo_section(ppo, instance.train, instance.model)
    instance.ppo_given = ppo
    _warn_unread_ppo_keys(instance.ppo, ppo, instance.metrics.shadow_estimators)
  return instance


def _field_default(field: dataclasses.Field) -> Any:
  """A dataclass field's default value (its factory's product); None without one."""
  if field.default is not dataclasses.MISSING:
    return field.default
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return None


def _check_type(name: str, value: Any, hint: Any, default: Any = None) -> Any:
  if dataclasses.is_dataclass(hint):
    base = default if isinstance(default, hint) else None
    return _build(hint, value, prefix=name + ".", default=base)
  origin = typing.get_origin(hint)
  allowed = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
  for option in allowed:
    base = typing.get_origin(option) or option
    if option is type(None) and value is None:
      return value
    if base is float and isinstance(value, int | float) and not isinstance(value, bool):
      return float(value)
    if base is int and isinstance(value, int) and not isinstance(value, bool):
      return value
    if base is list and isinstance(value, list):
      (item,) = typing.get_args(option) or (typing.Any,)
      return [_check_type(f"{name}[{i}]", v, item) for i, v in enumerate(value)]
    if base in (str, bool, dict) and isinstance(value, base):
      return value
    if base is typing.Any:
      return value
  names = " or ".join(getattr(a, "__name__", str(a)) for a in allowed)
  raise ConfigError(f"config key {name!r} must be {names}, got {value!r}")


def _check_ppo(value: Any) -> dict[str, Any]:
  if not isinstance(value, dict):
    raise ConfigError(f"config key 'ppo' must be a mapping, got {value!r}")
  names = ppo_keys()
  for key in value:
    if key in PPO_FIELDS_SET_ELSEWHERE:
      raise ConfigError(f"config key 'ppo.{key}': set {PPO_FIELDS_SET_ELSEWHERE[key]} instead")
    if key not in names:
      hint = did_you_mean(key, names, n=3)
      raise ConfigError(f"unknown config key {'ppo.' + key!r}{hint}")
  return dict(value)


def ppo_keys() -> list[str]:
  """The `ppo` section's keys: `PpoExtConfig`'s fields but those another section sets."""
  return [
    f.name for f in dataclasses.fields(PpoExtConfig) if f.name not in PPO_FIELDS_SET_ELSEWHERE
  ]


# PpoExtConfig fields the run config sets from another section's key
PPO_FIELDS_SET_ELSEWHERE = {"fused_head": FUSED_HEAD_KEY, "packing": "model.packing"}
# how PpoExtConfig's checks name its fields in a run config's messages
PPO_KEYS = FieldKeys(prefix="ppo.", elsewhere=PPO_FIELDS_SET_ELSEWHERE)


def _validate_model(model: ModelSection) -> None:
  if model.num_heads % model.num_kv_heads:
    raise ConfigError(
      f"config key 'model.num_kv_heads'={model.num_kv_heads} must divide "
      f"model.num_heads={model.num_heads}"
    )
  if model.alphabet is not None:
    repeated = sorted({c for c in model.alphabet if model.alphabet.count(c) > 1})
    if repeated or not model.alphabet:
      raise ConfigError(
        "config key 'model.alphabet' must be non-empty with each character once; "
        f"repeated: {repeated}"
      )
  if model.checkpoint is not None and _NEED_FILES.get():
    directory = pathlib.Path(_checkpoint_directory(model.checkpoint))
    if not gguf_files.is_gguf(model.checkpoint) and (
      not directory.is_dir() or not list(directory.glob("*.safetensors"))
    ):
      raise ConfigError(
        f"config key 'model.checkpoint': {model.checkpoint!r} is not a directory holding "
        "*.safetensors files"
      )
    _validate_checkpoint_config(model)
  tokenizer = model.tokenizer
  if tokenizer is not None and _NEED_FILES.get() and not pathlib.Path(tokenizer).is_dir():
    raise ConfigError(f"config key 'model.tokenizer': {model.tokenizer!r} is not a directory")
  if model.config_name is not None:
    names = toy_models.qwen3_config_names()
    check_choice("config key 'model.config_name'", model.config_name, names)
  model.spec()  # remat, attention, its block size, dtype: checked by ModelSpec
  inits = toy_models.VALUE_HEAD_INITS
  check_choice("config key 'model.value_head_init'", model.value_head_init, inits)
  _validate_dtype(model)
  _validate_lora(model)


def _validate_dtype(model: ModelSection) -> None:
  if model.dtype == "bfloat16" and model.lora is None:
    raise ConfigError(
      "config key 'model.dtype'='bfloat16' needs model.lora: the weights a run trains stay "
      "float32, so only a frozen base can be bfloat16"
    )


def _validate_lora(model: ModelSection) -> None:
  """`model.lora`: rank an integer >= 1, alpha a finite number > 0, and a `target_modules`
  regex that matches a projection of the policy (and of the critic's backbone with `critic`),
  checked on the policy's structure without weights."""
  section = lora_section(model)
  if section is None:
    return
  check_integer(f"config key '{lora.KEY}.rank'", section.rank, low=1)
  check_number(f"config key '{lora.KEY}.alpha'", section.alpha, low=0.0, low_open=True)
  policy = _abstract_policy(model)
  paths = lora.projection_paths(policy)
  what = f"the {type(policy).__name__} policy"
  lora.check_targets(section.target_modules, paths, what)
  head = "lm_head" if "lm_head" in paths else "embedder"  # untied, or the tied embedding
  if model.fused_head and re.fullmatch(section.target_modules, head):
    raise ConfigError(
      f"config key '{FUSED_HEAD_KEY}'=True: {lora.KEY}.target_modules adapts the LM head "
      f"{head!r}, which the fused head computes from its frozen weight; leave it out"
    )
  if section.critic:
    critic_paths = [f"backbone/{p}" for p in paths if not p.startswith("lm_head")]
    lora.check_targets(section.target_modules, critic_paths, f"{what}'s critic (lora.critic)")


def _abstract_policy(model: ModelSection) -> Any:
  """The policy's modules and shapes without weights (`nnx.eval_shape`): the checkpoint's
  family and sizes from its `config.json`, else a Qwen3 of `config_name` or the toy sizes."""
  hf = hf_models.read_hf_config(model.checkpoint) if model.checkpoint is not None else None
  if hf is not None:
    return toy_models.abstract_model(
      hf_models.tunix_config(hf), hf_models.family_of(hf).model_class
    )
  return toy_models.abstract_model(_policy_config(model, None))


def _policy_config(model: ModelSection, hf: dict[str, Any] | None) -> Any:
  """The base policy's tunix config: a checkpoint's `config.json` (`hf`) for its family,
  else a Qwen3 of `config_name` or of the toy sizes (their vocabulary of 2 is the
  tokenizer's when built: the paths and the rest of the config do not depend on it)."""
  if hf:
    return hf_models.tunix_config(hf)
  if model.config_name is not None:
    return toy_models.named_qwen3_config(model.config_name)
  return toy_config(model, 2)


def model_plan(run: RunConfig) -> ModelPlan:
  """The run's `ModelPlan`: the checkpoint's `config.json` read once (its family and
  sizes), else `model.config_name`'s or the toy sizes' Qwen3, configured by `model.remat`,
  `.attention` and `.dtype`; `model.lora` and the value head's start.

  Args:
    run: the checked run config.

  Returns:
    The `ModelPlan`.
  """
  model, spec, section = run.model, run.model.spec(), lora_section(run.model)
  hf = hf_models.read_hf_config(model.checkpoint) if model.checkpoint is not None else None
  return ModelPlan(
    spec=spec,
    config=hf_models.configured(_policy_config(model, hf), spec),
    family=hf_models.family_of(hf) if hf else None,
    checkpoint=model.checkpoint,
    toy_vocab=not hf and model.config_name is None,
    seed=run.seed,
    lora=None if section is None else section.spec(),
    critic_lora=section is not None and section.critic,
    head_init=model.value_head_init,
  )


def _validate_checkpoint_config(model: ModelSection) -> None:
  """A checkpoint's `config.json` (if any) against `model.*`."""
  defaults = ModelSection()
  given = {
    k: getattr(model, k) for k in hf_models.SIZE_KEYS if getattr(model, k) != getattr(defaults, k)
  }
  try:
    hf_models.validate_checkpoint(model.checkpoint, given, model.config_name)
  except ValueError as err:
    raise ConfigError(f"config key 'model.checkpoint' ({model.checkpoint!r}): {err}") from None


def tokenizer_directory(model: ModelSection) -> str | None:
  """`model.tokenizer`, else the checkpoint's own directory when it has `config.json` and a
  saved tokenizer, else None (the built-in character tokenizer)."""
  if model.tokenizer is not None or model.checkpoint is None:
    return model.tokenizer
  if hf_models.read_hf_config(model.checkpoint) and hf_models.has_tokenizer(model.checkpoint):
    return _checkpoint_directory(model.checkpoint)  # a GGUF file's: its converted directory
  return None


def _checkpoint_directory(checkpoint: str) -> str:
  """`model.checkpoint` itself, or for a GGUF file (or short name) the Hugging Face
  directory it is converted into (config and tokenizer; the weights when loaded)."""
  try:
    return gguf_files.resolve(checkpoint)
  except ValueError as err:  # gguf_files names the file, not the key
    raise ConfigError(f"config key 'model.checkpoint': {err}") from None


def _validate_mesh(section: MeshSection) -> None:
  """Shapes, axis names and role names of the `mesh` section (devices: when built)."""
  check_mesh_spec("mesh", section.shape, section.axis_names)
  for role, entry in section.roles.items():
    if role not in MESH_ROLES:
      hint = did_you_mean(role, MESH_ROLES, n=2)
      raise ConfigError(f"config key 'mesh.roles.{role}': unknown role{hint} (valid: {MESH_ROLES})")
    own = _build(RoleMeshSection, entry, prefix=f"mesh.roles.{role}.")
    check_mesh_spec(f"mesh.roles.{role}", own.shape, own.axis_names or section.axis_names)


def check_turn_tokens(
  max_tokens_per_turn: int,
  env: Any,
  count: typing.Callable[[str], int] = len,
  tokenizer: str = "the built-in tokenizer",
) -> None:
  """Refuses a turn too short for the environment's `longest_reply` (an optional attribute,
  `guess`'s largest number): the agent could never type it (the rollout cuts each turn at
  `env.max_tokens_per_turn`). `count`: the reply's tokens (the built-in tokenizer: one per
  character, checked at load; a Hugging Face one's when it is loaded, `job`)."""
  reply = getattr(env, "longest_reply", None)
  if isinstance(reply, str) and count(reply) > max_tokens_per_turn:
    raise ConfigError(
      f"config key 'env.max_tokens_per_turn'={max_tokens_per_turn} is below the "
      f"{envs.env_name(env)!r} environment's longest reply, {reply!r} ({count(reply)} tokens "
      f"with {tokenizer}): the agent could not type it; raise it to at least {count(reply)}"
    )


def _check_lengths(run: RunConfig, env: Any) -> None:
  """Lengths that cannot work, refused before anything compiles: a `max_prompt_length`
  below the first observation (built-in tokenizer: one token per character, plus BOS), a
  turn too short for the environment's longest reply (`check_turn_tokens`), and a KV cache
  for the toy model larger than this machine's memory."""
  if tokenizer_directory(run.model) is None:
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
    check_turn_tokens(run.env.max_tokens_per_turn, env)
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


def run_env_entries(run: RunConfig, num_generations: int) -> list[recipe.EnvEntry]:
  """The run's training environments: `envs`, else `env.name` / `env.kwargs` with every
  group."""
  if run.envs:
    return list(run.envs)
  groups = run.train.batch_size // num_generations
  return [recipe.EnvEntry(run.env.name, dict(run.env.kwargs), max(1, groups))]


def _validate_env_mix(run: RunConfig, num_generations: int) -> None:
  """`envs` instead of `env.name` / `env.kwargs` (not both), its groups filling the batch."""
  if not run.envs:
    return
  default = EnvSection()
  if run.env.name != default.name or run.env.kwargs:
    raise ConfigError(
      "config keys 'envs' and 'env.name'/'env.kwargs' both name the training environment: "
      "give one ('env' keeps the limits: max_turns, max_completion_len, max_tokens_per_turn)"
    )
  recipe.validate_env_entries("envs", run.envs, num_generations, run.train.batch_size)


def _validate_run(run: RunConfig) -> None:
  """Value checks that need more than a type (PPO fields are checked by PpoExtConfig)."""
  if run.output_dir == "":
    raise ConfigError(
      "config key 'output_dir' (--output-dir) is empty: name the directory the run goes to"
    )
  if pathlib.Path(run.output_dir).is_file():
    raise ConfigError(
      f"config key 'output_dir' (--output-dir) must name a directory, got {run.output_dir!r}"
    )
  _validate_numbers(run)
  _validate_model(run.model)
  _validate_mesh(run.mesh)
  keys = run.metrics.keys()  # unknown metrics in rename/drop fail here, with suggestions
  if keys.final(SUMMARY_KEY) is None:
    raise ConfigError(f"config key 'metrics.drop' must keep {SUMMARY_KEY!r}: the summary uses it")
  _validate_envs(run)
  for sink in run.sinks:  # `tunix_ppo_ext.metric_sinks` entry points (plugins), loaded here
    try:
      registry.get(registry.METRIC_SINKS, sink)
    except ValueError as err:
      raise ConfigError(f"config key 'sinks' ({sink!r}): {err}") from None


SEED_MAX = 2**31 - 1  # the run's seeds feed NumPy's and JAX's generators, and `seed + 1`


def _validate_numbers(run: RunConfig) -> None:
  """Counts and sizes are positive integers, rates positive and finite."""
  positive = {
    "train.steps": run.train.steps,
    "train.batch_size": run.train.batch_size,
    "train.max_prompt_length": run.train.max_prompt_length,
    "train.checkpoint_every": run.train.checkpoint_every,
    "train.eval_every": run.train.eval_every,
    "env.max_turns": run.env.max_turns,
    "env.max_completion_len": run.env.max_completion_len,
    "env.max_tokens_per_turn": run.env.max_tokens_per_turn,
    **{f"model.{k}": getattr(run.model, k) for k in hf_models.SIZE_KEYS},
  }
  for key, value in positive.items():
    check_integer(f"config key {key!r}", value, low=1)
  check_integer("config key 'seed'", run.seed, low=0, high=SEED_MAX)
  check_integer("config key 'train.eval_batches'", run.train.eval_batches, low=0)
  check_integer("config key 'train.eval_samples'", run.train.eval_samples, low=0)
  for key in ("lr", "critic_lr"):  # Adam moves each weight by about lr a step: 1 at most
    check_number(f"config key 'train.{key}'", getattr(run.train, key), 0.0, 1.0, low_open=True)
  # logits / 1e-30 overflow: every update would be skipped
  check_number("config key 'train.temperature'", run.train.temperature, low=1e-3)


def _validate_envs(run: RunConfig) -> None:
  """The environment builds, fits the lengths, and can be chat-templated."""
  try:  # builds the environment once: unknown names and bad kwargs fail here, by key
    env = envs.make_env(run.env.name, **run.env.kwargs)
  except (TypeError, ValueError) as err:
    raise ConfigError(
      f"config keys 'env.name'/'env.kwargs' ({run.env.name!r}, {run.env.kwargs!r}): {err}"
    ) from None
  _check_lengths(run, env)
  if run.env.chat_template and tokenizer_directory(run.model) is None:
    raise ConfigError(
      "config key 'env.chat_template'=True needs a Hugging Face tokenizer with a chat template "
      "(model.tokenizer or a checkpoint's own); the built-in character tokenizer has none"
    )


def resolve(run: RunConfig) -> ResolvedRun:
  """Works `run` out once: its `PpoExtConfig`, the batch arithmetic, the environment mix and
  the recipe sections checked against each other (`run.recipe`, `run.dapo_section`).

  Args:
    run: the checked run config.

  Returns:
    The `ResolvedRun`.

  Raises:
    ConfigError: naming the key, the value and what is allowed.
  """
  ppo = run.ppo  # checked as it was read (`ppo_section`)
  _validate_numbers(run)  # again: a config built or changed in code was never loaded
  num_generations = ppo.num_generations
  batch, validation = _check_sections(run, num_generations)
  shadow_key = "config key 'metrics.shadow_estimators'"
  for name in shadow_step.check_shadow_estimators(
    run.metrics.shadow_estimators, ppo.uses_critic, shadow_key
  ):
    problem = groups_of_one_problem(name, num_generations)
    if problem:  # its advantages would be the raw scores
      raise ConfigError(f"{shadow_key}: {name!r} needs ppo.num_generations {problem}")
  budget = episode_budget(run)
  validate_dapo(run.dapo, budget, num_generations)
  entries = run_env_entries(run, num_generations)
  tokenizer_dir = tokenizer_directory(run.model)
  first = entries[0]
  return ResolvedRun(
    run=run,
    ppo=ppo,
    models=model_plan(run),
    batch=batch,
    env_entries=tuple(entries),
    validation_entries=tuple(validation),
    rollout_envs=tuple(recipe.env_specs(run.envs)),
    validation_envs=tuple(recipe.env_specs(validation)),
    episode_budget=budget,
    checkpoint_roles=resume.ROLES if ppo.uses_critic else ("actor",),
    optimizers=recipe.optimizers(run.optim, run.train.lr, run.train.critic_lr, run.train.steps),
    cluster=_cluster_spec(run, batch, num_generations),
    config=config_dict(run),
    tokenizer_dir=tokenizer_dir,
    max_return=env_max_return(entries),
    first_observation=(
      None if tokenizer_dir is None else envs.make_env(first.name, **first.kwargs).reset(0)[0]
    ),
  )


def _check_sections(
  run: RunConfig, num_generations: int
) -> tuple[recipe.BatchPlan, list[recipe.EnvEntry]]:
  """The checks across sections (`resolve`'s): groups, the environment mix, lengths, the
  optimizers, the batch arithmetic, filtering and validation; `(batch plan, validation
  entries)`."""
  ppo = run.ppo
  check_groups(ppo.advantage_estimator, num_generations, PPO_KEYS)  # changed in code
  if run.train.batch_size % num_generations:
    raise ConfigError(
      f"config key 'train.batch_size'={run.train.batch_size} must be a multiple of "
      f"ppo.num_generations={num_generations}"
    )
  _validate_env_mix(run, num_generations)
  _check_attention_rows(run)
  for entry in run.envs:
    _check_lengths(run, envs.make_env(entry.name, **entry.kwargs))
  recipe.validate_optim(run.optim, run.train.steps)
  batch = recipe.resolve_batch(run.batch, run.train.batch_size, num_generations)
  _warn_long_warmup(ppo, run.train.steps, ppo.num_iterations * batch.updates_per_epoch)
  chunk = batch.rollout_chunk
  recipe.validate_filter(run.filter, chunk, num_generations)
  recipe.validate_validation(
    run.validation, run.train.batch_size, run.env.name, chunk, num_generations
  )
  validation = recipe.validation_entries(run.validation, run.envs, num_generations)
  for entry in run.validation.envs:
    _check_lengths(run, envs.make_env(entry.name, **entry.kwargs))
  return batch, validation


def env_max_return(entries: list[recipe.EnvEntry]) -> float:
  """The best mean episode return of a batch: the environments' `max_return`, weighted by
  their groups.

  Args:
    entries: the training environments with their groups.

  Returns:
    The weighted mean of their `max_return`.
  """
  total = sum(e.groups * envs.make_env(e.name, **e.kwargs).max_return for e in entries)
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
    if value == _field_default(fields[key]) or (key in _OFF_SWITCHES and value is False):
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


def _cluster_spec(run: RunConfig, batch: recipe.BatchPlan, num_generations: int) -> ClusterSpec:
  """The run's tunix cluster settings: steps, lengths, learning rates, tunix's batch sizes
  in prompts (those the config set), checkpoint and evaluation cadence, sampling."""
  train = run.train
  sampling, eval_sampling = recipe.sampling_kwargs(run.sampling)
  return ClusterSpec(
    max_steps=train.steps,
    batch=train.batch_size // num_generations,
    max_prompt_length=train.max_prompt_length,
    max_tokens_to_generate=run.env.max_completion_len + run.env.max_tokens_per_turn,
    lr=train.lr,
    critic_lr=train.critic_lr,
    **batch.tunix_sizes,
    checkpoint_every=train.checkpoint_every,
    eval_every=train.eval_every,
    temperature=train.temperature,
    seed=run.seed,
    return_logprobs=True,  # the rollout's own log-probs (`rollout/is_*`, reuse when on-policy)
    sampling=sampling,
    eval_sampling=eval_sampling,
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


def as_resolved(run: ResolvedRun | RunConfig, caller: str = "as_resolved") -> ResolvedRun:
  """`run` itself when resolved already, else `resolve(run)` (for Python callers); a
  TypeError naming `caller` for anything else (a config file's path, None)."""
  if isinstance(run, ResolvedRun):
    return run
  if not isinstance(run, RunConfig):
    raise TypeError(
      f"{caller}: expected a RunConfig or a ResolvedRun (config.load_run_config(PATH, "
      f"[KEY=VALUE, ...]) or config.load_resolved), got {type(run).__name__} {run!r:.60}"
    )
  return resolve(run)


def episode_budget(run: RunConfig) -> int:
  """The most agent tokens an episode of `run` can hold (`dapo_section.agent_token_budget`)."""
  env = run.env
  return agent_token_budget(env.max_completion_len, env.max_turns, env.max_tokens_per_turn)
