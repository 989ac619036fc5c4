"""`tunix-ppo-ext plan`: does a run config fit the chips, answered by the compiler, no TPU.

The run's models are built abstractly (`tunix.abstract`: no weights) as the job builds them
(`role_models.roles_around`: LoRA adapters, the critic only when the estimator uses one, the
reference sharing a LoRA actor's base), with the run's optimizers (`ResolvedRun.optimizers`,
in tunix's `optax.MultiSteps` under a train micro-batch). Every jitted piece of a step (the
multi-turn rollout's sampler programs, the log-prob and value passes, the train steps) is
compiled for the rows tunix feeds it (`StepRows`) and the config's lengths and mesh on the
devices of a TPU topology (`jax.experimental.topologies`, deviceless ahead-of-time
compilation with the TPU compiler of `libtpu`: `pip install
'tunix-ppo-ext[plan]'`), and the compiler's per-device memory figures are added up: the
state every role keeps on the device all step (weights, optimizer state) plus the largest
piece's transient memory (its batch or sampling state, temporaries, outputs not written
in place). Without `libtpu` the pieces compile for simulated CPU devices instead;
argument and output bytes are the same, but the temporaries are the CPU compiler's
(measured on Qwen3-0.6B: twice the TPU's for the train step, 12% below for the log-prob
pass), so the verdict is rough.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.data import gguf_files
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.ops.buckets import bucket, bucket_below
from tunix_ppo_ext._src.ops.packing import PACK_EPISODES
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.run.job import check_attention_backend
from tunix_ppo_ext._src.run.run_config import (
  ModelSection,
  ResolvedRun,
  RunConfig,
  as_resolved,
)
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.aot import compile_pieces as abstract
from tunix_ppo_ext._src.tunix.cluster.mesh import Role, check_batch_divisible, role_meshes
from tunix_ppo_ext._src.tunix.learner import loss_fns
from tunix_ppo_ext._src.tunix.models import hf_models
from tunix_ppo_ext._src.tunix.models.role_models import ModelPlan, roles_around

GIB, MIB = 2**30, 2**20
CPU_CAVEAT = (
  "CPU compiler, no libtpu: arguments and outputs are exact, temporaries are the CPU "
  "compiler's, not the TPU's"
)
# HBM per chip by TPU generation (Cloud TPU documentation).
HBM_GIB = {"v2": 8, "v3": 16, "v4": 32, "v5e": 16, "v5litepod": 16, "v5p": 95, "v6e": 32}
_TOPOLOGY = re.compile(r"^(v2|v3|v4|v5e|v5litepod|v5p|v6e):([1-9]\d*(?:x[1-9]\d*){1,2})$")
DEFAULT_TOPOLOGY = "v5e:2x4"
MEGACORE = ("v4", "v5p")  # one JAX device per chip of two TensorCores
COMPILERS = ("auto", "tpu", "cpu")


@dataclasses.dataclass(frozen=True)
class PlanDevices:
  """The devices compiled for: a TPU topology's compile-only devices, or CPU stand-ins."""

  topology: str
  devices: list[Any]
  compiler: str  # "tpu" or "cpu"
  hbm_bytes: int


def parse_topology(topology: str) -> tuple[str, int]:
  """`(generation, chips)` of e.g. `v5e:2x4` (8 chips) or `v4:2x2x1` (4 chips)."""
  match = _TOPOLOGY.match(topology)
  if not match:
    raise ConfigError(
      f"--topology {topology!r}: expected GENERATION:AxB[xC] with GENERATION one of "
      f"{sorted(HBM_GIB)} and sides >= 1, e.g. v5e:2x4 or v4:2x2x1"
    )
  return match.group(1), math.prod(int(d) for d in match.group(2).split("x"))


