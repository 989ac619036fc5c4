"""Weightless models and the jitted pieces of a PPO step, compiled ahead of time.

What a run would hold on each device is answered without weights and without the devices:
the models are built with `nnx.eval_shape` (shapes and dtypes only; `tunix-ppo-ext plan`
builds them as the job does, `role_models.roles_around`, LoRA adapters included), every
array becomes a `jax.ShapeDtypeStruct` carrying its `NamedSharding` on the role's mesh (a
mesh of real devices or of a TPU topology's compile-only devices), and each jitted piece of
a step is lowered and compiled on those; `compiled.memory_analysis()` then gives the
compiler's own per-device figures (arguments, outputs, donated aliases, temporaries).

The pieces are the code a run executes:
- `train_step`: the body of the train step tunix's `PeftTrainer` jits
  (`nnx.value_and_grad` of the loss with respect to `nnx.Param`, or `nnx.LoRAParam` for a
  LoRA model, `optax.global_norm`, `optimizer.update`) on the `nnx.Optimizer` the trainer
  builds (the run's optimizer, in `optax.MultiSteps` when it accumulates gradients), with
  the optimizer donated as tunix's `nnx.jit(..., donate_argnames=("optimizer",))` does;
  the loss is this package's (`losses.ppo_ext_policy_loss_fn`, `losses.ppo_ext_value_loss_fn`).
- `logps_pass`, `values_pass`: `passes.compute_per_token_logps` and `passes.compute_score`.
- `sampler_prefill`, `sampler_decode`, `sampler_extend`, `sampler_compact`: the programs
  the multi-turn rollout's `ContinuingSampler` jits (`programs()`: tunix's prefill, its
  per-turn decode loop, the prefill of a turn's new tokens into the kept KV cache, and the
  cache compaction) on an abstract sampling state with its KV cache, donated as there.

tunix's `qwen3.shard()` is a no-op whenever the host's first device is a CPU, so every
piece is traced under `compat.qwen3_activation_sharding` (tunix's own activation specs
applied on the piece's mesh), and outputs keep their rows on `fsdp`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tunix.generate import sampler as sampler_lib
from tunix.models.qwen3 import model as qwen3

from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.learner.ppo_learner import TrainExample
from tunix_ppo_ext._src.tunix.rollout.continuing_sampler import ContinuingSampler


@dataclasses.dataclass(frozen=True)
class CompiledPiece:
  """The compiler's per-device memory figures of one jitted piece, in bytes.

  `resident_bytes`: the part of `argument_bytes` that stays on the device for the whole
  step (weights, optimizer state); the rest of the arguments (batch, sampling state) is
  transient. `peak_extra_bytes` is what the piece needs on top of the resident state:
  transient arguments + temporaries + outputs not written in place of a donated input.
  """

  role: str
  name: str
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  resident_bytes: int
  compile_s: float
  # the TPU compiler refused the program: its temporaries alone exceed the chip's memory
  # (`temp_bytes` is then the compiler's figure from its refusal, and the outputs unknown)
  refused: bool = False

  @property
  def peak_extra_bytes(self) -> int:
    transient_args = self.argument_bytes - self.resident_bytes
    return transient_args + self.temp_bytes + self.output_bytes - self.alias_bytes


def tree_bytes_per_device(tree: Any) -> int:
  """Bytes one device holds of a tree of sharded `ShapeDtypeStruct`s (or arrays):
  per leaf, `prod(sharding.shard_shape(shape)) * itemsize` (the whole leaf if unsharded)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    sharding = getattr(leaf, "sharding", None)
    shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


def _spec_or_replicated(spec: Any) -> P:
  return spec if isinstance(spec, P) else P()


def _is_spec(leaf: Any) -> bool:
  return leaf is None or isinstance(leaf, P)


def shard_abstract(state: nnx.State, mesh: jax.sharding.Mesh) -> nnx.State:
  """`state` (abstract or concrete) as `ShapeDtypeStruct`s with the `NamedSharding` of each
  variable's partition-spec metadata on `mesh` (replicated where it has none)."""
  specs = nnx.get_partition_spec(state)
  shardings = jax.tree.map(
    lambda s: NamedSharding(mesh, _spec_or_replicated(s)), specs, is_leaf=_is_spec
  )
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
  )


