"""The run config's own sections and `RunConfig`, each field checked beside it.

Stdlib and the package's light modules only: a config file is read and checked without JAX,
tunix or transformers (`tunix_ppo_ext._src.config.loader`). Sections: `model`, `env` (or
several: `envs`), `train`, `metrics`, `mesh`, `optim`, `batch`, `sampling`, `shaping`,
`filter`, `validation`, `dapo` (`recipe_sections`, `rollout_sections`), `ppo` (the keys
given, over `PpoExtConfig`'s defaults: `ppo_section`) and top-level `seed`, `output_dir`,
`wandb`, `sinks`. A bound is declared with its field (`checks.bounded`) and each section
checks its own fields as it is built; what needs the tokenizer, the checkpoint, the
environments or tunix is checked once, as the run is resolved
(`tunix_ppo_ext._src.run.run_config.resolve`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from tunix_ppo_ext._src.checks import (
  ConfigError,
  FieldKeys,
  bounded,
  check_choice,
  check_fields,
  check_integer,
  check_number,
  did_you_mean,
)
from tunix_ppo_ext._src.config import ppo_section
from tunix_ppo_ext._src.config.model_spec import ModelSpec
from tunix_ppo_ext._src.config.recipe_sections import (
  BatchSection,
  DapoSection,
  EnvEntry,
  OptimSection,
  SamplingSection,
  ValidationSection,
)
from tunix_ppo_ext._src.config.rollout_sections import FilterSection, ShapingSection
from tunix_ppo_ext._src.metrics.collapse import EchoTrapRule
from tunix_ppo_ext._src.metrics.keys import SUMMARY_KEY, MetricKeys

WANDB_MODES = ("disabled", "offline", "online")  # `wandb`
KV_CACHE_MODES = ("continue", "reencode")  # `env.kv_cache`
VALUE_HEAD_INITS = ("normal", "zero")  # `model.value_head_init`
FUSED_HEAD_KEY = "model.fused_head"
LORA_KEY = "model.lora"
# `model.lora.target_modules`' default: the projections of every family tunix-ppo-ext loads
# (Qwen2/3, Llama 3: q/k/v/o_proj and the MLP's gate/up/down_proj; Gemma 3: q/kv/qkv_einsum
# and attn_vec_einsum)
DEFAULT_TARGET_MODULES = (
  r".*(q_proj|k_proj|v_proj|o_proj|q_einsum|kv_einsum|qkv_einsum|attn_vec_einsum"
  r"|gate_proj|up_proj|down_proj)"
)
SEED_MAX = 2**31 - 1  # the run's seeds feed NumPy's and JAX's generators, and `seed + 1`
MESH_ROLES: tuple[str, ...] = ("actor", "critic", "reference", "rollout")
REQUIRED_AXES: tuple[str, ...] = ("fsdp", "tp")  # tunix's Qwen3 partition specs, data sharding
_SIZE = {"integer": True, "low": 1}  # a count or a size: an integer >= 1


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
  target_modules: str = DEFAULT_TARGET_MODULES
  critic: bool = False
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    name = (keys or FieldKeys(prefix=f"{LORA_KEY}.")).subject
    check_integer(name("rank"), self.rank, low=1)
    self.alpha = check_number(name("alpha"), self.alpha, low=0.0, low_open=True)


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
  num_layers: int = bounded(2, **_SIZE)
  embed_dim: int = bounded(64, **_SIZE)
  hidden_dim: int = bounded(128, **_SIZE)
  num_heads: int = bounded(2, **_SIZE)
  head_dim: int = bounded(32, **_SIZE)
  num_kv_heads: int = bounded(1, **_SIZE)
  lora: LoraSection | None = None  # LoRA adapters (None: full fine-tuning)
  fused_head: bool = False
  remat: str = "none"  # one of none, block, decoder (tunix's RematConfig)
  value_head_init: str = "normal"  # the value head kernel at start: normal or zero
  attention: str = "dense"  # dense ([T, T] scores), splash (tunix's TPU kernel), blockwise
  attention_block_size: int = 512  # splash's or blockwise's block, in tokens
  packing: bool = False  # training passes on packed rows
  dtype: str | None = None  # the frozen weights': bfloat16 or float32 (None: the checkpoint's)
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    keys = keys or FieldKeys(prefix="model.")
    check_fields(self, keys)
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(
        f"{keys.subject('num_kv_heads')}={self.num_kv_heads} must divide "
        f"{keys.key('num_heads')}={self.num_heads}"
      )
    if self.alphabet is not None:
      repeated = sorted({c for c in self.alphabet if self.alphabet.count(c) > 1})
      if repeated or not self.alphabet:
        raise ConfigError(
          f"{keys.subject('alphabet')} must be non-empty with each character once; "
          f"repeated: {repeated}"
        )
    check_choice(keys.subject("value_head_init"), self.value_head_init, VALUE_HEAD_INITS)
    self.spec()  # remat, attention, its block size, dtype: checked by ModelSpec
    if self.dtype == "bfloat16" and self.lora is None:
      raise ConfigError(
        f"{keys.subject('dtype')}='bfloat16' needs {LORA_KEY}: the weights a run trains stay "
        "float32, so only a frozen base can be bfloat16"
      )

  def spec(self) -> ModelSpec:
    """The checked `ModelSpec` of `remat`, `attention`, `attention_block_size` and `dtype`."""
    return ModelSpec(self.remat, self.attention, self.attention_block_size, self.dtype)


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
  max_turns: int = bounded(4, **_SIZE)
  max_completion_len: int = bounded(16, **_SIZE)
  max_tokens_per_turn: int = bounded(2, **_SIZE)
  loss_on_observations: bool = False  # ablation: train on environment tokens too
  chat_template: bool = False  # format episodes with the tokenizer's chat template
  kv_cache: str = "continue"  # each turn continues from the KV cache; "reencode": old path
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    keys = keys or FieldKeys(prefix="env.")
    check_fields(self, keys)
    check_choice(keys.subject("kv_cache"), self.kv_cache, KV_CACHE_MODES)


@dataclasses.dataclass
class TrainSection:
  """Steps, batch, optimiser and sampling settings of the run.

  `lr`, `critic_lr`: at most 1 (Adam moves each weight by about lr a step);
  `temperature`: at least 1e-3 (logits divided by less overflow: no update would run).
  """

  steps: int = bounded(600, **_SIZE)
  batch_size: int = bounded(32, **_SIZE)
  lr: float = bounded(1e-3, low=0.0, high=1.0, low_open=True)
  critic_lr: float = bounded(3e-3, low=0.0, high=1.0, low_open=True)
  temperature: float = bounded(1.0, low=1e-3)
  max_prompt_length: int = bounded(8, **_SIZE)
  checkpoint_every: int = bounded(100, **_SIZE)  # updates between saves; also 1 and the last
  eval_every: int = bounded(100, **_SIZE)
  eval_batches: int = bounded(1, integer=True, low=0)
  eval_samples: int = bounded(4, integer=True, low=0)  # conversations to samples.jsonl, W&B
  keys: dataclasses.InitVar[FieldKeys | None] = None  # how the checks name the keys

  def __post_init__(self, keys: FieldKeys | None = None):
    check_fields(self, keys or FieldKeys(prefix="train."))


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

  def __post_init__(self):
    if self.keys().final(SUMMARY_KEY) is None:  # unknown names fail in MetricKeys
      raise ConfigError(f"config key 'metrics.drop' must keep {SUMMARY_KEY!r}: the summary uses it")

  def keys(self) -> MetricKeys:
    """The validated `MetricKeys` of this section."""
    return MetricKeys(rename=dict(self.rename), drop=tuple(self.drop))


@dataclasses.dataclass
class RoleMeshSection:
  """One role's own mesh in `mesh.roles` (axis names default to the shared mesh's)."""

  shape: list[int] | None = None
  axis_names: list[str] | None = None


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
  roles: dict[str, RoleMeshSection] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    check_mesh_spec("mesh", self.shape, self.axis_names)
    for role, own in self.roles.items():
      key = f"mesh.roles.{role}"
      if role not in MESH_ROLES:
        hint = did_you_mean(role, MESH_ROLES, n=2)
        raise ConfigError(f"config key {key!r}: unknown role{hint} (valid: {MESH_ROLES})")
      check_mesh_spec(key, own.shape, own.axis_names or self.axis_names)


def check_mesh_spec(key: str, shape: list[int] | None, axis_names: list[str]) -> None:
  """Static checks of one mesh (no devices needed); ConfigError naming `key`.

  `shape`: axis sizes (each >= 1, or a single -1 for "the remaining devices"), as many as
  `axis_names`; None means all devices on the first axis. `axis_names`: distinct, and
  must include `fsdp` and `tp` (the axes tunix's Qwen3 shards its weights and data on).
  """
  names = list(axis_names)
  if len(set(names)) != len(names):
    raise ConfigError(f"config key '{key}.axis_names'={names} has repeated names")
  missing = [n for n in REQUIRED_AXES if n not in names]
  if missing:
    raise ConfigError(
      f"config key '{key}.axis_names'={names} must include {list(REQUIRED_AXES)} (tunix's "
      f"Qwen3 shards weights on them and data on 'fsdp'); missing {missing}"
    )
  if shape is None:
    return
  sizes = list(shape)
  if len(sizes) != len(names):
    raise ConfigError(
      f"config key '{key}.shape'={sizes} has {len(sizes)} axes but '{key}.axis_names'={names} "
      f"has {len(names)}"
    )
  if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
    raise ConfigError(
      f"config key '{key}.shape'={sizes}: sizes must be >= 1, with at most one -1 "
      "(the remaining devices)"
    )


@dataclasses.dataclass
class RunConfig:
  """A whole run: seed, output directory, W&B mode and the four sections."""

  seed: int = bounded(0, integer=True, low=0, high=SEED_MAX)
  output_dir: str = "runs/default"
  wandb: str = "online"  # without an API key or network: offline; "disabled": none
  sinks: list[str] = dataclasses.field(default_factory=list)  # extra metric sinks, by name
  model: ModelSection = dataclasses.field(default_factory=ModelSection)
  env: EnvSection = dataclasses.field(default_factory=EnvSection)
  envs: list[EnvEntry] = dataclasses.field(default_factory=list)  # mixed environments
  train: TrainSection = dataclasses.field(default_factory=TrainSection)
  metrics: MetricsSection = dataclasses.field(default_factory=MetricsSection)
  mesh: MeshSection = dataclasses.field(default_factory=MeshSection)
  optim: OptimSection = dataclasses.field(default_factory=OptimSection)
  batch: BatchSection = dataclasses.field(default_factory=BatchSection)
  sampling: SamplingSection = dataclasses.field(default_factory=SamplingSection)
  shaping: ShapingSection = dataclasses.field(default_factory=ShapingSection)
  filter: FilterSection = dataclasses.field(default_factory=FilterSection)
  validation: ValidationSection = dataclasses.field(default_factory=ValidationSection)
  dapo: DapoSection = dataclasses.field(default_factory=DapoSection)
  # the `ppo` keys given (checked alone: `ppo_section`); the rest keep PpoExtConfig's
  # defaults, and `resolve` builds the `PpoExtConfig` (`ResolvedRun.ppo`)
  ppo: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    check_fields(self, FieldKeys())
    check_choice("config key 'wandb'", self.wandb, WANDB_MODES)
    if self.output_dir == "":
      raise ConfigError(
        "config key 'output_dir' (--output-dir) is empty: name the directory the run goes to"
      )
    if pathlib.Path(self.output_dir).is_file():
      raise ConfigError(
        f"config key 'output_dir' (--output-dir) must name a directory, got {self.output_dir!r}"
      )
    self.ppo = ppo_section.check_ppo_section(self.ppo)