def plan_devices(topology: str, compiler: str = "auto") -> PlanDevices:
  """The topology's compile-only TPU devices (needs `libtpu`), else (or with `compiler=
  "cpu"`) as many CPU devices as it has chips (`jax_num_cpu_devices`, set before JAX
  starts its backends)."""
  generation, chips = parse_topology(topology)
  if compiler not in COMPILERS:
    raise ConfigError(f"--compiler {compiler!r}: expected one of {COMPILERS}")
  hbm = HBM_GIB[generation] * GIB
  if compiler != "cpu":
    # Compiling for a topology touches no TPU, but with libtpu installed every JAX process
    # (a training run beside it, another plan) takes libtpu's lockfile as it starts, and a
    # second one is refused ("Internal error when accessing libtpu multi-process lockfile").
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
      from jax.experimental import topologies

      # v4 and v5p chips run their two cores as one device ("megacore"), as JAX sees them
      megacore = {"chip_config_name": "megacore"} if generation in MEGACORE else {}
      desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, **megacore)
      return PlanDevices(topology, list(desc.devices), "tpu", hbm)
    except RuntimeError as err:
      if "not installed" not in str(err) or compiler == "tpu":
        raise ConfigError(f"--topology {topology!r}: no TPU compiler: {err}") from err
  try:  # refused once JAX's backends are up; then the device count below decides
    jax.config.update("jax_num_cpu_devices", chips)
  except RuntimeError:
    pass
  cpus = jax.devices("cpu")
  if len(cpus) < chips:
    raise ConfigError(
      f"--topology {topology!r} has {chips} chips but JAX started with {len(cpus)} CPU "
      f"devices: set XLA_FLAGS=--xla_force_host_platform_device_count={chips}"
    )
  return PlanDevices(topology, cpus[:chips], "cpu", hbm)


@dataclasses.dataclass(frozen=True)
class PlannedModel:
  """The policy to plan: tunix's `model_class(config)`, its weights cast to `weight_dtype`
  (None: as the config builds them), and where the sizes came from."""

  config: Any
  model_class: type
  weight_dtype: Any
  source: str


def model_config(resolved: ResolvedRun) -> PlannedModel:
  """The policy as the job builds it: the run's `ModelPlan` (`resolved.models`: the family
  and sizes, configured by `model.remat`, `.attention` and `.dtype`, as the job's), the toy
  sizes with the tokenizer's vocabulary, and the weights' dtype: `model.dtype`, else as
  stored (`_stored_weights`).

  Args:
    resolved: the resolved run.

  Returns:
    The `PlannedModel`.
  """
  models = resolved.models
  config = models.config
  if models.toy_vocab:
    config = dataclasses.replace(config, vocab_size=len(_tokenizer(resolved.run)))
  config, weights, source = _stored_weights(resolved.run.model, models, config)
  if models.spec.dtype is not None:
    weights = hf_models.DTYPES[models.spec.dtype]
  family = models.family.model_class if models.family is not None else QWEN3
  return PlannedModel(config, family, weights, source)


def _stored_weights(model: ModelSection, models: ModelPlan, config: Any) -> tuple[Any, Any, str]:
  """`(config, weight dtype, source)` of the policy's stored weights: a checkpoint's
  `config.json` (a GGUF file's: that of the directory it converts into) gives their dtype
  (`checkpoint_dtype`); a named checkpoint without one is assumed bfloat16, as Qwen3's are
  (in `config`); random init: as `config` builds them (None)."""
  directory = gguf_files.resolve(model.checkpoint) if model.checkpoint is not None else ""
  hf_config = pathlib.Path(directory, "config.json")
  if models.family is not None:  # a checkpoint with its config.json
    name, dtype = checkpoint_dtype(hf_models.read_hf_config(directory) or {}, hf_config)
    return config, dtype, f"{hf_config} ({models.family.name}, {name} weights)"
  if model.config_name is None:
    return config, None, "the model section's toy sizes (random init)"
  named = f"ModelConfig.{model.config_name}"
  if model.checkpoint is None:
    return config, None, f"{named} (random init)"
  config = abstract.with_weight_dtype(config, "bfloat16")
  return config, None, f"{named} (bfloat16 weights assumed: no {hf_config})"


QWEN3 = hf_models.FAMILIES["qwen3"].model_class  # the family of named and toy configs
WEIGHT_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