def _on_mesh(x: Any, mesh: jax.sharding.Mesh, *, rows_on_fsdp: bool) -> jax.ShapeDtypeStruct:
  """`x`'s shape and dtype on `mesh`: rows on `fsdp`, or replicated."""
  spec = P("fsdp") if rows_on_fsdp else P()
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))


def batch_struct(
  mesh: jax.sharding.Mesh, shape: tuple[int, ...], dtype: Any
) -> jax.ShapeDtypeStruct:
  """An abstract array whose leading (batch) dimension is split on `fsdp`, as tunix's
  trainers shard each batch (`data_sharding_axis=("fsdp",)`); scalars are replicated."""
  spec = P("fsdp") if shape else P()
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def params(module: nnx.Module) -> nnx.State:
  """The module's `nnx.Param` state (abstract for an abstract module)."""
  return nnx.state(module, nnx.Param)


def optimizer_state(optimizer: nnx.Optimizer) -> nnx.State:
  """Everything an `nnx.Optimizer` holds: Adam's moments, step and counters."""
  return nnx.state(optimizer)


def abstract_optimizer(
  model: nnx.Module,
  tx: optax.GradientTransformation,
  *,
  wrt: Any = nnx.Param,
  accumulation_steps: int | None = None,
) -> nnx.Optimizer:
  """The optimizer tunix's `PeftTrainer` builds over `model` (abstract), abstract: `tx`
  wrapped in `optax.MultiSteps(tx, accumulation_steps)` when the trainer accumulates
  gradients (a micro-batch), then `nnx.Optimizer(model, tx, wrt=wrt)` (`nnx.LoRAParam`
  for a LoRA model); its state carries the parameters' sharding metadata."""
  if accumulation_steps is not None:
    tx = optax.MultiSteps(tx, accumulation_steps)
  return nnx.eval_shape(lambda model: nnx.Optimizer(model, tx, wrt=wrt), model)


_REFUSAL = re.compile(
  r"memory required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM"
)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def refused_temporaries(message: str) -> int | None:
  """The temporaries' bytes in the TPU compiler's out-of-memory refusal ("Ran out of memory
  on HBM, the total memory required for HLO temporaries (131.74G) exceeds available HBM
  (15.75G)"; XLA's sizes are binary), or None for any other error."""
  match = _REFUSAL.search(message)
  if match is None:
    return None
  return round(float(match.group(1)) * _UNITS[match.group(2)])


def _compile(lowerable, *args, role: str, name: str, resident: Any, **static: Any) -> CompiledPiece:
  """Lowers (with tunix's Qwen3 activation shardings on the mesh of the first argument, that
  mesh entered as tunix's splash attention reads it) and compiles `lowerable(*args,
  **static)`, and reads its per-device memory analysis."""
  start = time.perf_counter()
  mesh = jax.tree.leaves(args[0])[0].sharding.mesh
  with compat.qwen3_activation_sharding(mesh), mesh:
    lowered = lowerable.lower(*args, **static)
  try:
    stats = lowered.compile().memory_analysis()
    figures: dict[str, Any] = {
      "argument_bytes": int(stats.argument_size_in_bytes),
      "output_bytes": int(stats.output_size_in_bytes),
      "alias_bytes": int(stats.alias_size_in_bytes),
      "temp_bytes": int(stats.temp_size_in_bytes),
      "code_bytes": int(getattr(stats, "generated_code_size_in_bytes", 0) or 0),
    }
  except jax.errors.JaxRuntimeError as err:
    temps = refused_temporaries(str(err))
    if temps is None:
      raise
    figures = {
      "argument_bytes": tree_bytes_per_device(args),
      "output_bytes": 0,
      "alias_bytes": 0,
      "temp_bytes": temps,
      "code_bytes": 0,
      "refused": True,
    }
  return CompiledPiece(
    role=role,
    name=name,
    resident_bytes=tree_bytes_per_device(resident),
    compile_s=round(time.perf_counter() - start, 1),
    **figures,
  )


def compile_train_step(
  model: nnx.Module,
  optimizer: nnx.Optimizer,
  loss_fn: Callable[..., Any],
  inputs: dict[str, Any],
  static_inputs: dict[str, Any],
  mesh: jax.sharding.Mesh,
  *,
  role: str,
  wrt: Any = nnx.Param,
) -> CompiledPiece:
  """Compiles one train step of `model` (tunix's PeftTrainer step body) on abstract inputs.

  `inputs`: the loss's array arguments (sharded `ShapeDtypeStruct`s); `static_inputs`: the
  rest (config objects, ids); `wrt`: what is differentiated and updated (`nnx.LoRAParam`
  for a LoRA model, as tunix's `nnx.DiffState(0, nnx.LoRAParam)`). Model and optimizer
  state are sharded by their metadata; the optimizer state is donated (as tunix's trainer
  does), the weights are not.
  """
  model_def, model_state = nnx.split(model)
  opt_def, opt_state = nnx.split(optimizer)
  model_state, opt_state = shard_abstract(model_state, mesh), shard_abstract(opt_state, mesh)

  @functools.wraps(loss_fn)  # its signature: nnx maps the keyword inputs by it
  def differentiated(model, *args, **kwargs):
    return compat.loss_and_aux(loss_fn(model, *args, **kwargs))

  def step(model_state, opt_state, inputs):
    model, opt = nnx.merge(model_def, model_state), nnx.merge(opt_def, opt_state)
    grad_fn = nnx.value_and_grad(differentiated, argnums=nnx.DiffState(0, wrt), has_aux=True)
    (loss, aux), grads = grad_fn(model, **inputs, **static_inputs)
    grad_norm = optax.global_norm(grads)
    opt.update(model, grads)
    return nnx.state(model), nnx.state(opt), loss, aux, grad_norm

  jitted = jax.jit(step, donate_argnums=(1,), keep_unused=True)  # every input counted
  return _compile(
    jitted,
    model_state,
    opt_state,
    inputs,
    role=role,
    name="train_step",
    resident=(model_state, opt_state),
  )


def _compile_sequence_pass(
  pass_fn: Callable[..., Any],
  model: nnx.Module,
  mesh: jax.sharding.Mesh,
  shape: tuple[int, int, int],
  *,
  role: str,
  name: str,
  **pass_kw: Any,
) -> CompiledPiece:
  """Compiles one model pass of `passes` (`pass_fn(model, prompt, completion, pad_id=,
  eos_id=, attention_mask=, **pass_kw)`, no gradient) for a `(batch, prompt_len,
  completion_len)` `shape`, the model's state sharded on `mesh` and resident, every output
  with its rows on `fsdp`."""
  graphdef, state = nnx.split(model)
  state = shard_abstract(state, mesh)

  def run(state, prompt, completion, attention_mask):
    out = pass_fn(
      nnx.merge(graphdef, state),
      prompt,
      completion,
      pad_id=0,
      eos_id=1,
      attention_mask=attention_mask,
      **pass_kw,
    )
    return jax.tree.map(lambda x: _rows_on_fsdp(x, mesh), out)

  args = _sequence_args(mesh, *shape)
  return _compile(jax.jit(run), state, *args, role=role, name=name, resident=state)


def compile_logps_pass(
  model: nnx.Module,
  mesh: jax.sharding.Mesh,
  batch: int,
  prompt_len: int,
  completion_len: int,
  *,
  role: str,
  temperature: float = 1.0,
  chunk_size: int = 0,
  fused_head: bool = False,
) -> CompiledPiece:
  """Compiles `passes.compute_per_token_logps` (log-probs and entropy, no gradient) for a
  `[batch, prompt_len]` prompt and `[batch, completion_len]` completion (with `fused_head`,
  through the fused LM head)."""
  return _compile_sequence_pass(
    passes.compute_per_token_logps,
    model,
    mesh,
    (batch, prompt_len, completion_len),
    role=role,
    name="logps_pass",
    return_entropy=True,
    temperature=temperature,
    chunk_size=chunk_size,
    fused_head=fused_head,
  )