def checkpoint_dtype(hf: dict[str, Any], file: pathlib.Path) -> tuple[str, Any]:
  """`(name, jnp dtype)` of a checkpoint's weights from its `config.json`: `dtype`, else
  `torch_dtype`, else bfloat16; ValueError naming the file and key for another value."""
  key = "dtype" if hf.get("dtype") is not None else "torch_dtype"
  name = str(hf.get(key) or "bfloat16").removeprefix("torch.")
  if name not in WEIGHT_DTYPES:
    raise ConfigError(
      f"{str(file)!r}: {key}={hf.get(key)!r} is not a weight dtype plan knows "
      f"({sorted(WEIGHT_DTYPES)}); fix the file or plan without model.checkpoint"
    )
  return name, WEIGHT_DTYPES[name]


def _policy(planned: PlannedModel, seed: int) -> nnx.Module:
  """The policy module (inside `nnx.eval_shape`), its weights in the checkpoint's dtype."""
  policy = planned.model_class(planned.config, rngs=nnx.Rngs(seed))
  if planned.weight_dtype is not None:
    hf_models.cast_params(policy, planned.weight_dtype)
  return policy


def _tokenizer(run: RunConfig) -> CharTokenizer:
  """The built-in tokenizer: only its pad and EOS ids reach the compiled pieces (the toy
  model's vocabulary too); a Hugging Face tokenizer is not needed to plan."""
  alphabet = run.model.alphabet
  return CharTokenizer(**({} if alphabet is None else {"alphabet": alphabet}))


@dataclasses.dataclass
class Plan:
  """Per-device figures of a run on a topology (bytes), and what they came from."""

  topology: str
  compiler: str
  hbm_bytes: int
  model_source: str
  parameters: int
  mesh: dict[str, int]
  pieces: list[abstract.CompiledPiece]
  resident: dict[str, int]  # "actor weights", "actor optimizer", ... -> bytes per device
  rows: dict[str, Any]  # StepRows: rows per rollout, log-prob pass and train step
  notes: tuple[str, ...] = ()  # what the figures leave out, one line each

  @property
  def peak_piece(self) -> abstract.CompiledPiece:
    return max(self.pieces, key=lambda p: p.peak_extra_bytes)

  @property
  def peak_bytes(self) -> int:
    return sum(self.resident.values()) + self.peak_piece.peak_extra_bytes

  def to_json(self) -> dict[str, Any]:
    data = dataclasses.asdict(self)
    data["peak_bytes"], data["peak_piece"] = self.peak_bytes, self.peak_piece.name
    data["peak_role"] = self.peak_piece.role
    return data


def plan(
  resolved: ResolvedRun | RunConfig,
  topology: str = DEFAULT_TOPOLOGY,
  pieces: Sequence[str] = (),
  compiler: str = "auto",
) -> Plan:
  """Compiles the run's jitted pieces for `topology`; `pieces` limits which (names as in
  `PIECES`, e.g. `actor/train_step`; empty: all the run builds); `compiler`: `auto` (TPU
  with `libtpu`, else CPU), `tpu` or `cpu`.

  Args:
    resolved: the run, resolved (`config.load_resolved`) or as a `RunConfig`.
    topology: the target TPU topology, e.g. `v5e:2x4` (the default).
    pieces: which pieces to compile (`PIECES` names); empty: all.
    compiler: `"auto"`, `"tpu"` or `"cpu"`.

  Returns:
    The `Plan`: per-device figures (bytes) of each piece.
  """
  unknown = sorted(set(pieces) - set(PIECES))
  if unknown:
    raise ConfigError(f"--pieces {unknown}: unknown; valid: {list(PIECES)}")
  # a RunConfig from Python is resolved here; planning needs no weights, no tokenizer
  resolved = as_resolved(resolved, "plan", need_files=False)
  run, ppo = resolved.run, resolved.ppo
  built_pieces = [name for name in PIECES if ppo.uses_critic or not name.startswith("critic/")]
  absent = sorted(set(pieces) - set(built_pieces))
  if absent:
    raise ConfigError(
      f"--pieces {absent}: ppo.advantage_estimator={ppo.advantage_estimator!r} builds no "
      "critic; valid here: " + str(built_pieces)
    )
  devices = plan_devices(topology, compiler)
  check_attention_backend(resolved.models.spec.attention, devices.compiler)  # splash: TPU compiler
  meshes = role_meshes(run.mesh, devices.devices)
  check_batch_divisible(meshes, run.train.batch_size)
  planned = model_config(resolved)
  built = _Built(resolved, planned, meshes)
  compiled = [piece for name in (pieces or built_pieces) for piece in PIECES[name](built)]
  return Plan(
    topology=topology,
    compiler=devices.compiler,
    hbm_bytes=devices.hbm_bytes,
    model_source=planned.source,
    parameters=built.parameters,
    mesh=dict(meshes[Role.ACTOR].shape),
    pieces=compiled,
    resident=built.resident(),
    rows=dataclasses.asdict(built.rows),
    notes=_notes(run, ppo.num_generations),
  )