def compile_values_pass(
  critic: nnx.Module, mesh: jax.sharding.Mesh, batch: int, prompt_len: int, completion_len: int
) -> CompiledPiece:
  """Compiles `passes.compute_score` (the critic's values, no gradient)."""
  shape = (batch, prompt_len, completion_len)
  return _compile_sequence_pass(
    passes.compute_score, critic, mesh, shape, role="critic", name="values_pass"
  )


def _rows_on_fsdp(x: jax.Array, mesh: jax.sharding.Mesh) -> jax.Array:
  """`x` constrained to rows on `fsdp` (tunix's `shard()` does nothing on a CPU host)."""
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("fsdp")))


def _sequence_args(mesh, batch: int, prompt_len: int, completion_len: int) -> list[Any]:
  """`(prompt [B, P] int32, completion [B, T] int32, attention mask [B, T] int32)`."""
  return [
    batch_struct(mesh, (batch, prompt_len), jnp.int32),
    batch_struct(mesh, (batch, completion_len), jnp.int32),
    batch_struct(mesh, (batch, completion_len), jnp.int32),
  ]


def train_example(
  mesh: jax.sharding.Mesh, batch: int, prompt_len: int, completion_len: int, *, kl_in_loss: bool
) -> TrainExample:
  """An abstract `learner.TrainExample` (the learner's, field for field) with sharded rows."""

  def tokens(shape, dtype):
    return batch_struct(mesh, shape, dtype)

  return TrainExample(
    prompt_ids=tokens((batch, prompt_len), jnp.int32),
    prompt_mask=tokens((batch, prompt_len), jnp.int32),
    completion_ids=tokens((batch, completion_len), jnp.int32),
    completion_mask=tokens((batch, completion_len), jnp.float32),
    ref_per_token_logps=tokens((batch, completion_len), jnp.float32) if kl_in_loss else None,
    advantages=tokens((batch, completion_len), jnp.float32),
    returns=tokens((batch, completion_len), jnp.float32),
    old_per_token_logps=tokens((batch, completion_len), jnp.float32),
    old_values=tokens((batch, completion_len), jnp.float32),
    attention_mask=tokens((batch, completion_len), jnp.int32),
    loss_mask=tokens((batch, completion_len), jnp.float32),
    kl_coef=tokens((batch,), jnp.float32),
    actor_scale=tokens((batch,), jnp.float32),
  )