PACKING_NOTE = (
  "note: model.packing=true is planned on padded rows; packed passes hold the same tokens "
  "in rows of up to {k} widths, whose dense attention scores take up to {k}x the padded "
  "rows' (model.attention splash or blockwise forms none)"
)


SHARED_PROMPTS_NOTE = (
  "note: passes are planned on padded rows; where a micro-batch's rows share a prompt "
  "(ppo.num_generations={g}), a pass runs each distinct prompt once and holds less "
  "({families} with dense attention): the figures are an upper bound"
)


def _notes(run: RunConfig, num_generations: int) -> tuple[str, ...]:
  """What the plan's figures do not show for this run's settings."""
  if run.model.packing:
    return (PACKING_NOTE.format(k=PACK_EPISODES),)
  if num_generations > 1 and run.model.attention == "dense":
    families = ", ".join(family.__name__ for family in compat.CACHE_FAMILIES)
    return (SHARED_PROMPTS_NOTE.format(g=num_generations, families=families),)
  return ()


@dataclasses.dataclass(frozen=True)
class StepRows:
  """Rows (episodes) each piece of a step sees, as tunix's learner feeds them.

  `rollout`: the episodes one rollout call plays together (tunix's service target:
  `lcm(rollout, log-prob micro-batch)`, each defaulting to the train micro-batch);
  `logps`: rows of one log-prob or value pass (`batch.logps_micro_batch_size` episodes:
  the learner's `RolePasses` chunk tunix's value, in prompts, times `ppo.num_generations`,
  as tunix's GRPO learner does; the whole rollout when unset); `train`: rows of one train step
  (`batch.train_micro_batch_size`, else the mini-batch, else `train.batch_size`);
  `accumulation`: `mini_batch_size / train_micro_batch_size` when a micro-batch is set
  (tunix then wraps the optimizer in `optax.MultiSteps`), else None.
  """

  rollout: int
  logps: int
  train: int
  accumulation: int | None


def step_rows(resolved: ResolvedRun) -> StepRows:
  """The run's `StepRows` from its batch plan (`ResolvedRun.batch`, as the job's)."""
  plan = resolved.batch
  return StepRows(
    rollout=plan.rollout_chunk,
    logps=plan.logps_micro_batch_size,
    train=plan.train_micro_batch_size,
    accumulation=plan.accumulation,
  )


def _check_rows(rows: StepRows, meshes: dict[Role, Any], critic: bool) -> None:
  """ValueError naming the batch key whose rows do not split on the `fsdp` axis of a role
  that takes them (tunix would replicate them; `plan` shards rows on `fsdp` and cannot
  model that); `critic`: whether the run has one."""
  trainers = (Role.ACTOR, Role.CRITIC) if critic else (Role.ACTOR,)
  passes = (Role.ACTOR, Role.REFERENCE, Role.CRITIC) if critic else (Role.ACTOR, Role.REFERENCE)
  checks = [
    ("batch.train_micro_batch_size", rows.train, trainers),
    ("batch.logps_micro_batch_size", rows.logps, passes),
    ("batch.rollout_micro_batch_size", rows.rollout, (Role.ROLLOUT,)),
  ]
  for key, count, roles in checks:
    for role in roles:
      fsdp = meshes[role].shape["fsdp"]
      if count % fsdp:
        raise ConfigError(
          f"plan: {count} rows per pass ({key}) do not split on the {role.value} mesh's "
          f"fsdp size {fsdp}; plan cannot model an unsharded batch"
        )


class _Built:
  """The run's abstract models, optimizers and sizes, shared by the pieces."""

  def __init__(self, resolved: ResolvedRun, planned: PlannedModel, meshes: dict[Role, Any]):
    run = resolved.run
    self.run, self.config, self.meshes = run, planned.config, meshes
    self.ppo, self.cluster = resolved.ppo, resolved.cluster
    self.lora = run.model.lora
    self.rows = step_rows(resolved)
    _check_rows(self.rows, meshes, self.ppo.uses_critic)
    self.actor, self.critic, self.reference = nnx.eval_shape(
      lambda: roles_around(resolved.models, _policy(planned, run.seed))
    )
    actor_tx, critic_tx = resolved.optimizers
    self.actor_wrt = nnx.LoRAParam if self.lora else nnx.Param
    self.critic_wrt = nnx.LoRAParam if self.lora and self.lora.critic else nnx.Param
    steps = self.rows.accumulation
    self.actor_opt = abstract.abstract_optimizer(
      self.actor, actor_tx, wrt=self.actor_wrt, accumulation_steps=steps
    )
    self.critic_opt = None
    if self.ppo.uses_critic:
      self.critic_opt = abstract.abstract_optimizer(
        self.critic, critic_tx, wrt=self.critic_wrt, accumulation_steps=steps
      )
    self.parameters = sum(x.size for x in jax.tree.leaves(abstract.params(self.reference)))
    self.prompt, self.completion = run.train.max_prompt_length, run.env.max_completion_len

  def resident(self) -> dict[str, int]:
    """Bytes per device of what stays on the chips all step (the rollout samples from the
    actor's weights on a shared mesh: tunix's vanilla engine). With LoRA the base weights
    are held once (actor, rollout and reference share them; a LoRA critic's backbone too)."""
    on: dict[str, tuple[Any, Role]] = {}
    if self.lora:
      on["base weights (actor, reference)"] = (abstract.params(self.reference), Role.ACTOR)
      on["actor adapters"] = (nnx.state(self.actor, nnx.LoRAParam), Role.ACTOR)
    else:
      on["actor weights"] = (abstract.params(self.actor), Role.ACTOR)
    on["actor optimizer"] = (abstract.optimizer_state(self.actor_opt), Role.ACTOR)
    if self.critic_opt is not None:
      if self.critic_wrt is nnx.LoRAParam:
        on["critic adapters and head"] = (nnx.state(self.critic, nnx.LoRAParam), Role.CRITIC)
      else:
        on["critic weights"] = (abstract.params(self.critic), Role.CRITIC)
      on["critic optimizer"] = (abstract.optimizer_state(self.critic_opt), Role.CRITIC)
    if not self.lora:
      on["reference weights"] = (abstract.params(self.reference), Role.REFERENCE)
    return {
      name: abstract.tree_bytes_per_device(abstract.shard_abstract(state, self.meshes[role]))
      for name, (state, role) in on.items()
    }