def sampling_state(
  sampler: ContinuingSampler,
  mesh: jax.sharding.Mesh,
  batch: int,
  width: int,
  *,
  with_logprobs: bool = True,
) -> Any:
  """The abstract sampling state a `Conversation` hands its programs: `[batch, width]`
  left-padded contexts in a `[batch, cache_size]` token buffer and KV cache (tunix's
  `init_sample_state`, top-p mode), rows on `fsdp`, the turn's counters int32 scalars and
  `num_input_tokens = width` (static: what tunix's prefill reads; 0 after it)."""
  cache_size = sampler.cache_config.cache_size
  ids = jax.ShapeDtypeStruct((batch, width), jnp.int32)
  state = jax.eval_shape(
    lambda ids: compat.fresh_state(
      sampler,
      ids,
      cache_size,
      temperature=1.0,
      top_p=1.0,
      top_k=None,
      seed=0,
      with_logprobs=with_logprobs,
    ),
    ids,
  )
  state = jax.tree.map(lambda x: _on_mesh(x, mesh, rows_on_fsdp=x.shape[:1] == (batch,)), state)
  # keys and values `[B, S, KV, H]` as the model writes them (its `act_btnh` sharding:
  # rows on fsdp, KV heads on tp), so a donated cache is updated in place
  shd = getattr(sampler.transformer.config, "shd_config", None)
  kv = NamedSharding(mesh, P(*getattr(shd, "act_btnh", ("fsdp", None, "tp", None))))

  def on_heads(x: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=kv)

  def replicated(x: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    return _on_mesh(x, mesh, rows_on_fsdp=False)

  scalar = replicated(jax.ShapeDtypeStruct((), jnp.int32))
  return compat.abstract_turn_state(state, scalar, replicated, on_heads, width)


def compile_continuing_sampler(
  policy: nnx.Module,
  tokenizer: Any,
  mesh: jax.sharding.Mesh,
  batch: int,
  *,
  prefill_width: int,
  cache_size: int,
  max_tokens: int,
  extend_width: int | None,
  with_logprobs: bool = True,
) -> list[CompiledPiece]:
  """Compiles the programs the multi-turn rollout's `ContinuingSampler` jits (its
  `programs(max_tokens)`, sampling state donated) for `batch` rows and a KV cache of
  `cache_size` slots: tunix's `prefill` of `[batch, prefill_width]` contexts and the
  turn's `decode` loop; with `extend_width` (turns continued from the cache) also `extend`
  (a `[batch, extend_width]` block of new tokens) and `compact` (`[batch, cache_size]`
  slot moves, no weights)."""
  config = sampler_lib.CacheConfig(
    cache_size=cache_size,
    num_layers=policy.config.num_layers,
    num_kv_heads=policy.config.num_kv_heads,
    head_dim=policy.config.head_dim,
  )
  sampler = ContinuingSampler(policy, tokenizer, config)
  programs = sampler.programs(max_tokens, keep_unused=True)  # every input counted
  params = shard_abstract(nnx.variables(policy), mesh)
  state = sampling_state(sampler, mesh, batch, prefill_width, with_logprobs=with_logprobs)

  def piece(name: str, *args: Any, resident: Any = params, **static: Any) -> CompiledPiece:
    return _compile(
      programs[name], *args, role="rollout", name=f"sampler_{name}", resident=resident, **static
    )

  args, static = compat.prefill_arguments(params, state)
  pieces = [piece("prefill", *args, **static)]
  state = compat.after_prefill(state)
  pieces.append(piece("decode", params, state))
  if extend_width is not None:

    def rows(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
      return batch_struct(mesh, shape, dtype)

    scalar = _on_mesh(jax.ShapeDtypeStruct((), jnp.int32), mesh, rows_on_fsdp=False)
    blocks = rows((batch, extend_width), jnp.int32)
    real, hole_from = rows((batch, extend_width), jnp.bool_), rows((batch,), jnp.int32)
    pieces.append(piece("extend", params, state, blocks, real, scalar, hole_from))
    source, kept = rows((batch, cache_size), jnp.int32), rows((batch, cache_size), jnp.bool_)
    pieces.append(piece("compact", state, source, kept, resident=()))
  return pieces


_HF_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


def qwen3_config_from_hf(config: dict[str, Any]) -> tuple[qwen3.ModelConfig, Any]:
  """`(tunix ModelConfig, weight dtype)` from a Hugging Face Qwen3 `config.json` mapping.

  The weight dtype is the checkpoint's `torch_dtype` (tunix's loader keeps it; bfloat16
  when the file does not say); compute stays tunix's default float32.
  """
  dtype = _HF_DTYPES.get(str(config.get("torch_dtype", "bfloat16")), jnp.bfloat16)
  heads = int(config["num_attention_heads"])
  model_config = qwen3.ModelConfig(
    num_layers=int(config["num_hidden_layers"]),
    vocab_size=int(config["vocab_size"]),
    embed_dim=int(config["hidden_size"]),
    hidden_dim=int(config["intermediate_size"]),
    num_heads=heads,
    head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
    num_kv_heads=int(config.get("num_key_value_heads") or heads),
    rope_theta=int(config.get("rope_theta", 1_000_000)),
    norm_eps=float(config.get("rms_norm_eps", 1e-6)),
    use_tied_embedding=bool(config.get("tie_word_embeddings", False)),
  )
  return model_config, dtype


def with_weight_dtype(config: qwen3.ModelConfig, dtype: Any) -> qwen3.ModelConfig:
  """`config` whose weights are `dtype` (what a checkpoint loaded by tunix holds)."""
  return dataclasses.replace(config, param_dtype=dtype)