def _actor_train_step(b: _Built) -> list[abstract.CompiledPiece]:
  mesh = b.meshes[Role.ACTOR]
  kl_in_loss = b.ppo.kl_penalty == "loss"
  example = abstract.train_example(
    mesh, b.rows.train, b.prompt, b.completion, kl_in_loss=kl_in_loss
  )
  loss_fn = loss_fns.configured_loss(registry.POLICY_LOSSES, b.ppo.policy_loss_fn)
  static: dict[str, Any] = dict(algo_config=b.ppo, pad_id=0, eos_id=1)
  if not loss_fns.tunix_own(registry.POLICY_LOSSES, b.ppo.policy_loss_fn):  # as the learner
    static["temperature"] = b.ppo.logps_temperature or 1.0
  inputs = {"train_example": example}
  return [
    abstract.compile_train_step(
      b.actor, b.actor_opt, loss_fn, inputs, static, mesh, role="actor", wrt=b.actor_wrt
    )
  ]


def _critic_train_step(b: _Built) -> list[abstract.CompiledPiece]:
  mesh = b.meshes[Role.CRITIC]
  example = abstract.train_example(mesh, b.rows.train, b.prompt, b.completion, kl_in_loss=False)
  loss_fn = loss_fns.configured_loss(registry.VALUE_LOSSES, b.ppo.value_loss_fn)
  static: dict[str, Any] = dict(clip_range_value=b.ppo.clip_range_value, pad_id=0, eos_id=1)
  if not loss_fns.tunix_own(registry.VALUE_LOSSES, b.ppo.value_loss_fn):  # as the learner
    static["loss_agg_mode"] = b.ppo.value_loss_agg_mode
  inputs = {"train_example": example}
  return [
    abstract.compile_train_step(
      b.critic, b.critic_opt, loss_fn, inputs, static, mesh, role="critic", wrt=b.critic_wrt
    )
  ]


def _logps(role: Role, name: str):
  def compile_pass(b: _Built) -> list[abstract.CompiledPiece]:
    return [
      abstract.compile_logps_pass(
        b.actor if role == Role.ACTOR else b.reference,
        b.meshes[role],
        b.rows.logps,
        b.prompt,
        b.completion,
        role=name,
        temperature=b.ppo.logps_temperature or 1.0,
        chunk_size=b.ppo.logits_chunk_size,
        fused_head=b.ppo.fused_head,
      )
    ]

  return compile_pass


def _values(b: _Built) -> list[abstract.CompiledPiece]:
  mesh = b.meshes[Role.CRITIC]
  return [abstract.compile_values_pass(b.critic, mesh, b.rows.logps, b.prompt, b.completion)]


def _sampler(b: _Built) -> list[abstract.CompiledPiece]:
  """The multi-turn rollout's `ContinuingSampler` programs for the run's sizes: KV cache of
  `max_prompt_length + max_completion_len + max_tokens_per_turn` slots (the cluster's
  `kv_cache_size`); the first turn's prefill of `max_prompt_length` (with `env.kv_cache:
  reencode`, every turn's of `max_prompt_length + max_completion_len`) and the turn's
  decode; with `continue` and `env.max_turns > 1` also `extend` and `compact`."""
  env = b.run.env
  cache = b.cluster.max_prompt_length + b.cluster.max_tokens_to_generate  # the cluster's own
  continued = env.kv_cache == "continue"
  multi_turn = continued and env.max_turns > 1
  return abstract.compile_continuing_sampler(
    b.actor,
    _tokenizer(b.run),
    b.meshes[Role.ROLLOUT],
    b.rows.rollout,
    prefill_width=b.prompt if continued else b.prompt + b.completion,
    cache_size=cache,
    max_tokens=env.max_tokens_per_turn,
    extend_width=extend_width(b.prompt, b.completion, env.max_tokens_per_turn)
    if multi_turn
    else None,
  )


def extend_width(prompt: int, completion: int, turn: int) -> int:
  """The widest block a continued turn prefills: the bucket of the completion budget (what
  a context can gain after its prompt, observations included; `math.buckets.bucket`), or the
  largest bucket under it that fits the `prompt + completion + turn` cache after one kept
  slot with the turn's tokens (`Conversation._fits`)."""
  width = bucket(completion)
  while width > 1 and 1 + width + turn > prompt + completion + turn:
    width = bucket_below(width)
  return width


PIECES = {
  "rollout/sampler": _sampler,
  "actor/logps_pass": _logps(Role.ACTOR, "actor"),
  "reference/logps_pass": _logps(Role.REFERENCE, "reference"),
  "critic/values_pass": _values,
  "actor/train_step": _actor_train_step,
  "critic/train_step": _critic_train_step,
}


def format_plan(p: Plan, config_path: str | None) -> str:
  """The report: per piece the compiler's figures (MiB per device), the resident state, the
  peak against the chip's HBM with a verdict, and the biggest consumers.

  Args:
    p: what `plan` returned.
    config_path: the config file's path, named in the report's header (None: the default).

  Returns:
    The report as text.
  """
  where = "TPU compiler" if p.compiler == "tpu" else CPU_CAVEAT
  mesh = " x ".join(f"{k}={v}" for k, v in p.mesh.items())
  lines = [
    f"plan: {config_path or 'the embedded default'} on {p.topology} ({where}), mesh {mesh}",
    f"model: {p.model_source}; {p.parameters:,} parameters per model",
    _rows_line(p.rows),
    "per device, MiB:",
    f"  {'piece':<24}{'arguments':>10}{'resident':>10}{'outputs':>10}{'donated':>10}"
    f"{'temps':>10}{'peak+':>10}{'compile s':>10}",
  ]
  for piece in p.pieces:
    figures = (
      piece.argument_bytes,
      piece.resident_bytes,
      piece.output_bytes,
      piece.alias_bytes,
      piece.temp_bytes,
      piece.peak_extra_bytes,
    )
    cells = "".join(f"{n / MIB:>10.1f}" for n in figures)
    refused = "  refused: temps from the compiler's refusal, outputs not counted" * piece.refused
    lines.append(f"  {piece.role + '/' + piece.name:<24}{cells}{piece.compile_s:>10.1f}{refused}")
  parts = ", ".join(f"{k} {_size(v)}" for k, v in p.resident.items())
  lines.append(f"resident all step: {_size(sum(p.resident.values()))} ({parts})")
  lines.append(_verdict(p))
  lines.extend(p.notes)
  peak = p.peak_piece
  consumers = {**p.resident, f"{peak.role}/{peak.name} temporaries": peak.temp_bytes}
  transient = peak.argument_bytes - peak.resident_bytes
  consumers[f"{peak.role}/{peak.name} inputs (batch, sampling state)"] = transient
  top = sorted(consumers.items(), key=lambda kv: -kv[1])[:3]
  lines.append("biggest: " + ", ".join(f"{k} {_size(v)}" for k, v in top))
  return "\n".join(lines)


def _rows_line(rows: dict[str, Any]) -> str:
  """`rows: rollout R, log-prob pass L, train step T (accumulating K)` (episodes)."""
  accumulation = rows["accumulation"]
  more = f", gradients accumulated over {accumulation}" if accumulation else ""
  return (
    f"rows: rollout {rows['rollout']}, log-prob/value pass {rows['logps']}, "
    f"train step {rows['train']}{more}"
  )


def _verdict(p: Plan) -> str:
  """`peak: X = resident + piece Y, of HBM (share): verdict`."""
  peak, hbm = p.peak_bytes, p.hbm_bytes
  share = peak / hbm
  verdict = "DOES NOT FIT" if share > 1 else "fits, tight (over 90%)" if share > 0.9 else "fits"
  if p.peak_piece.refused:
    verdict += " (the TPU compiler refused the piece: its temporaries exceed the chip)"
  caveat = " (CPU compiler's temporaries)" if p.compiler == "cpu" else ""
  return (
    f"peak: {_size(peak)}{caveat} = resident + {p.peak_piece.role}/{p.peak_piece.name} "
    f"{_size(p.peak_piece.peak_extra_bytes)}, of {_size(hbm)} HBM per chip ({share:.0%}): "
    f"{verdict}"
  )


def _size(n: int) -> str:
  if n >= GIB // 10:
    return f"{n / GIB:.2f} GiB"
  return f"{n / MIB:.1f} MiB" if n >= MIB // 10 else f"{n / 2**10:.1f} KiB"
